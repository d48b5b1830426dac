"""The package's imports follow the chapters: a module imports only modules written by its own or an earlier
chapter (at import time or inside a function), a chapter's cells use only those modules, and nothing imports in
a cycle. A module's chapter is read from the header nbdev writes ("File to edit: ../nbs/08_paged_pool.ipynb"); a lettered
chapter (11a_structured_output) comes after its number and before the next one."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE, NBS = ROOT / "helios", ROOT / "nbs"
HEADER = re.compile(r"File to edit: (?:\.\./)+nbs/(\d+[a-z]?)_\w+\.ipynb")
Chapter = tuple[int, str]  # 07a -> (7, "a"): ordered as the chapters are read


def chapter_of(label: str) -> Chapter:
    number, letter = re.fullmatch(r"(\d+)([a-z]?)", label).groups()
    return int(number), letter


def shown(chapter: Chapter) -> str: return f"{chapter[0]:02d}{chapter[1]}"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def chapters() -> dict[str, Chapter]:
    "Every generated module of the package, with the number of the chapter that writes it."
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        m = HEADER.search(path.read_text(encoding="utf-8")[:2000])
        if m: found[module_name(path)] = chapter_of(m.group(1))
    return found


def imported_modules(tree: ast.AST, module: str, is_package: bool = False) -> set[str]:
    "Absolute names of every module an AST imports, anywhere in it (functions and TYPE_CHECKING blocks too)."
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import): names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, up node.level - 1 more
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names.add(target)
            names |= {f"{target}.{a.name}" for a in node.names}  # `from helios.kv import pages` imports a module
    return names


def owner(name: str, known: dict[str, Chapter]) -> str | None:
    "The generated module that an imported name lives in (helios.kv.pages.PagePool -> helios.kv.pages)."
    while name:
        if name in known: return name
        name = name.rpartition(".")[0]
    return None


def module_imports(known: dict[str, Chapter]) -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name not in known: continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found = {owner(n, known) for n in imported_modules(tree, name, path.name == "__init__.py")}
        graph[name] = {m for m in found if m and m != name}
    return graph


def test_every_module_has_a_chapter():
    known = chapters()
    assert {"helios.config", "helios.registry", "helios.engine", "helios.kv.pages", "helios.attention.base"} <= set(known)
    hand_written = [module_name(p) for p in PACKAGE.rglob("*.py")
                    if module_name(p) not in known and p.name != "__init__.py" and p.name != "_modidx.py"]
    assert hand_written == [], f"modules not written by a chapter: {hand_written}"


def test_no_module_imports_a_later_chapter():
    known = chapters()
    backwards = [f"{m} (chapter {shown(known[m])}) imports {t} (chapter {shown(known[t])})"
                 for m, targets in module_imports(known).items() for t in sorted(targets) if known[t] > known[m]]
    assert backwards == []


def test_no_import_cycles():
    graph = module_imports(chapters())
    cycles, state = [], {}

    def visit(node: str, path: list[str]):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open": cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state: visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state: visit(node, [node])
    assert cycles == []


def notebook_chapter(path: Path) -> Chapter | None:
    m = re.match(r"(\d+[a-z]?)_", path.name)
    return chapter_of(m.group(1)) if m else None


@pytest.mark.parametrize("notebook", sorted(NBS.glob("[0-9]*_*.ipynb")), ids=lambda p: p.stem)
def test_no_chapter_uses_a_later_chapter(notebook: Path):
    known, chapter = chapters(), notebook_chapter(notebook)
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    used = set()
    for cell in cells:
        if cell["cell_type"] != "code": continue
        source = "\n".join(line for line in "".join(cell["source"]).splitlines() if not line.lstrip().startswith(("%", "!")))
        try: tree = ast.parse(source)
        except SyntaxError: continue
        used |= {owner(n, known) for n in imported_modules(tree, "helios")}
    later = sorted(f"{m} (chapter {shown(known[m])})" for m in used if m and known[m] > chapter)
    assert later == [], f"chapter {shown(chapter)} uses later chapters' modules"


def test_the_checks_catch_a_backwards_import():
    "The same checks, on a made-up module of chapter 03 that imports chapter 11 inside a function."
    tree = ast.parse("def f():\n    from helios.engine import Engine\n    from ..kv import pages\n")
    known = {"helios.model.qwen3": (3, ""), "helios.engine": (11, ""), "helios.kv.pages": (8, "")}
    found = {owner(n, known) for n in imported_modules(tree, "helios.model.qwen3")}
    assert found - {None} == {"helios.engine", "helios.kv.pages"}


def test_a_lettered_chapter_sits_between_its_number_and_the_next():
    assert chapter_of("07") < chapter_of("07a") < chapter_of("07b") < chapter_of("08")
    assert HEADER.search("File to edit: ../nbs/11a_structured_output.ipynb").group(1) == "11a"
