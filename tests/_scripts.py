"""Import the repository's scripts/ (not a package) from tests."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str):
    "The module scripts/<name>.py."
    spec = importlib.util.spec_from_file_location(f"scripts.{name}", ROOT / "scripts" / f"{name}.py")
    module = sys.modules[f"scripts.{name}"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module
