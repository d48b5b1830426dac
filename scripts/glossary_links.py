"""Link each glossary term at its first use in the course to its entry in nbs/glossary.ipynb.

    python scripts/glossary_links.py nbs           # add the missing links (a second run changes nothing)
    python scripts/glossary_links.py nbs --check   # exit 1 where a term's first use is not linked

The chapters are read in the docs' order (00, 01, 02, 03, 04, 04a, ...). A term's *first use* is its first
match in a markdown cell's prose: code cells, headings, quoted lines (a chapter's `> summary` is its module's
docstring), fenced blocks, inline code, links, HTML tags and URLs do not count. Where that first use is not already a link to the term's entry, it becomes
`[word](glossary.ipynb#anchor)`: a relative link that GitHub follows from nbs/ and that
scripts/build_docs.py rewrites to `glossary.html#anchor`. A link to the entry further on is left alone.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

GLOSSARY = "glossary.ipynb"


class Term(NamedTuple):
    anchor: str          # the entry's `<a id="...">` in glossary.ipynb
    patterns: tuple[str, ...]
    case_sensitive: bool = False  # acronyms: TTFT, not "ttft" inside a setting's name


def term(anchor: str, *patterns: str, case_sensitive: bool = False) -> Term:
    return Term(anchor, patterns, case_sensitive)


# Longer phrases first: "chunked prefill" takes its words before "prefill" looks for its first use.
TERMS = (
    term("chunked-prefill", r"chunked prefill", r"prefill chunks?"),
    term("continuous-batching", r"continuous batching"),
    term("speculative-decoding", r"speculative decoding", r"drafts?"),
    term("structured-output", r"structured output", r"grammar masks?", r"token masks?"),
    term("prefix-cache", r"prefix cach(?:e|es|ing)"),
    term("block-hash", r"block hash(?:es)?", r"chained hash(?:es)?"),
    term("page-table", r"page tables?"),
    term("paged-attention", r"paged attention", r"paged", r"KV pages?"),
    term("kv-cache", r"KV[ -]cache"),
    term("gated-delta-rule", r"gated delta rule"),
    term("linear-attention", r"linear[ -]attention"),
    term("sparse-attention", r"sparse attention"),
    term("lightning-indexer", r"lightning indexers?"),
    term("hybrid-model", r"hybrid models?"),
    term("host-tier", r"host tier"),
    term("cuda-graph", r"CUDA graphs?"),
    term("tensor-parallelism", r"tensor parallel(?:ism)?"),
    term("pipeline-parallelism", r"pipeline parallel(?:ism)?"),
    term("expert-parallelism", r"expert parallel(?:ism)?"),
    term("quantization-blocks", r"Q[2-8]_(?:0|1|K)\w*", r"quantized into blocks"),
    term("ttft", r"TTFT", case_sensitive=True),
    term("ttft", r"time to first token"),
    term("tpot", r"TPOT", case_sensitive=True),
    term("tpot", r"time per output token"),
    term("itl", r"ITL", case_sensitive=True),
    term("itl", r"inter-token latenc(?:y|ies)"),
    term("gqa", r"GQA", case_sensitive=True),
    term("gqa", r"grouped-query attention"),
    term("mla", r"MLA", case_sensitive=True),
    term("mla", r"latent attention"),
    term("moe", r"MoE", case_sensitive=True),
    term("moe", r"mixtures? of experts"),
    term("rope", r"RoPE", case_sensitive=True),
    term("yarn", r"YaRN", case_sensitive=True),
    term("rmsnorm", r"RMSNorm", case_sensitive=True),
    term("swiglu", r"SwiGLU", case_sensitive=True),
    term("sse", r"SSE", case_sensitive=True),
    term("sse", r"server-sent events?"),
    term("state-snapshot", r"state snapshots?"),
    term("gguf", r"GGUF", case_sensitive=True),
    term("safetensors", r"safetensors"),
    term("fbgemm", r"fbgemm"),
    term("onednn", r"oneDNN"),
    term("floor", r"roofline", r"(?:physical|arithmetic|memory|work|compute|decode) floor", r"\*floor\*"),
    term("detokenizer", r"detokeniz(?:er|ers|ation|ing)"),
    term("min-p", r"min-p"),
    term("top-k", r"top-k"),
    term("top-p", r"top-p"),
    term("temperature", r"temperature"),
    term("greedy", r"greedy"),
    term("preemption", r"preempt(?:ion|ions|ed|s)?"),
    term("admission", r"admission", r"admit(?:s|ted)?"),
    term("scheduler", r"scheduler"),
    term("tick", r"ticks?"),
    term("prefill", r"prefill(?:s|ed|ing)?"),
    term("decode", r"decod(?:e|es|ing)"),
    term("logits", r"logits?"),
    term("token", r"tokens?"),
)

# Text that is not prose: a match inside one of these is not a use.
PROTECTED = re.compile("|".join([
    r"^(?:```|~~~)[^\n]*\n(?:.*?\n)?(?:```|~~~)[ \t]*$",  # a fenced block
    r"^#{1,6}[ \t][^\n]*$",                               # a heading
    r"^>[^\n]*$",                                         # a quoted line: a chapter's summary becomes its module's docstring
    r"(`+)(?:.+?)\1",                                     # inline code
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\([^)\s]*(?:\s+\"[^\"]*\")?\)",  # a link or image
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\[[^\]]*\]",       # a reference link
    r"<a\b[^>]*>.*?</a>",                                 # an HTML link, its text too
    r"<[^>\n]+>",                                         # an HTML tag or autolink
    r"https?://\S+",                                      # a bare URL
]), re.M | re.S)
LINK = re.compile(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(" + re.escape(GLOSSARY) + r"#([\w-]+)\)")


def chapter_key(path: Path) -> tuple[int, str]:
    "11_engine -> (11, ''), 11a_structured_output -> (11, 'a'): the docs' reading order."
    number, letter = re.match(r"(\d+)([a-z]?)_", path.name).groups()
    return int(number), letter


def chapters(nbs: Path) -> list[Path]:
    return sorted(nbs.glob("[0-9]*_*.ipynb"), key=chapter_key)


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def as_lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def compiled(t: Term) -> re.Pattern:
    words = "|".join(t.patterns)
    return re.compile(rf"(?<![\w-])(?:{words})(?![\w-])", 0 if t.case_sensitive else re.I)


def first_use(text: str, t: Term) -> tuple[int, re.Match | None] | None:
    """The first use of t in a markdown text: (position, None) for a link to t's entry,
    (position, match) for an unlinked use in prose; None if neither occurs."""
    protected = [m.span() for m in PROTECTED.finditer(text)]
    free = (m for m in compiled(t).finditer(text)
            if not any(a < m.end() and m.start() < b for a, b in protected))
    candidates = [(m.start(), None) for m in LINK.finditer(text) if m.group(2) == t.anchor]
    candidates += [(m.start(), m) for m in [next(free, None)] if m]
    return min(candidates, key=lambda c: c[0]) if candidates else None


def link_terms(notebooks: list[tuple[str, dict]], terms=TERMS) -> list[str]:
    """Link each term's first use across the notebooks (in the order given), in place.
    Returns one line per link added: 'chapter: anchor <- word'."""
    spellings: dict[str, list[Term]] = {}
    for t in terms: spellings.setdefault(t.anchor, []).append(t)
    added = []
    for anchor, alternatives in spellings.items():
        for name, cell in ((n, c) for n, nb in notebooks for c in nb["cells"] if c["cell_type"] == "markdown"):
            text = source(cell)
            uses = [u for u in (first_use(text, t) for t in alternatives) if u]
            if not uses: continue
            _, m = min(uses, key=lambda u: u[0])
            if m is not None:  # an unlinked first use
                cell["source"] = as_lines(f"{text[:m.start()]}[{m.group(0)}]({GLOSSARY}#{anchor}){text[m.end():]}")
                added.append(f"{name}: {anchor} <- {m.group(0)!r}")
            break
    return added


def glossary_anchors(nbs: Path) -> list[str]:
    "The anchors of the glossary page's entries."
    nb = json.loads((nbs / GLOSSARY).read_text())
    return re.findall(r'<a id="([\w-]+)"></a>', "\n".join(source(c) for c in nb["cells"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nbs", type=Path, help="the notebooks' folder (nbs)")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 where a first use is not linked")
    args = ap.parse_args(argv)
    missing = sorted({t.anchor for t in TERMS} - set(glossary_anchors(args.nbs)))
    if missing: sys.exit(f"{GLOSSARY} has no entry for {', '.join(missing)}")
    paths = chapters(args.nbs)
    notebooks = [(p.name, json.loads(p.read_text())) for p in paths]
    before = [json.dumps(nb) for _, nb in notebooks]
    added = link_terms(notebooks)
    for line in added: print(("unlinked first use: " if args.check else "linked ") + line)
    if args.check: return 1 if added else 0
    for path, (_, nb), old in zip(paths, notebooks, before):
        if json.dumps(nb) != old: path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(added)} links added")
    return 0


if __name__ == "__main__":
    sys.exit(main())
