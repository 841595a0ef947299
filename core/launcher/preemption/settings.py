"""The preemption flags, ``--preemption-signals``, ``--preemption-grace``, ``--requeue`` and
``--preemption-state-dir``: declared, parsed and checked here (``settings["preemption"]``).

Preemption handling is off unless one of them is given, so a plain SIGTERM keeps torchrun's
meaning (forward it, stop, exit 128+15). With any, the signals named (SIGTERM by default) mean
"this job is being preempted": every rank is told, and has the grace to save.
"""

# No "from __future__ import annotations": typing.NamedTuple would compile every field's
# annotation string at import, which every launch pays.

import signal
from collections.abc import Sequence
from typing import Any, NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import parse_seconds, quote

#: The exit status of a preempted job: ``EX_TEMPFAIL`` of sysexits.h ("try again later"). Not 0,
#: so a Kubernetes pod's ``restartPolicy: OnFailure`` brings it back, and not 1 or 128+N, so a
#: script (or a ``podFailurePolicy``) can tell a preemption from a failure.
PREEMPTED_EXIT = 75

#: The signals that mean preemption when the flag does not say: what Slurm and Kubernetes send.
DEFAULT_SIGNALS = ("SIGTERM",)

#: Signals that cannot be caught (or that the agent needs for itself).
_UNUSABLE = ("SIGKILL", "SIGSTOP", "SIGCHLD")


class PreemptionPlan(NamedTuple):
    """What the agent does when it is preempted."""

    #: Signal numbers that mean preemption.
    signals: "tuple[int, ...]"
    #: Seconds the workers have to save and exit after the notice.
    grace: float
    #: ``--requeue``: requeue the Slurm job after the save (launcher.preemption.requeue).
    requeue: bool = False
    #: ``--preemption-state-dir``: where launcher counts the job's preemptions across runs
    #: (launcher.preemption.record); ``None``: only Slurm's restart count is known.
    state_dir: "str | None" = None


class PreemptionSettings(NamedTuple):
    """The flags as given, checked: all unset (the default) means preemption handling is off."""

    #: Signal numbers that mean preemption (``None``: SIGTERM, once preemption is on).
    signals: "tuple[int, ...] | None" = None
    #: Seconds to save and exit (``None``: ``--shutdown-timeout``).
    grace: "float | None" = None
    requeue: bool = False
    #: An existing, writable directory (absolute), or ``None``.
    state_dir: "str | None" = None

    @property
    def enabled(self) -> bool:
        return self.signals is not None or self.grace is not None or self.requeue or self.state_dir is not None


def parse_preemption_signals(value: Any, name: str = "--preemption-signals") -> "tuple[int, ...] | None":
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


def parse_preemption_grace(value: Any, name: str = "--preemption-grace") -> "float | None":
    """Seconds (0 to a week, as every timeout: :func:`launcher.values.parse_seconds`), or
    ``None`` when unset or empty."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return parse_seconds(value, name)


def preemption_plan(signals: "Sequence[int] | None", grace: "float | None", default_grace: float,
                    requeue: bool = False, state_dir: "str | None" = None) -> "PreemptionPlan | None":
    """The plan, or ``None`` when no preemption flag was given (preemption handling off).

    ``default_grace`` (``--shutdown-timeout``) applies when the grace was not given.
    """
    if signals is None and grace is None and not requeue and state_dir is None:
        return None
    numbers = tuple(signals) if signals is not None else tuple(int(getattr(signal, s)) for s in DEFAULT_SIGNALS)
    return PreemptionPlan(numbers, default_grace if grace is None else grace, requeue, state_dir)


def preemption_settings(signals: Any = None, grace: Any = None, requeue: bool = False, state_dir: Any = None, *,
                        names: "tuple[str, ...]" = ("--preemption-signals", "--preemption-grace", "--requeue",
                                                    "--preemption-state-dir"),
                        ) -> PreemptionSettings:
    """The settings, checked as the flags are; the Python API's way:
    ``LaunchConfig(settings={"preemption": preemption_settings(grace=60)})``. ``--requeue`` is
    checked against the environment (a Slurm job) now, before anything starts; so is
    ``state_dir`` (an existing, writable directory)."""
    directory = None
    if state_dir is not None and str(state_dir).strip():  # its module only when asked for: every launch parses
        from launcher.preemption.record import check_state_dir

        directory = check_state_dir(state_dir, names[3])
    settings = PreemptionSettings(parse_preemption_signals(signals, names[0]), parse_preemption_grace(grace, names[1]),
                                  bool(requeue), directory)
    if settings.requeue:
        import os

        from launcher.preemption.requeue import check_requeue

        check_requeue(os.environ)
    return settings


def read_preemption(values: FlagValues) -> PreemptionSettings:
    """``--preemption-signals``, ``--preemption-grace`` and ``--requeue``, checked."""
    return preemption_settings(values["preemption_signals"], values["preemption_grace"], bool(values["requeue"]),
                               values["preemption_state_dir"],
                               names=(values.source("preemption_signals"), values.source("preemption_grace"),
                                      values.source("requeue"), values.source("preemption_state_dir")))


def plan_for(settings: "PreemptionSettings | None", shutdown_timeout: float) -> "PreemptionPlan | None":
    """The preemption plan (``None``: preemption handling off); the grace defaults to ``shutdown_timeout``."""
    if settings is None:
        return None
    return preemption_plan(settings.signals, settings.grace, shutdown_timeout, settings.requeue, settings.state_dir)


FLAGS: FlagGroup[PreemptionSettings] = FlagGroup(
    name="preemption",
    title="preemption",
    read=read_preemption,
    flags=(
        Flag("--preemption-signals", default=None,
             help="Comma list of signals that mean the job is being preempted (default SIGTERM once preemption is "
             "on, which this flag or --preemption-grace turns on): every rank sees launcher.preempted(), the "
             "workers get the grace to save and exit, and the job exits with status 75."),
        Flag("--preemption-grace", default=None,
             help="Seconds the workers have to save and exit once preempted, before they are stopped as on any "
             "signal (default: --shutdown-timeout). Turns preemption handling on."),
        Flag("--requeue", switch=True, underscore=False,
             help="Under Slurm: after a preemption's save, one node runs 'scontrol requeue' for the job (when it "
             "is requeueable and Slurm is not requeueing it already). Turns preemption handling on."),
        Flag("--preemption-state-dir", default=None,
             help="An existing directory that outlives the job (shared by its nodes: where checkpoints go): "
             "launcher counts the job's preemptions there across runs, so a job run again after exit status 75 "
             "finds LAUNCHER_PREEMPTION_COUNT above 0 outside Slurm too; removed when the job succeeds. Turns "
             "preemption handling on."),
    ),
)
