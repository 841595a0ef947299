"""What a health check sees (:class:`CheckContext`) and what it answers (:class:`CheckResult`).

A check is a callable ``check(context) -> CheckResult``, registered as a
:class:`~launcher.plugins.types.HealthCheck`. It answers :func:`healthy`, :func:`sick` with a
one-line reason, or :func:`skipped` with a one-line note (the check does not apply here: no
NVIDIA driver, no command configured). The runner (:mod:`launcher.health.runner`) gives it its
time limit and turns an exception or an overrun into a sick answer naming the check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from launcher.errors import LaunchError

__all__ = [
    "EXIT_NODE_SICK",
    "HEALTHY",
    "SICK",
    "SKIPPED",
    "CheckContext",
    "CheckResult",
    "NodeSick",
    "healthy",
    "sick",
    "skipped",
]

#: The exit status of an agent whose node failed a health check. No other path of the launcher
#: uses it (0 success, 1 the job failed, 2 bad input, 128+N a signal), so a scheduler can tell
#: "this node is bad, drain it" from "the job failed". 69 is ``EX_UNAVAILABLE`` of sysexits.h.
EXIT_NODE_SICK = 69

HEALTHY = "healthy"
SICK = "sick"
SKIPPED = "skipped"


@dataclass(frozen=True)
class CheckResult:
    """One check's answer: ``status`` (:data:`HEALTHY`, :data:`SICK` or :data:`SKIPPED`) and,
    for sick and skipped, one line saying why."""

    status: str
    reason: str = ""

    def __post_init__(self) -> None:
        if self.status not in (HEALTHY, SICK, SKIPPED):
            raise ValueError(f"a health check's status is healthy, sick or skipped, not {self.status!r}")
        # One line: a reason is printed inside a single log line and stored in a record.
        text = " ".join(str(self.reason).split())
        object.__setattr__(self, "reason", text)

    @property
    def is_sick(self) -> bool:
        return self.status == SICK


def healthy() -> CheckResult:
    """The node passed the check."""
    return CheckResult(HEALTHY)


def sick(reason: str) -> CheckResult:
    """The node must not join: ``reason`` says what is wrong, in one line."""
    return CheckResult(SICK, reason or "no reason given")


def skipped(note: str) -> CheckResult:
    """The check does not apply on this node: ``note`` says why, in one line."""
    return CheckResult(SKIPPED, note)


@dataclass(frozen=True)
class CheckContext:
    """What a check may look at: the launch as the agent will run it.

    ``env`` is the workers' base environment (``CUDA_VISIBLE_DEVICES`` as the workers see it);
    ``python`` the workers' interpreter (``None`` with ``--no-python``); ``module`` the entrypoint
    for ``-m`` (``None`` for a script); ``preload`` the ``--preload`` modules; ``nproc_per_node``
    the workers per node and ``device_kind`` the device provider that counted them (``cuda``,
    ``gpu`` or ``None`` when the count was given as a number); ``command`` the
    ``--health-check-cmd`` path (``None`` when unset); ``time_limit`` the seconds the check has.
    """

    node: str
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    log_dir: str | None = None
    temp_dir: str = "/tmp"
    python: str | None = None
    module: str | None = None
    script: str | None = None
    preload: tuple[str, ...] = ()
    nproc_per_node: int = 1
    device_kind: str | None = None
    command: str | None = None
    time_limit: float = 10.0


class NodeSick(LaunchError):
    """A health check failed: this node does not join (exit status :data:`EXIT_NODE_SICK`)."""

    exit_code = EXIT_NODE_SICK

    def __init__(self, node: str, check: str, reason: str) -> None:
        super().__init__(f"node {node} is sick: health check {check!r} failed: {reason}; "
                         f"it does not join the job (exit status {EXIT_NODE_SICK})")
        self.node = node
        self.check = check
        self.reason = reason
