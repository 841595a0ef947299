"""The preemption settings: ``--preemption-signals`` and ``--preemption-grace``, validated.

Preemption handling is off unless one of the two is given, so a plain SIGTERM keeps torchrun's
meaning (forward it, stop, exit 128+15). With either flag, the signals it names (SIGTERM by
default) mean "this job is being preempted": every rank is told, and has the grace to save.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from launcher.errors import UsageError
from launcher.values import parse_seconds, quote

#: The exit status of a preempted job: ``EX_TEMPFAIL`` of sysexits.h ("try again later"). Not 0,
#: so a Kubernetes pod's ``restartPolicy: OnFailure`` brings it back, and not 1 or 128+N, so a
#: script (or a ``podFailurePolicy``) can tell a preemption from a failure.
PREEMPTED_EXIT = 75

#: The signals that mean preemption when the flag does not say: what Slurm and Kubernetes send.
DEFAULT_SIGNALS = ("SIGTERM",)

#: Signals that cannot be caught (or that the agent needs for itself).
_UNUSABLE = ("SIGKILL", "SIGSTOP", "SIGCHLD")


@dataclass(frozen=True)
class PreemptionPlan:
    """What the agent does when it is preempted."""

    #: Signal numbers that mean preemption.
    signals: tuple[int, ...]
    #: Seconds the workers have to save and exit after the notice.
    grace: float
    #: ``--requeue``: requeue the Slurm job after the save (launcher.preemption.requeue).
    requeue: bool = False


def parse_preemption_signals(value: Any, name: str = "--preemption-signals") -> tuple[int, ...] | None:
    """Signal numbers for a comma list of names (``SIGTERM,SIGUSR1`` or ``TERM,USR1``);
    ``None`` when unset. An empty list, an empty item or an unknown name is a usage error."""
    if value is None:
        return None
    names = value.split(",") if isinstance(value, str) else list(value)
    hint = "use names like SIGTERM,SIGUSR1"
    if not any(str(item).strip() for item in names):
        raise UsageError(f"{name} {quote(','.join(map(str, names)))} names no signal; {hint}")
    numbers: list[int] = []
    for raw in names:
        text = str(raw).strip().upper()
        if not text:
            raise UsageError(f"{name} {quote(','.join(map(str, names)))} has an empty item; {hint}")
        full = text if text.startswith("SIG") else "SIG" + text
        number = getattr(signal, full, None)
        if not isinstance(number, signal.Signals) or full in _UNUSABLE:
            raise UsageError(f"{name}: {quote(str(raw).strip())} is not a signal the launcher can catch; {hint}")
        if int(number) not in numbers:
            numbers.append(int(number))
    return tuple(numbers)


def parse_preemption_grace(value: Any, name: str = "--preemption-grace") -> float | None:
    """Seconds (0 to a week, as every timeout: :func:`launcher.values.parse_seconds`), or
    ``None`` when unset or empty."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return parse_seconds(value, name)


def preemption_plan(signals: Sequence[int] | None, grace: float | None, default_grace: float,
                    requeue: bool = False) -> PreemptionPlan | None:
    """The plan, or ``None`` when no preemption flag was given (preemption handling off).

    ``default_grace`` (``--shutdown-timeout``) applies when the grace was not given.
    """
    if signals is None and grace is None and not requeue:
        return None
    numbers = tuple(signals) if signals is not None else tuple(int(getattr(signal, s)) for s in DEFAULT_SIGNALS)
    return PreemptionPlan(numbers, default_grace if grace is None else grace, requeue)


def check_preemption_config(config: Any) -> None:
    """Check a :class:`~launcher.config.LaunchConfig`'s preemption fields (and normalise the grace)."""
    parse_preemption_signals(config.preemption_signals)
    config.preemption_grace = parse_preemption_grace(config.preemption_grace)
    if config.preemption_requeue:
        import os

        from launcher.preemption.requeue import check_requeue

        check_requeue(os.environ)


def plan_for(config: Any) -> PreemptionPlan | None:
    """The preemption plan of a checked :class:`~launcher.config.LaunchConfig`."""
    return preemption_plan(parse_preemption_signals(config.preemption_signals), config.preemption_grace,
                           config.shutdown_timeout, bool(config.preemption_requeue))
