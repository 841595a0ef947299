"""launcher's own count of a job's preemptions, kept across runs (``--preemption-state-dir``).

A job brought back after a preemption must know it is a continuation, to load its checkpoint.
Slurm says so (``SLURM_RESTART_COUNT``); Kubernetes does not tell a restarted container anything,
and a wrapper script that simply runs the same command again does not either. So with
``--preemption-state-dir DIR`` each agent keeps a small record in ``DIR``
(:data:`RECORD_NAME`). The directory names the job, not the rendezvous id (``--standalone``
draws a new one every run): give each job its own, the directory of its checkpoints.

- at the start, it reads the count, and the workers get ``LAUNCHER_PREEMPTION_COUNT`` = the
  larger of that count and Slurm's restart count;
- when the job ends preempted (exit status 75), it writes the count + 1;
- when the job succeeds (exit status 0), it removes the record: the next run with that id is a
  first run again. A failure leaves it as it is (a failed job resumed by hand is still a
  continuation).

Every node does the same with the same numbers, so on a shared file system (where checkpoints
live, the place to choose) all nodes write the same count; a write is a new file renamed over the
old one, so a reader never sees half a record. With a directory of each node's own (a
Kubernetes ``emptyDir`` survives a container's restart, not a pod's), a node that is new to the
job reads no record: give the nodes a shared directory when the job can move.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time

from launcher.errors import UsageError

log = logging.getLogger("launcher.preemption")

#: The record's file name in ``--preemption-state-dir``.
RECORD_NAME = "launcher-preemptions.json"


def check_state_dir(value: str | None, name: str = "--preemption-state-dir") -> str | None:
    """The directory, made absolute, when it is an existing directory this user can write;
    ``None`` when unset or empty. Anything else is a usage error, before anything starts."""
    if value is None or not str(value).strip():
        return None
    path = os.path.abspath(os.path.expanduser(str(value)))
    hint = "give an existing, writable directory that outlives the job (where its checkpoints go)"
    if not os.path.exists(path):
        raise UsageError(f"{name} {path}: no such directory; {hint}")
    if not os.path.isdir(path):
        raise UsageError(f"{name} {path} is not a directory; {hint}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{name} {path} is not writable by this user; {hint}")
    return path


class PreemptionRecord:
    """One job's record in ``--preemption-state-dir``: how many times it was preempted so far.
    ``run_id`` (this run's rendezvous id) is written beside the count, for people reading it."""

    def __init__(self, directory: str, run_id: str) -> None:
        self.path = os.path.join(directory, RECORD_NAME)
        self._run_id = run_id
        self._count: int | None = None

    @property
    def count(self) -> int:
        """The preemptions before this run (read once, at the first ask)."""
        if self._count is None:
            self._count = self._read()
        return self._count

    def _read(self) -> int:
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
            count = int(data["count"])
            if count < 0:
                raise ValueError(count)
            return count
        except FileNotFoundError:
            return 0
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("preemption record %s cannot be read (%s): counting this run as a first run", self.path, exc)
            return 0

    def preempted(self, signal_name: str, node: str) -> None:
        """The job ends preempted: the next run is continuation number ``count + 1``."""
        record = {"count": self.count + 1, "run_id": self._run_id, "signal": signal_name, "node": node,
                  "time": time.time()}
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as handle:
                json.dump(record, handle)
                handle.flush()
                os.fsync(handle.fileno())  # it must survive the node going away right after
            os.replace(temporary, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            log.warning("cannot write the preemption record %s: %s; the next run will not know it continues "
                        "this one", self.path, exc)

    def succeeded(self) -> None:
        """The job is done: the next run with this id is a first run."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove the preemption record %s: %s", self.path, exc)


__all__ = ["RECORD_NAME", "PreemptionRecord", "check_state_dir"]
