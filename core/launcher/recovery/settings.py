"""The in-place recovery flags, ``--recovery`` and ``--recovery-timeout``: declared, parsed and checked here.

:func:`read_recovery` gives one :class:`RecoverySettings` (``settings["recovery"]``); the Python
API passes ``LaunchConfig(settings={"recovery": recovery_settings("restart")})``. Without the
flags, or from the API without that key, the defaults apply: in-place recovery whenever every
rank runs its training function under :func:`launcher.recoverable` (docs/recovery.md).
"""

# No "from __future__ import annotations": typing.NamedTuple would compile every field's
# annotation string at import, which every launch pays.

from typing import Any, NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import parse_seconds

__all__ = ["DEFAULT_TIMEOUT", "FLAGS", "MODES", "RecoverySettings", "read_recovery", "recovery_settings"]

#: ``in-place``: recover live workers in place when they all can; ``restart``: always restart every worker.
MODES = ("in-place", "restart")
#: Seconds every live worker has to leave its function once told to (then: a full restart).
DEFAULT_TIMEOUT = 30.0


class RecoverySettings(NamedTuple):
    """How the agent answers a failure: in place when it can (the default), or by a full restart."""

    mode: str = "in-place"
    #: Seconds the live workers have to leave their function and report it.
    timeout: float = DEFAULT_TIMEOUT

    @property
    def in_place(self) -> bool:
        return self.mode == "in-place"


def recovery_settings(mode: Any = "in-place", timeout: Any = DEFAULT_TIMEOUT, *,
                      names: tuple[str, str] = ("--recovery", "--recovery-timeout")) -> RecoverySettings:
    """The settings for ``mode`` and ``timeout``, checked (``names``: how the user gave them)."""
    text = str(mode if mode is not None else "in-place").strip().lower()
    if text not in MODES:
        raise UsageError(f"{names[0]} {mode!r} is invalid: use in-place or restart")
    if timeout is None or (isinstance(timeout, str) and not timeout.strip()):
        seconds = DEFAULT_TIMEOUT
    else:
        seconds = parse_seconds(timeout, names[1], zero=False)
    return RecoverySettings(text, seconds)


def read_recovery(values: FlagValues) -> RecoverySettings:
    """``--recovery`` and ``--recovery-timeout``, checked."""
    return recovery_settings(values["recovery"], values["recovery_timeout"],
                             names=(values.source("recovery"), values.source("recovery_timeout")))


FLAGS: FlagGroup[RecoverySettings] = FlagGroup(
    name="recovery",
    title="recovery in place",
    read=read_recovery,
    flags=(
        Flag("--recovery", default="in-place",
             help="How a failure is answered: in-place (default; when every rank runs under launcher.recoverable, "
             "live workers keep their process and only dead ones are replaced) or restart (every worker is "
             "stopped and started again, as torchrun does)."),
        Flag("--recovery-timeout", default=None,
             help=f"Seconds the live workers have to leave their function during an in-place recovery before "
             f"the agent falls back to a full restart (default: {DEFAULT_TIMEOUT:g})."),
    ),
)
