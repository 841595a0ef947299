"""The workers' start-up hook (``launcher/stragglers/timing.py``) loaded in a fresh interpreter,
as a worker's start-up loads it: for the tests of what it wraps and what it writes to the slots."""

from __future__ import annotations

from pathlib import Path

#: The hook's file (the tests pass it to the interpreter as ``$TIMING``).
TIMING = Path(__file__).resolve().parents[2] / "core" / "launcher" / "stragglers" / "timing.py"

#: Python that loads the hook from ``$TIMING`` under the name the start-up hook gives it, as the
#: recorded worker (``LAUNCHER_HEARTBEAT_PID``), and installs it: ``timing`` is the module.
LOAD_HOOK = """
import importlib.util, os, sys
os.environ["LAUNCHER_HEARTBEAT_PID"] = str(os.getpid())
spec = importlib.util.spec_from_file_location("_launcher_straggler_timing", os.environ["TIMING"])
timing = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = timing
spec.loader.exec_module(timing)
timing.install()
"""
