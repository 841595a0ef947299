"""``--run-path``: run a script with :func:`runpy.run_path` inside the worker process."""

from __future__ import annotations

import runpy
import sys


def run_script(script: str, *args: str) -> None:
    """Run ``script`` as ``__main__`` with ``sys.argv`` set as ``python script args`` would."""
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
