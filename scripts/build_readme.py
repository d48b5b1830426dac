"""Write README.md from nbs/index.ipynb, the landing page of the docs (`make readme`).

    python scripts/build_readme.py           # write README.md
    python scripts/build_readme.py --check   # exit 1 if README.md differs from what the notebook gives

Markdown cells are copied with their relative links re-rooted from nbs/ to the repository root;
code cells become ```python blocks without their `#|` directives; `#| hide` cells are left out; an
`#| echo: false` cell is run and the markdown its last expression shows is copied (the settings table,
made from EngineConfig's fields).
"""
from __future__ import annotations

import argparse
import ast
import json
import posixpath
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INDEX = ROOT / "nbs" / "index.ipynb"
README = ROOT / "README.md"
HEADER = "<!-- Generated from nbs/index.ipynb by `make readme`: edit the notebook, not this file. -->\n"


def reroot(markdown: str) -> str:
    "Relative link targets, written from nbs/, as seen from the repository root."
    def fix(m):
        target = m.group(1)
        if re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", target): return m.group(0)
        return f"]({posixpath.normpath(posixpath.join('nbs', target))})"
    return re.sub(r"\]\(([^)\s]+)\)", fix, markdown)


def shown_markdown(code: str) -> str:
    "Run a cell's code from the repository root; the markdown of its last expression (an IPython Markdown)."
    if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))  # this checkout's helios, not an installed one
    tree = ast.parse(code)
    last = ast.Expression(tree.body.pop().value)
    namespace: dict = {}
    exec(compile(tree, "<index cell>", "exec"), namespace)
    value = eval(compile(last, "<index cell>", "eval"), namespace)
    return value._repr_markdown_() if hasattr(value, "_repr_markdown_") else str(value)


def code_block(source: str) -> str | None:
    lines = source.splitlines()
    directives = [l for l in lines if l.startswith("#|")]
    if any(re.match(r"#\|\s*(hide|include:\s*false)", d) for d in directives): return None
    code = "\n".join(l for l in lines if not l.startswith("#|")).strip("\n")
    if any(re.match(r"#\|\s*echo:\s*false", d) for d in directives): return shown_markdown(code)
    return f"```python\n{code}\n```" if code else None


def build_readme(index: Path = INDEX) -> str:
    "The README text that index.ipynb gives."
    parts = []
    for cell in json.loads(index.read_text())["cells"]:
        source = "".join(cell["source"])
        part = reroot(source) if cell["cell_type"] == "markdown" else code_block(source) if cell["cell_type"] == "code" else None
        if part: parts.append(part.strip("\n"))
    return HEADER + "\n" + "\n\n".join(parts) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only check that README.md is up to date")
    args = ap.parse_args()
    text = build_readme()
    if args.check:
        if README.read_text() != text:
            sys.exit("README.md is out of date with nbs/index.ipynb; run `make readme`")
        print("README.md is in sync with nbs/index.ipynb")
        return
    README.write_text(text)
    print(f"wrote {README.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
