"""The clean virtual environment every side-by-side benchmark runs both tools from.

``benchmarks/.venv`` holds this checkout (editable) and torch==2.13.0 and nothing else, so neither
tool pays for the global interpreter's ``.pth`` imports at each start. Created on first use.

``LAUNCHER_BENCH_VENV=DIR`` uses an existing virtual environment with launcher and torch instead
(to check that a benchmark script works, e.g. with ``.tox/py3``; publish figures from the clean one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("LAUNCHER_BENCH_VENV") or ROOT / "benchmarks" / ".venv").absolute()


def ensure_venv() -> Path:
    """The venv's interpreter, creating the venv first if needed."""
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-e", str(ROOT), "torch==2.13.0"],
                       check=True)
    return python
