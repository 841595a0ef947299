"""What the GPU lane's tests share: whether torch sees a CUDA device, and the figures they record.

Decided without failing on a CPU-only torch (or no torch): :func:`cuda_devices` says 0 there, and
the tests marked ``gpu`` are skipped, not failed (``tests/gpu/conftest.py``). A test records a
figure (seconds of something it timed, for the lane's table beside torchrun's) with
:func:`record_figure`: into the file named by ``LAUNCHER_LANE_FIGURES`` when the lane script set it,
and into the pytest summary. Tests never judge a figure: figures live in ``benchmarks/``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Where :func:`record_figure` appends (one JSON object a line), when set.
FIGURES_ENV = "LAUNCHER_LANE_FIGURES"
#: The figures of this pytest run, for the terminal summary.
RECORDED: list[dict[str, Any]] = []


@functools.lru_cache(maxsize=1)
def cuda_devices() -> int:
    """CUDA devices torch sees in this process (0 without torch, with a CPU-only build, or no driver)."""
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # a broken driver is "no device" for the lane: it says why in the skip
        return 0


def skip_reason() -> str:
    try:
        import torch
    except ImportError:
        return "no torch here"
    return f"torch {torch.__version__} sees no CUDA device"


def record_figure(name: str, seconds: float, **detail: Any) -> None:
    """Note a figure the test measured (not a verdict: no threshold applies)."""
    row = {"figure": name, "seconds": round(seconds, 3), **detail}
    RECORDED.append(row)
    path = os.environ.get(FIGURES_ENV)
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps(row, sort_keys=True) + "\n")


def stamps(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """What the lane's job scripts stamped into ``path`` (``scripts/gpu_job.py``'s ``LANE_STAMPS``), in order."""
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line being written as we read
            continue
    return rows


def first(rows: list[dict[str, Any]], event: str, after: float = 0.0) -> dict[str, Any] | None:
    """The first row of ``event`` stamped after ``after`` (``None``: none)."""
    return next((row for row in rows if row["event"] == event and row["t"] > after), None)


#: The lane's job script (its modes in its docstring).
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "gpu_job.py")
#: torchrun, as the same interpreter runs it.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def job_env(stamps_path: str | os.PathLike[str], **extra: str) -> dict[str, str]:
    """The job's extra environment: where to stamp, and ``extra``."""
    return {"LANE_STAMPS": str(stamps_path), **extra}


class JobFailed(AssertionError):
    """A lane job did not do what it was run for (its output's end in the message)."""


Ran = tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], float]


def run_job(tool: str, job_args: Sequence[str], work: Path, *, nproc: str = "1", flags: Sequence[str] = (),
            env: Mapping[str, str] | None = None, timeout: float = 140) -> Ran:
    """Run the lane's job under ``tool`` (``launcher`` or ``torchrun``) to its end: the process, the
    stamps of its ranks, and the wall-clock time it was started at."""
    from tests.conftest import LAUNCHER, launcher_env

    work.mkdir(parents=True, exist_ok=True)
    stamps_path = work / "stamps.jsonl"
    stamps_path.unlink(missing_ok=True)
    program = LAUNCHER if tool == "launcher" else TORCHRUN
    command = [*program, "--standalone", "--nproc-per-node", nproc, *flags, JOB, *job_args]
    started = time.time()
    result = subprocess.run(command, env=launcher_env({**job_env(stamps_path), **(env or {})}), capture_output=True,
                            text=True, timeout=timeout, cwd=work)
    return result, stamps(stamps_path), started


def _backend(backend: str, device: str) -> list[str]:
    return ["--backend", backend, "--device", device]


def measure_start(tool: str, work: Path, *, backend: str = "nccl", device: str = "cuda") -> dict[str, Any]:
    """Seconds from starting ``tool`` to every rank's first ``all_reduce`` done (one rank a GPU)."""
    nproc = "gpu" if device == "cuda" else "1"
    result, rows, started = run_job(tool, ["--mode", "first", *_backend(backend, device)], work, nproc=nproc)
    done = [row for row in rows if row["event"] == "first_allreduce"]
    if result.returncode != 0 or not done or any(row["value"] != len(done) for row in done):
        raise JobFailed(f"{tool} start: exit {result.returncode}, stamps {rows}\n{result.stderr[-3000:]}")
    return {"seconds": max(row["t"] for row in done) - started, "ranks": len(done)}


#: The restarts compared: the name in the figures, the tool, its flags.
RESTARTS = {"launcher --preload torch": ("launcher", ["--preload", "torch"]), "launcher": ("launcher", []),
            "torchrun": ("torchrun", [])}


def measure_restart(name: str, work: Path, *, backend: str = "nccl", device: str = "cuda") -> dict[str, Any]:
    """Seconds from a worker's failure (after its first ``all_reduce``) to its replacement's first
    ``all_reduce``; one worker, ``OMP_NUM_THREADS=1`` (so ``--preload torch`` forks it)."""
    tool, flags = RESTARTS[name]
    result, rows, _ = run_job(tool, ["--mode", "first", "--fail-first", *_backend(backend, device)], work,
                              flags=["--max-restarts", "1", *flags], env={"OMP_NUM_THREADS": "1"})
    failing = first(rows, "failing")
    back = first(rows, "first_allreduce", after=failing["t"]) if failing else None
    if result.returncode != 0 or back is None or back["restart"] != 1:
        raise JobFailed(f"{name} restart: exit {result.returncode}, stamps {rows}\n{result.stderr[-3000:]}")
    return {"seconds": back["t"] - failing["t"], "preloaded": back["preloaded"],
            "replaced": back["pid"] != failing["pid"], "value": back["value"]}


def measure_in_place(work: Path, *, backend: str = "nccl", device: str = "cuda") -> dict[str, Any]:
    """Seconds from a ``launcher.recoverable`` function's raise to the next call's first ``all_reduce``."""
    result, rows, _ = run_job("launcher", ["--mode", "recover", *_backend(backend, device)], work,
                              flags=["--max-restarts", "1"])
    failing = first(rows, "failing")
    back = first(rows, "first_allreduce", after=failing["t"]) if failing else None
    done = first(rows, "done")
    if result.returncode != 0 or back is None or done is None:
        raise JobFailed(f"recovery in place: exit {result.returncode}, stamps {rows}\n{result.stderr[-3000:]}")
    return {"seconds": back["t"] - failing["t"], "same_pid": back["pid"] == failing["pid"], "call": back["call"],
            "same_address": back["same_address"], "intact": back["intact"], "calls": done["calls"]}


#: The figures' names, shared by the tests that measure them and benchmarks/gpu_figures.py.
START = "start -> first all_reduce ({})"
RESTART = "restart: failure -> replacement's first all_reduce ({})"
IN_PLACE = "recovery in place: raise -> next call's first all_reduce (launcher)"
