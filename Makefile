# The test command of the README: every notebook (the chapters' inline tests), then pytest.
.PHONY: test test-nbs test-py test-quick soak export clean docs check-site readme wheel figures

test: test-nbs test-py

# the notebooks' engines get 512 MiB KV pools, in make test-nbs and make docs alike (the cache's digest includes it)
NB_ENV = HELIOS_KV_CACHE_BYTES=536870912

# every notebook, each in a fresh process, two at a time, skipping what nbdev-test skips (the tst_flags,
# `eval: false`) and GPU-only cells; their outputs go to .docs-cache/, which `make docs` renders while the
# notebook, helios/ and the HELIOS_* settings are unchanged (so CI runs each chapter once)
test-nbs:
	env $(NB_ENV) python scripts/build_docs.py --run-only --jobs 2 --cache .docs-cache

# pytest exits 5 when it collects nothing; that is a failure of the suite here, so it stays non-zero.
# The 30-minute soak is `make soak`'s (its 3-minute version stays in)
test-py:
	pytest -q -m "not soak" tests

# the unit tests and everything not marked slow: a quick check while working
test-quick:
	pytest -q -m "not slow and not soak" tests

# 30 minutes of mixed traffic against a real server (tests/server/test_soak.py); its figures -> benchmarks/results/soak/
soak:
	HELIOS_SOAK_REPORT_DIR=benchmarks/results/soak pytest -q -s -m soak tests/server/test_soak.py

# a wheel of the package, e.g. to upload next to a notebook on Colab (the install cell prefers it)
wheel:
	python -m pip wheel -q --no-deps -w dist .

# notebooks are the source: write helios/ from them and strip notebook metadata
export:
	nbdev-clean && nbdev-export

# the docs site from the notebooks, offline: every chapter run and rendered, plus the API reference -> _site/
docs:
	env $(NB_ENV) python scripts/build_docs.py --cache .docs-cache

# serve _site on 127.0.0.1, open it in headless Chromium, check pages, links and images; screenshots -> _site_check/
check-site:
	python scripts/check_site.py

# every figure cell's image kept in its notebook, so GitHub, nbviewer and an unrun Colab show it
# (tests/unit/test_course.py fails while one is missing)
figures:
	python scripts/figures.py && nbdev-clean

# README.md is written from nbs/index.ipynb
readme:
	python scripts/build_readme.py
