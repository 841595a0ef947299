"""The clean virtual environment every side-by-side benchmark runs both tools from.

``benchmarks/.venv`` holds this checkout (editable) and torch==2.13.0 and nothing else, so neither
tool pays for the global interpreter's ``.pth`` imports at each start. Created on first use.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "benchmarks" / ".venv"


def ensure_venv() -> Path:
    """The venv's interpreter, creating the venv first if needed."""
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-e", str(ROOT), "torch==2.13.0"],
                       check=True)
    return python
