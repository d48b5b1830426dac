"""The built docs site, in headless Chromium: pages render, links resolve, images load (scripts/check_site.py).

Skipped when `_site/` (make docs) or Chromium is missing, unless HELIOS_REQUIRE_BROWSER=1 (CI), where
missing is a failure.
"""
import os

import pytest

from _scripts import ROOT, load_script

check_site = load_script("check_site")
SITE, OUT = ROOT / "_site", ROOT / "_site_check"


def require(condition: bool, reason: str):
    if condition: return
    if os.environ.get("HELIOS_REQUIRE_BROWSER") == "1": pytest.fail(reason + " (HELIOS_REQUIRE_BROWSER=1)")
    pytest.skip(reason)


def test_site_renders_in_chromium():
    require((SITE / "index.html").exists(), "the docs site is not built; run `make docs`")
    chromium, driver = check_site.browser_paths()
    require(bool(chromium and driver), "chromium and chromedriver are missing: apt-get install chromium chromium-driver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        require(False, "selenium is not installed: pip install -e '.[dev]'")
    report = check_site.check_site(SITE, OUT, chromium, driver)
    assert report.ok, "\n".join(report.failures)
    assert len(report.pages_crawled) >= 3 and set(report.browser) == set(check_site.BROWSER_PAGES)
    assert all((ROOT / r["screenshot"]).stat().st_size > 10_000 for r in report.browser.values())
