"""Run the chapters as Colab would: each notebook alone in an empty folder, a wheel of Helios beside it, in a Python
that has only what a Colab runtime brings (tests/integration/test_colab.py runs it in CI).

    python scripts/colab_emulate.py                      # every chapter that runs code
    python scripts/colab_emulate.py 04a_moe 16_parallel  # some of them (names or nbs/ paths)

1. `pip wheel --no-deps` builds Helios's wheel, from a copy of the checkout without its build leftovers.
2. ONE fresh virtual environment gets what Colab has preinstalled that the chapters use (`COLAB_PREINSTALLED`:
   torch 2.13.0, whose CPU wheel is on disk, numpy, matplotlib, ...) and the notebook runner (ipykernel, nbclient,
   nbformat); neither Helios nor its other dependencies.
3. This process (the checkout's Python, with the dev dependencies) writes each chapter without the cells the docs
   build skips (scripts/build_docs.py's skip_reason: the tst_flags, `#| gpu`, `#| eval: false`); the emulated Python
   imports nothing of the checkout's scripts. Each chapter is copied into an empty temporary folder with the wheel
   beside it and executed there by nbclient in that environment.
   The install cell acts as on Colab because HELIOS_COLAB=1 is in the kernel's environment (a stub `google.colab`
   would have to be imported into every kernel before the cell runs, and would shadow the real `google` namespace
   that protobuf and others share). So the first chapter's install cell installs the wheel with its dependencies
   from the package registry into the environment, and later chapters find them there.

With --jobs 2 the chapters after the first run two at a time (each in its own kernel and folder). No new chapter
starts after one fails (with --keep-going, all run); each failure prints `FAILED <chapter>: <error>`, and it exits 1
if a chapter failed, else 0. Times per chapter and in all go to stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what a Colab runtime ships that a chapter imports (torch from the CPU wheel on disk, never a plain `torch`)
COLAB_PREINSTALLED = ["torch==2.13.0", "numpy", "matplotlib", "ipywidgets", "httpx", "jsonschema", "openai"]
RUNNER = ["ipykernel", "nbclient", "nbformat"]
CELL_TIMEOUT_S = 1200
sys.path.insert(0, str(ROOT / "scripts"))


def skipped(cell: dict) -> bool:
    "Only code cells run, and none that nbdev-test or the docs build skips (the tst_flags, `#| gpu`, `#| eval: false`)."
    from build_docs import skip_reason, tst_flags
    return cell["cell_type"] != "code" or skip_reason("".join(cell["source"]), tst_flags()) is not None


def strip_skipped(paths: list[Path], out: Path) -> list[Path]:
    "Each chapter written to `out` with only the cells that would run (in this process: build_docs needs the dev dependencies)."
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in paths:
        nb = json.loads(path.read_text())
        nb["cells"] = [c for c in nb["cells"] if not skipped(c)]
        (out / path.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False)); written.append(out / path.name)
    return written


def chapters(names: list[str]) -> list[Path]:
    "The notebooks named (`04a_moe`, `nbs/04a_moe.ipynb`), else every one that runs code."
    from colab_cell import notebooks
    every = notebooks()
    if not names: return every
    by_name = {p.stem: p for p in every}
    unknown = [n for n in names if Path(n).stem not in by_name]
    if unknown: raise SystemExit(f"no chapter named {', '.join(unknown)}; chapters: {', '.join(by_name)}")
    return [by_name[Path(n).stem] for n in names]


def clean_env() -> dict[str, str]:
    "This process's environment without what would let the kernel import this checkout or another environment."
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    active = os.environ.get("VIRTUAL_ENV")
    if active: env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(active))
    return env


# what a build leaves in the checkout, or anything else that must not reach the wheel's source copy
NOT_SOURCE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "_site*", "_docs", "_proc", "__pycache__", ".docs-cache",
                                    ".pytest_cache", ".ruff_cache", ".venv", "venv", ".ipynb_checkpoints")


def build_wheel(out: Path) -> Path:
    "The wheel of this checkout as it is, built from a copy (setuptools' build/ in the checkout may hold stale files)."
    source = out.parent / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)], check=True)
    (wheel,) = out.glob("helios-*.whl")
    return wheel


def make_env(folder: Path) -> Path:
    "A fresh virtual environment with Colab's preinstalled packages and the runner; its python."
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    python = folder / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", *COLAB_PREINSTALLED, *RUNNER], check=True, env=clean_env())
    return python


def run_chapter(path: Path, wheel: Path) -> None:
    "Inside the environment: the notebook alone in an empty folder with the wheel, executed there as on Colab."
    import nbformat
    from nbclient import NotebookClient
    with tempfile.TemporaryDirectory(prefix=f"colab-{path.stem}-") as work:
        work = Path(work)
        shutil.copy(path, work / path.name); shutil.copy(wheel, work / wheel.name)
        nb = nbformat.read(work / path.name, as_version=4)  # its skipped cells already gone (strip_skipped)
        NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()


def inside(paths: list[Path], wheel: Path, keep_going: bool = False, jobs: int = 1) -> int:
    """Run the chapters in this (the emulated) Python: the first alone (its install cell installs Helios's
    dependencies), then the others `jobs` at a time, each in its own kernel and folder. After a failure no new
    chapter starts unless `keep_going`."""
    os.environ["HELIOS_COLAB"] = "1"
    start, failed, lock = time.perf_counter(), [], threading.Lock()

    def run(path: Path):
        if failed and not keep_going: return
        t0 = time.perf_counter()
        try:
            run_chapter(path, wheel)
        except Exception as e:  # nbclient's CellExecutionError carries the cell and its traceback
            error = getattr(e, "ename", type(e).__name__) + ": " + str(getattr(e, "evalue", "") or e).strip()
            with lock:
                print(f"{path.stem:28} {time.perf_counter() - t0:7.1f} s  failed", flush=True)
                print(str(e)[-6000:], file=sys.stderr)
                print(f"FAILED {path.stem}: {error.splitlines()[0] if error else type(e).__name__}", flush=True)
                failed.append(path)
            return
        with lock: print(f"{path.stem:28} {time.perf_counter() - t0:7.1f} s", flush=True)

    if paths: run(paths[0])
    with ThreadPoolExecutor(jobs) as pool: list(pool.map(run, paths[1:]))
    print(f"{len(paths)} chapters in {time.perf_counter() - start:.0f} s ({jobs} at a time), {len(failed)} failed", flush=True)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="notebook names or paths (default: every chapter)")
    parser.add_argument("--keep", action="store_true", help="keep the wheel and the environment (their folder is printed)")
    parser.add_argument("--keep-going", action="store_true", help="run every chapter even after one fails")
    parser.add_argument("--jobs", type=int, default=1, help="chapters run at a time after the first (default 1)")
    parser.add_argument("--inside", metavar="WHEEL", help=argparse.SUPPRESS)  # the second half, run in the environment
    args = parser.parse_args()
    if args.inside:  # stripped copies
        return inside([Path(p) for p in args.chapters], Path(args.inside), args.keep_going, args.jobs)
    paths = chapters(args.chapters)
    folder = Path(tempfile.mkdtemp(prefix="colab-emulate-"))
    try:
        t0 = time.perf_counter()
        wheel = build_wheel(folder / "dist")
        python = make_env(folder / "env")
        print(f"wheel and environment ready in {time.perf_counter() - t0:.0f} s ({wheel.name})", flush=True)
        from build_docs import longest_first
        runnable = strip_skipped(paths[:1] + longest_first(paths[1:]), folder / "chapters")  # the first installs
        cmd = [str(python), str(Path(__file__).resolve()), "--inside", str(wheel), *[str(p) for p in runnable]]
        if args.keep_going: cmd.append("--keep-going")
        cmd += ["--jobs", str(args.jobs)]
        return subprocess.run(cmd, env=clean_env(), cwd=folder).returncode
    finally:
        if args.keep: print(f"kept {folder}")
        else: shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
