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

__all__ = ["LaunchConfig", "launch", "heartbeat", "quiet", "__version__"]


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
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
