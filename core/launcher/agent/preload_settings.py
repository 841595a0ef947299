"""The ``--preload`` flag: modules a per-node template imports once, workers forked from it.

Declared, parsed and checked here (:data:`FLAGS`), apart from :mod:`launcher.agent.preload`:
every launch reads its flags, only a preloading one needs the template's machinery.
:func:`read_preload` gives one :class:`PreloadSettings`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import quote

__all__ = ["FLAGS", "PreloadSettings", "parse_preload", "read_preload"]

log = logging.getLogger("launcher.agent")


@dataclass(frozen=True)
class PreloadSettings:
    """The modules to preload, each once, in order (empty: workers start normally)."""

    modules: tuple[str, ...] = ()


def parse_preload(value: str | Iterable[str] | None, name: str = "--preload") -> tuple[str, ...]:
    """``torch,numpy`` (or a sequence of names) as a tuple of module names; a one-line error otherwise."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    modules: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise UsageError(f"{name}: module names must be strings, got {quote(item)}")
        module = item.strip()
        if not module:
            continue
        if not all(part.isidentifier() for part in module.split(".")):
            raise UsageError(f"{name} {quote(module)} is not a module name: use dotted names like torch or torch.nn")
        if module not in modules:
            modules.append(module)
    return tuple(modules)


def read_preload(values: FlagValues) -> PreloadSettings:
    """``--preload``, checked; none, said once, when the workers are not Python (``--no-python``)."""
    name = values.source("preload")
    modules = parse_preload(values["preload"], name)
    if modules and values["no_python"]:
        log.warning("%s does not apply with --no-python (the program is not started by Python): "
                    "starting workers normally", name)
        return PreloadSettings()
    return PreloadSettings(modules)


FLAGS: FlagGroup[PreloadSettings] = FlagGroup(
    name="preload",
    title="preloading",
    read=read_preload,
    flags=(
        Flag("--preload", default="", underscore=False,
             help="Comma list of modules ('torch', ...) that a template process imports once per node; every "
             "worker, at each start and restart, is forked from it instead of importing them again "
             "(default: none)."),
    ),
)
