"""The chapters run as on Colab: each notebook alone in an empty folder, installing Helios from a wheel beside it into
an environment with only Colab's preinstalled packages (scripts/colab_emulate.py; minutes: it builds that environment
and runs every chapter, two at a time after the first)."""
import subprocess
import sys

import pytest
from _scripts import ROOT


@pytest.mark.slow
def test_every_chapter_runs_from_its_first_cell_alone():
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "colab_emulate.py"), "--jobs", "2"],  # two cores
                         capture_output=True, text=True)
    print(run.stdout)  # each chapter's time, and the total (pytest -s shows them)
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED ")]
    assert run.returncode == 0, (failed[0] if failed else f"exit {run.returncode}") + "\n" + run.stderr[-4000:]
