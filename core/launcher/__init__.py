"""launcher: a drop-in replacement for torchrun.

The command line is :mod:`launcher.cli`; the Python API is :class:`LaunchConfig` and
:func:`launch`. Importing this package is cheap: it imports neither torch nor any plugin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # pragma: no cover
    from launcher.api import LaunchConfig, launch
    from launcher.hangs.heartbeat import heartbeat, quiet
    from launcher.preemption.notice import on_preemption, preempted, preemption_time_left, wait_for_preemption
    from launcher.recovery.worker import recoverable

#: The worker-side preemption API (standard library only, see launcher.preemption.notice).
_PREEMPTION = ("preempted", "preemption_time_left", "wait_for_preemption", "on_preemption")

__all__ = ["LaunchConfig", "launch", "heartbeat", "quiet", "preempted", "preemption_time_left", "wait_for_preemption",
           "on_preemption", "recoverable", "__version__"]


def __getattr__(name: str) -> Any:
    # The API module pulls in the agent; load it only when it is used.
    if name in ("LaunchConfig", "launch"):
        from launcher import api

        return getattr(api, name)
    if name in ("heartbeat", "quiet"):
        # Standard library only: training code calls it without loading the agent. Kept as a
        # module global afterwards, so ``launcher.heartbeat()`` skips this function next time.
        from launcher.hangs.heartbeat import heartbeat, quiet

        globals().update(heartbeat=heartbeat, quiet=quiet)
        return globals()[name]
    if name in _PREEMPTION:
        # Standard library only, like heartbeat(): kept as module globals after the first use.
        from launcher.preemption import notice

        globals().update({attr: getattr(notice, attr) for attr in _PREEMPTION})
        return globals()[name]
    if name == "recoverable":
        # Standard library only, like heartbeat(): kept as a module global after the first use.
        from launcher.recovery.worker import recoverable

        globals()["recoverable"] = recoverable
        return recoverable
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
