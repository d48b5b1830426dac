"""Run the chapters that draw figures and keep each figure's image in the notebook, so a reader sees it unrun.

    python scripts/figures.py                    # every chapter with a figure cell (what `make figures` runs)
    python scripts/figures.py nbs/02_attention.ipynb nbs/14_benchmark.ipynb   # only these

A figure cell is what scripts/course_check.py calls one: a code cell that draws with matplotlib and runs when the
docs are built. Each chapter runs in a fresh process exactly as `make docs` runs it (scripts/build_docs.py: in
nbs/, the cells nbdev-test skips skipped); then every figure cell's outputs become its PNG images (and their
one-line text form), and every other cell's outputs are left as they were. GitHub, nbviewer and a Colab that has
not run yet show the committed image. tests/unit/test_course.py fails while a figure cell has none.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


course, docs = _script("course_check"), _script("build_docs")


def figure_cells(nb: dict, flags: set[str]) -> list[int]:
    "Indices of the cells that draw a figure when the chapter runs (a cell the docs build skips draws nothing)."
    return [i for i, c in enumerate(nb["cells"])
            if course.is_figure(c) and docs.skip_reason(course.source(c), flags) is None]


def image_outputs(outputs: list[dict]) -> list[dict]:
    "The outputs that hold a PNG, as nbformat display_data with only the image and its text form."
    kept = []
    for o in outputs:
        data = o.get("data", {})
        if "image/png" not in data: continue
        png = data["image/png"]
        kept.append({"output_type": "display_data", "metadata": {},
                     "data": {"image/png": "".join(png) if isinstance(png, list) else png,
                              "text/plain": data.get("text/plain", ["<Figure>"])}})
    return kept


def refresh(path: Path, work: Path, flags: set[str]) -> tuple[int, int, float]:
    "Run one chapter and store its figures: (figure cells, cells that got an image, seconds)."
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = figure_cells(nb, flags)
    if not cells: return 0, 0, 0.0
    outputs, seconds, error, _ = docs.run_notebook(path, work, cache=None)
    if error: raise SystemExit(error)
    shown = 0
    for i in cells:
        images = image_outputs(outputs[i]) if i < len(outputs) else []
        nb["cells"][i]["outputs"] = images
        shown += bool(images)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return len(cells), shown, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="chapters to refresh (default: every one)")
    args = parser.parse_args()
    paths = [p.resolve() for p in args.notebooks] or course.notebooks()
    flags, missing, start = docs.tst_flags(), [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            total, shown, seconds = refresh(path, Path(tmp), flags)
            if total: print(f"{path.name}: {shown} of {total} figures ({seconds:.0f} s)", flush=True)
            if shown < total: missing.append(path.name)
    print(f"done in {time.perf_counter() - start:.0f} s" + (f"; no image from a figure cell of {', '.join(missing)}" if missing else ""))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
