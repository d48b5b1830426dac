"""The series reads as a course: short cells, core chapters that name no later chapter before their closing
list, and every figure's image committed (scripts/course_check.py counts them from the notebooks' JSON)."""
import json

from _scripts import load_script

course = load_script("course_check")


def shapes():
    return [course.shape(p) for p in course.notebooks()]


def test_no_code_cell_is_over_60_lines():
    long = {s.name: s.long_cells for s in shapes() if s.long_cells}
    assert not long, f"code cells over {course.MAX_CELL_LINES} lines (chapter: cell indices): {long}"


def test_core_chapters_name_later_chapters_only_in_their_closing_list():
    found = {s.name: s.forward_refs for s in shapes() if s.forward_refs}
    assert not found, f"forward references outside '{course.WHERE_NEXT}': {found}"


def test_every_figure_cell_keeps_its_image():
    missing = {s.name: s.missing_figures for s in shapes() if s.missing_figures}
    assert not missing, f"figure cells without a committed image (run make figures): {missing}"
    assert sum(s.figures_shown for s in shapes()) >= 25  # the series draws its ideas


def _notebook(tmp_path, name, cells):
    nbs = tmp_path / "nbs"
    nbs.mkdir(exist_ok=True)
    nb = {"cells": [{"cell_type": kind, "id": f"c{i}", "metadata": {}, "source": text,
                     **({"outputs": outs, "execution_count": None} if kind == "code" else {})}
                    for i, (kind, text, outs) in enumerate(cells)],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (nbs / name).write_text(json.dumps(nb))
    return nbs / name


def test_the_checks_find_each_kind_of_break(tmp_path):
    png = [{"output_type": "display_data", "metadata": {}, "data": {"image/png": "iVBOR", "text/plain": "<Figure>"}}]
    path = _notebook(tmp_path, "08_pool.ipynb", [
        ("markdown", "# Pages\n\nChapter 06 built the cache; chapter 10 will schedule it (as appendix 92 does).", []),
        ("code", "\n".join(f"x{i} = {i}" for i in range(61)), []),
        ("code", "import matplotlib.pyplot as plt\nplt.plot([1, 2])", []),
        ("code", "plt.plot([2, 3])", png),
        ("markdown", "## Where this goes next\n\n- chapter 16 splits the pool across ranks", [])])
    s = course.shape(path)
    assert s.long_cells == [1] and s.forward_refs == ["10", "92"] and s.figures == 2 and s.missing_figures == [2]
    assert len(course.problems([s])) == 3  # one line for the long cell, the references, the missing image
    lettered = course.shape(_notebook(tmp_path, "08a_extra.ipynb", [("markdown", "# X\n\nSee chapter 16.", [])]))
    assert lettered.forward_refs == []  # a lettered chapter is a capability chapter, not on the core path
    assert course.referenced("chapters 03a and 16, [the server](13_server.ipynb)") == {(3, "a"), (16, ""), (13, "")}


def test_the_minimal_path_names_sections_that_exist():
    "The index's 'A minimal path' table names, per step, headings that its chapter has."
    import re
    index = json.loads((course.ROOT / "nbs" / "index.ipynb").read_text(encoding="utf-8"))
    text = next(course.source(c) for c in index["cells"] if course.source(c).startswith("## A minimal path"))
    steps = re.findall(r"^\| \d+ \| \[(\w+)\]\(\w+\.ipynb\) \| ([^|]+) \|", text, re.M)
    assert len(steps) >= 10
    for chapter, sections in steps:
        nb = json.loads((course.ROOT / "nbs" / f"{chapter}.ipynb").read_text(encoding="utf-8"))
        headings = [line.lstrip("#").strip().replace("`", "") for c in nb["cells"] if c["cell_type"] == "markdown"
                    for line in course.source(c).splitlines() if line.startswith("#")]
        for name in sections.split(";"):
            name = re.sub(r"\(.*\)", "", name).strip().replace("`", "")
            assert any(h.startswith(name) for h in headings), f"{chapter} has no section '{name}'"
