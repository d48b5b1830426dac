# The test command of the README: every notebook (the chapters' inline tests), then pytest.
.PHONY: test test-nbs test-py export clean

test: test-nbs test-py

test-nbs:
	nbdev-test --n-workers 2 --timing

# pytest exits 5 when it collects nothing; that is a failure of the suite here, so it stays non-zero
test-py:
	pytest -q tests

# notebooks are the source: write helios/ from them and strip notebook metadata
export:
	nbdev-clean && nbdev-export
