"""The course's shape, counted from the notebooks' JSON: cell lengths, forward references, figures.

    python scripts/course_check.py            # a table per chapter: prose words, code cells, longest cell,
                                              # forward references, figure cells and how many keep their image
    python scripts/course_check.py --check    # exit 1 on a code cell over MAX_CELL_LINES, a core chapter that
                                              # names a later chapter outside its "Where this goes next" list,
                                              # or a figure cell without its image (tests/unit/test_course.py)

A *core* chapter is one numbered 00 to 13 without a letter (the path of a request: config, layers, attention,
model, weights, tokenizer, KV cache, sampling, paged pool, prefix cache, scheduler, engine, LLM, server). A *forward reference* is a chapter number
named in a core chapter's markdown ("chapter 16", "appendix 92", a link to `16_parallel.ipynb`) that comes
after the chapter itself; the one place a core chapter may point ahead is its closing section, headed
`## Where this goes next`. A *figure cell* is a code cell that draws with matplotlib (`plt.`, `.plot(` or `plot_runs(`
in its source); its committed output must hold the PNG, so a reader sees the figure before running anything
(`make figures` refreshes them).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
MAX_CELL_LINES = 60
LAST_CORE_CHAPTER = 13
WHERE_NEXT = "## Where this goes next"
Chapter = tuple[int, str]  # "07a" -> (7, "a"): ordered as the chapters are read

_NUM = r"\d\d[a-z]?"
_SEP = r"(?:\s*,\s*|\s+and\s+|\s+or\s+|\s*[–—-]\s*|\s+to\s+)"
NAMED = re.compile(rf"(?i)\b(?:chapters?|appendix|appendices)\s+({_NUM}(?:{_SEP}{_NUM})*)\b")
LINKED = re.compile(rf"\b({_NUM})_[a-z0-9_]+\.(?:ipynb|html)")
FIGURE = re.compile(r"\bplt\.|\.plot\(|\bplot_runs\(")  # plot_runs: chapter 14's latency and throughput plots


def chapter_of(label: str) -> Chapter | None:
    m = re.fullmatch(r"(\d+)([a-z]?)", label)
    return (int(m.group(1)), m.group(2)) if m else None


def notebooks(root: Path = ROOT) -> list[Path]:
    return sorted((root / "nbs").glob("*.ipynb"))


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def referenced(text: str) -> set[Chapter]:
    "Every chapter a piece of markdown names or links to."
    found = set()
    for m in NAMED.finditer(text): found |= {chapter_of(n) for n in re.findall(_NUM, m.group(1))}
    found |= {chapter_of(n) for n in LINKED.findall(text)}
    return {c for c in found if c is not None}


def forward_references(nb: dict, chapter: Chapter) -> list[str]:
    "Each later chapter a core chapter's markdown names before its closing 'Where this goes next' section."
    refs = []
    for cell in nb["cells"]:
        text = source(cell)
        if cell["cell_type"] != "markdown": continue
        if text.startswith(WHERE_NEXT): break
        refs += [f"{n:02d}{letter}" for n, letter in sorted(referenced(text)) if (n, letter) > chapter]
    return refs


def is_figure(cell: dict) -> bool:
    return cell["cell_type"] == "code" and bool(FIGURE.search(source(cell))) and not source(cell).startswith("#| export")


def has_image(cell: dict) -> bool:
    return any("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


class ChapterShape(NamedTuple):
    name: str
    prose_words: int
    code_cells: int
    longest_cell: int
    long_cells: list[int]      # indices of code cells over MAX_CELL_LINES
    forward_refs: list[str]    # later chapters named (core chapters only)
    figures: int
    figures_shown: int         # figure cells whose committed output holds the image
    missing_figures: list[int]


def shape(path: Path) -> ChapterShape:
    nb = json.loads(path.read_text(encoding="utf-8"))
    chapter = chapter_of(path.stem.split("_")[0])
    code = [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]
    lengths = {i: len(source(c).splitlines()) for i, c in code}
    figures = [(i, c) for i, c in code if is_figure(c)]
    core = chapter is not None and chapter[0] <= LAST_CORE_CHAPTER and not chapter[1]
    return ChapterShape(
        path.stem, sum(len(source(c).split()) for c in nb["cells"] if c["cell_type"] == "markdown"), len(code),
        max(lengths.values(), default=0), [i for i, n in lengths.items() if n > MAX_CELL_LINES],
        forward_references(nb, chapter) if core else [], len(figures), sum(has_image(c) for _, c in figures),
        [i for i, c in figures if not has_image(c)])


def table(shapes: list[ChapterShape]) -> str:
    rows = ["| chapter | prose words | code cells | longest cell | cells > 60 | forward refs | figures (with image) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    rows += [f"| {s.name} | {s.prose_words:,} | {s.code_cells} | {s.longest_cell} | {len(s.long_cells)} | "
             f"{len(s.forward_refs)} | {s.figures} ({s.figures_shown}) |" for s in shapes]
    return "\n".join(rows)


def problems(shapes: list[ChapterShape]) -> list[str]:
    out = []
    for s in shapes:
        out += [f"{s.name}: code cell {i} is over {MAX_CELL_LINES} lines" for i in s.long_cells]
        if s.forward_refs: out.append(f"{s.name}: names later chapters {', '.join(s.forward_refs)} "
                                      f"outside its '{WHERE_NEXT}' section")
        out += [f"{s.name}: figure cell {i} has no committed image (make figures)" for i in s.missing_figures]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where the course's shape is broken")
    args = parser.parse_args()
    shapes = [shape(p) for p in notebooks()]
    if not args.check:
        print(table(shapes))
        return 0
    found = problems(shapes)
    print("\n".join(found) or "the course's shape holds")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
