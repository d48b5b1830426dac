"""scripts/glossary_links.py links each glossary term at its first use in the course, once."""
import json

from _scripts import ROOT, load_script

glossary_links = load_script("glossary_links")
NBS = ROOT / "nbs"


def md(text): return {"cell_type": "markdown", "id": "a", "metadata": {}, "source": text.splitlines(keepends=True)}
def code(text): return {"cell_type": "code", "id": "b", "metadata": {}, "source": text, "outputs": [], "execution_count": None}
def text(nb): return ["".join(c["source"]) for c in nb["cells"]]


def fake_course():
    first = {"cells": [
        md("# The KV cache\n\n## Why a KV cache"),                          # a heading is no use
        code("# the KV cache of a prefill\ncache = KVCache()"),              # nor is code
        md("The `KV cache` and [our KV cache](06_kv_cache.ipynb) and <a href=\"x.html\">KV cache</a> are no uses.\n"
           "```\nKV cache in a fence\n```\nA KV cache keeps keys; the KV cache is reused at prefill."),
    ]}
    second = {"cells": [md("Every KV cache and every prefill here are later uses.")]}
    return [("00_a.ipynb", first), ("01_b.ipynb", second)]


def test_links_the_first_use_in_prose_only():
    course = fake_course()
    added = glossary_links.link_terms(course, [glossary_links.term("kv-cache", r"KV[ -]cache"),
                                               glossary_links.term("prefill", r"prefill")])
    assert added == ["00_a.ipynb: kv-cache <- 'KV cache'", "00_a.ipynb: prefill <- 'prefill'"]
    first, second = text(course[0][1]), text(course[1][1])
    assert first[0] == "# The KV cache\n\n## Why a KV cache" and first[1].startswith("# the KV cache")
    assert first[2].endswith("\nA [KV cache](glossary.ipynb#kv-cache) keeps keys; the KV cache is reused at "
                             "[prefill](glossary.ipynb#prefill).")
    assert "`KV cache`" in first[2] and "[our KV cache](06_kv_cache.ipynb)" in first[2] and "KV cache in a fence" in first[2]
    assert second == ["Every KV cache and every prefill here are later uses."]


def test_a_second_run_changes_nothing():
    course = fake_course()
    terms = [glossary_links.term("kv-cache", r"KV[ -]cache")]
    glossary_links.link_terms(course, terms)
    once = json.dumps(course)
    assert glossary_links.link_terms(course, terms) == [] and json.dumps(course) == once


def test_an_earlier_link_counts_and_longer_phrases_go_first():
    course = [("00_a.ipynb", {"cells": [md("A [chunked prefill](glossary.ipynb#chunked-prefill) splits a prefill.")]})]
    added = glossary_links.link_terms(course, [glossary_links.term("chunked-prefill", "chunked prefill"),
                                               glossary_links.term("prefill", "prefill")])
    assert added == ["00_a.ipynb: prefill <- 'prefill'"]
    assert text(course[0][1]) == ["A [chunked prefill](glossary.ipynb#chunked-prefill) splits a [prefill](glossary.ipynb#prefill)."]


def test_acronyms_match_their_case_and_whole_words():
    course = [("00_a.ipynb", {"cells": [md("Classes assess ttft; then SSE streams.")]})]
    glossary_links.link_terms(course, [glossary_links.term("sse", "SSE", case_sensitive=True)])
    assert text(course[0][1]) == ["Classes assess ttft; then [SSE](glossary.ipynb#sse) streams."]


def test_every_term_has_an_entry_and_every_entry_a_term():
    anchors = glossary_links.glossary_anchors(NBS)
    assert len(anchors) == len(set(anchors))
    assert set(anchors) == {t.anchor for t in glossary_links.TERMS}


def test_every_glossary_term_appears_in_the_course():
    cells = ["".join(c["source"]) for p in glossary_links.chapters(NBS)
             for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "markdown"]
    used = {t.anchor for t in glossary_links.TERMS if any(glossary_links.first_use(text, t) for text in cells)}
    assert {t.anchor for t in glossary_links.TERMS} - used == set(), "glossary terms the course never uses"


def test_the_glossary_page_has_only_markdown_and_is_in_the_docs():
    nb = json.loads((NBS / "glossary.ipynb").read_text())
    assert {c["cell_type"] for c in nb["cells"]} == {"markdown"}
    build_docs = load_script("build_docs")
    assert (NBS / "glossary.ipynb") in build_docs.site_notebooks()


def test_the_course_links_every_first_use():
    "scripts/glossary_links.py nbs --check: each term's first use in the chapters links to its entry."
    assert glossary_links.main([str(NBS), "--check"]) == 0, "run: python scripts/glossary_links.py nbs"
