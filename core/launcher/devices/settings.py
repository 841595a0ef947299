"""The NUMA flags, ``--numa-binding`` and ``--numa-fallback``: declared, parsed and checked here.

:func:`read_numa` gives one :class:`NumaSettings`; the strategy's name is resolved to a plugin,
and the CPUs planned, when the launch plan is built (:mod:`launcher.numa`). This module lives in
the light ``launcher.devices`` package, not in :mod:`launcher.numa`, whose import reads the
topology code: every launch imports the flags, only a NUMA-bound one needs that.
"""

# No "from __future__ import annotations": typing.NamedTuple would compile every field's
# annotation string at import, which every launch pays.

from typing import Any, NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import quote

__all__ = ["FLAGS", "NUMA_FALLBACKS", "NumaSettings", "check_numa_fallback", "read_numa"]

NUMA_FALLBACKS = ("warn", "error")


class NumaSettings(NamedTuple):
    """The NUMA strategy's name (``None``: workers run unbound) and what to do when it cannot apply."""

    binding: str | None = None
    fallback: str = "warn"


def check_numa_fallback(value: Any) -> str:
    """``warn`` or ``error``."""
    if value not in NUMA_FALLBACKS:
        raise UsageError(f"--numa-fallback must be warn or error, got {quote(value)}")
    return str(value)


def read_numa(values: FlagValues) -> NumaSettings:
    """``--numa-binding`` and ``--numa-fallback``, checked."""
    return NumaSettings(values["numa_binding"], check_numa_fallback(values["numa_fallback"]))


FLAGS: FlagGroup[NumaSettings] = FlagGroup(
    name="numa",
    title="NUMA binding",
    read=read_numa,
    flags=(
        Flag("--numa-binding", default=None, env=False, torchrun=True,
             help="NUMA affinity strategy: node, socket, exclusive, core-complex, or a plugin's name."),
        Flag("--numa-fallback", default="warn", choices=("warn", "error"),
             help="When a NUMA strategy cannot apply: warn and run unbound, or fail (default warn)."),
    ),
)
