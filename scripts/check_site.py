"""Check the built docs site in a real browser: serve _site on 127.0.0.1, open pages in headless Chromium.

    python scripts/check_site.py                 # checks _site/, screenshots to _site_check/

Over HTTP, every internal link and image of every page must answer 200. In Chromium (Debian's
`chromium` and `chromium-driver`, driven by Selenium with the driver path given, so nothing is
downloaded), the landing page, a chapter with figures and the API page must show their heading, every
image must have loaded (complete, naturalWidth > 0) and the console must have no errors. Screenshots
of those pages go to _site_check/. Exit status 0 when everything passes.
"""
from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

ROOT = Path(__file__).resolve().parent.parent
BROWSER_PAGES = {"index.html": "Helios", "paged_pool.html": "The paged KV pool", "api.html": "API reference"}
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
DRIVER_NAMES = ("chromedriver",)
SCREEN_W, SCREEN_H, MAX_SHOT_H = 1280, 900, 5000


def browser_paths() -> tuple[str | None, str | None]:
    "Chromium and its driver, or None for what is missing."
    return (next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None),
            next(filter(None, map(shutil.which, DRIVER_NAMES)), None))


@dataclass
class Report:
    pages_crawled: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)      # "page -> target (status)"
    browser: dict[str, dict] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool: return not self.failures


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.pages: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a" and a.get("href"): self.pages.append(a["href"])
        for key in ("href", "src"):
            if tag in ("a", "img", "link", "script") and a.get(key): self.links.append(a[key])


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args): pass


def serve(site: Path) -> tuple[ThreadingHTTPServer, str]:
    "Serve site on a free port of 127.0.0.1 from a daemon thread."
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r: return r.status, r.read()
    except urllib.error.HTTPError as e: return e.code, b""


def crawl(base: str, report: Report):
    "Follow every internal link from the landing page; record pages and anything that does not answer 200."
    host = urlparse(base).netloc
    todo, seen, checked = [urljoin(base, "index.html")], set(), {}
    while todo:
        url = todo.pop()
        if url in seen: continue
        seen.add(url)
        status, body = fetch(url)
        if status != 200:
            report.broken.append(f"{url} ({status})")
            continue
        report.pages_crawled.append(urlparse(url).path.lstrip("/"))
        parser = _Links()
        parser.feed(body.decode("utf-8", "replace"))
        for link in parser.links:
            target = urldefrag(urljoin(url, link))[0]
            if urlparse(target).netloc != host: continue
            if target not in checked: checked[target] = fetch(target)[0]
            if checked[target] != 200: report.broken.append(f"{urlparse(url).path} -> {link} ({checked[target]})")
            elif target.endswith(".html") and target not in seen: todo.append(target)
    if report.broken: report.failures.append(f"{len(report.broken)} broken links: {report.broken[:10]}")


def open_browser(chromium: str, driver_path: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={SCREEN_W},{SCREEN_H}", "--hide-scrollbars"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)


def check_in_browser(driver, base: str, out: Path, report: Report):
    from selenium.webdriver.support.ui import WebDriverWait
    for page, heading in BROWSER_PAGES.items():
        driver.get(urljoin(base, page))
        WebDriverWait(driver, 30).until(lambda d: d.execute_script(
            "return document.readyState === 'complete' && [...document.images].every(i => i.complete)"))
        h1 = driver.execute_script("const h = document.querySelector('article h1'); return h ? h.textContent : null")
        images = driver.execute_script("return [...document.images].map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])")
        errors = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        height = min(MAX_SHOT_H, driver.execute_script("return document.documentElement.scrollHeight"))
        shot = out / page.replace(".html", ".png")
        driver.set_window_size(SCREEN_W, height)
        driver.save_screenshot(str(shot))
        driver.set_window_size(SCREEN_W, SCREEN_H)
        bad_images = [src for src, complete, width in images if not (complete and width > 0)]
        report.browser[page] = dict(title=driver.title, h1=h1, images=len(images), bad_images=bad_images,
                                    console_errors=errors, screenshot=str(shot.relative_to(ROOT) if shot.is_relative_to(ROOT) else shot))
        if h1 != heading: report.failures.append(f"{page}: heading is {h1!r}, expected {heading!r}")
        if bad_images: report.failures.append(f"{page}: images that did not load: {bad_images}")
        if errors: report.failures.append(f"{page}: console errors: {errors}")
        if page == "paged_pool.html" and not images: report.failures.append(f"{page}: the chapter shows no figures")


def check_site(site: Path, out: Path, chromium: str, driver_path: str) -> Report:
    "Crawl and open the built site; return what was found (report.ok when all passed)."
    if not (site / "index.html").exists(): raise FileNotFoundError(f"{site / 'index.html'} is missing; run `make docs` first")
    out.mkdir(parents=True, exist_ok=True)
    report = Report()
    server, base = serve(site)
    try:
        crawl(base, report)
        driver = open_browser(chromium, driver_path)
        try: check_in_browser(driver, base, out, report)
        finally: driver.quit()
    finally:
        server.shutdown()
    (out / "report.json").write_text(json.dumps(asdict(report), indent=1) + "\n")
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", type=Path, default=ROOT / "_site")
    ap.add_argument("--out", type=Path, default=ROOT / "_site_check")
    args = ap.parse_args()
    chromium, driver_path = browser_paths()
    if not (chromium and driver_path):
        sys.exit("chromium and chromedriver are needed: apt-get install -y chromium chromium-driver")
    report = check_site(args.site, args.out, chromium, driver_path)
    print(f"crawled {len(report.pages_crawled)} pages, {len(report.broken)} broken links")
    for page, r in report.browser.items():
        print(f"  {page:20s} h1={r['h1']!r} images={r['images']} console errors={len(r['console_errors'])} -> {r['screenshot']}")
    if not report.ok:
        print("FAILED:\n  " + "\n  ".join(report.failures))
        sys.exit(1)
    print("site check passed")


if __name__ == "__main__":
    main()
