"""Slurm and preemption: the grace Slurm leaves, and ``--requeue`` (put the job back, once).

:func:`slurm_grace`: how long Slurm lets the job live after the signal: ``KillWait`` after a
SIGTERM (a preemption, requeue or cancel: SIGKILL follows ``KillWait`` seconds later), the time to
the job's ``EndTime`` after any other signal (``--signal=USR1@90`` comes ahead of the time limit).
A grace longer than that would only end in SIGKILL, so the agent shortens it.

``--requeue``: after a preemption's save, put the Slurm job back in the queue, once.

One node (group rank 0) runs ``scontrol requeue <job>`` after every node has finished its
grace, when:

- the job is requeueable (``Requeue=1`` in ``scontrol show job``: ``sbatch --requeue``, or
  ``JobRequeue=1`` in ``slurm.conf``), and
- Slurm is not ending it already. A job Slurm requeues itself (preemption with
  ``PreemptMode=REQUEUE``, an administrator's ``scontrol requeue``) is ``COMPLETING`` with its
  ``Restarts`` already above this run's ``SLURM_RESTART_COUNT``: requeueing it again would queue
  a second restart. A job being cancelled (``scancel``) is not brought back either.

The restarted job finds ``SLURM_RESTART_COUNT`` set, and launcher gives its workers
``LAUNCHER_PREEMPTION_COUNT`` (:func:`preemption_count`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping

from launcher.errors import UsageError

log = logging.getLogger("launcher.preemption")

#: In every worker's environment when preemption handling is on: how many times this job was
#: requeued before this run (Slurm's ``SLURM_RESTART_COUNT``; 0 for a first run, or elsewhere).
PREEMPTION_COUNT_ENV = "LAUNCHER_PREEMPTION_COUNT"
#: Seconds an ``scontrol`` call may take (it runs while the workers save).
SCONTROL_TIMEOUT = 10.0

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def slurm_job_id(environ: Mapping[str, str]) -> str | None:
    """The Slurm job id (``SLURM_JOB_ID``), or ``None`` outside a Slurm job."""
    from launcher.clusters.slurm import job_id

    return job_id(environ)


def check_requeue(environ: Mapping[str, str]) -> None:
    """``--requeue`` needs a Slurm job and ``scontrol``: a usage error otherwise, before anything starts."""
    if slurm_job_id(environ) is None:
        raise UsageError("--requeue needs a Slurm job (SLURM_JOB_ID is not set): run it under sbatch, or drop it")
    if shutil.which("scontrol", path=environ.get("PATH")) is None:
        raise UsageError("--requeue runs 'scontrol requeue', but scontrol is not on PATH; add Slurm's bin directory")


def preemption_count(environ: Mapping[str, str]) -> int:
    """How many times this job was requeued before this run (``SLURM_RESTART_COUNT``, else 0)."""
    text = environ.get("SLURM_RESTART_COUNT", "").strip()
    return int(text) if text.isdigit() else 0


def slurm_grace(signum: int, environ: Mapping[str, str] | None = None,
                run: Runner | None = None) -> tuple[float, str] | None:
    """Seconds Slurm leaves this job after ``signum``, and where that comes from; ``None``
    outside Slurm or when Slurm does not say (no time limit, ``scontrol`` failing)."""
    import signal
    import time

    env = os.environ if environ is None else environ
    job = slurm_job_id(env)
    if job is None:
        return None
    call = _scontrol if run is None else run
    try:
        if signum == signal.SIGTERM:
            shown = call(["show", "config"])
            found = re.search(r"^KillWait\s*=\s*(\d+)", shown.stdout, re.MULTILINE)
            return (float(found.group(1)), "Slurm's KillWait") if shown.returncode == 0 and found else None
        shown = call(["show", "job", "-o", job])
        fields = dict(item.split("=", 1) for item in shown.stdout.split() if "=" in item)
        if shown.returncode != 0 or fields.get("TimeLimit") in (None, "UNLIMITED", "Partition_Limit"):
            return None
        end = time.mktime(time.strptime(fields.get("EndTime", ""), "%Y-%m-%dT%H:%M:%S"))  # local time
        return max(0.0, end - time.time()), f"the time limit of Slurm job {job}"
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log.debug("cannot ask Slurm for the grace: %s", exc)
        return None


def _scontrol(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT,
                          stdin=subprocess.DEVNULL, check=False)


def requeue(environ: Mapping[str, str] | None = None, run: Runner = _scontrol) -> str:
    """Requeue this Slurm job if it should be (see the module docstring); one line saying what was done."""
    env = os.environ if environ is None else environ
    job = slurm_job_id(env)
    if job is None:
        return "not requeued: not a Slurm job"
    try:
        shown = run(["show", "job", "-o", job])
    except (OSError, subprocess.SubprocessError) as exc:
        return f"not requeued: scontrol show job {job} failed: {exc}"
    if shown.returncode != 0:
        return f"not requeued: scontrol show job {job}: {(shown.stderr or shown.stdout).strip()}"
    fields = dict(item.split("=", 1) for item in shown.stdout.split() if "=" in item)
    if fields.get("Requeue") != "1":
        return (f"not requeued: Slurm job {job} is not requeueable (submit it with sbatch --requeue, "
                "or set JobRequeue=1 in slurm.conf)")
    state = fields.get("JobState", "?")
    restarts = fields.get("Restarts", "0")
    if state != "RUNNING":
        if restarts.isdigit() and int(restarts) > preemption_count(env):
            return f"not requeued again: Slurm already requeued job {job} (restart {restarts})"
        return f"not requeued: Slurm is ending job {job} ({state})"
    try:
        done = run(["requeue", job])
    except (OSError, subprocess.SubprocessError) as exc:
        return f"not requeued: scontrol requeue {job} failed: {exc}"
    if done.returncode != 0:
        return f"not requeued: scontrol requeue {job}: {(done.stderr or done.stdout).strip()}"
    return f"requeued Slurm job {job} (restart {preemption_count(env) + 1})"
