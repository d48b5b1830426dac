"""Every notebook's Colab install cell is the one scripts/colab_cell.py writes from pyproject.toml's repository URL."""
import json

from _scripts import load_script

colab = load_script("colab_cell")


def test_every_chapter_installs_from_the_repository_named_in_pyproject():
    want = colab.cell_source(colab.repository_url())
    assert colab.repository_url() in want and "make wheel" in want
    notebooks = colab.notebooks()
    assert len(notebooks) > 15
    for path in notebooks:
        cell = colab.install_cell(json.loads(path.read_text(encoding="utf-8")))
        assert cell is not None, f"{path.name} has no Colab install cell: run python scripts/colab_cell.py"
        assert "".join(cell["source"]) == want, f"{path.name}'s install cell is stale: run python scripts/colab_cell.py"


def test_a_stale_cell_is_found(tmp_path, monkeypatch):
    "The check fails on a notebook whose cell names another repository."
    nb = {"cells": [{"cell_type": "code", "id": "x", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": colab.cell_source("https://example.invalid/other").splitlines(keepends=True)}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "nbs").mkdir()
    (tmp_path / "nbs" / "00_x.ipynb").write_text(json.dumps(nb))
    (tmp_path / "pyproject.toml").write_text('[project.urls]\nRepository = "https://example.invalid/helios"\n')
    monkeypatch.setattr(colab, "ROOT", tmp_path)
    monkeypatch.setattr("sys.argv", ["colab_cell.py", "--check"])
    assert colab.main() == 1
    monkeypatch.setattr("sys.argv", ["colab_cell.py"])
    assert colab.main() == 0 and json.loads((tmp_path / "nbs" / "00_x.ipynb").read_text())["cells"][0]["source"][-1].endswith('"git+https://example.invalid/helios"], check=True)')
