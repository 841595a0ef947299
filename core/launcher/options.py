"""The command line: the core's flag groups in torchrun's order, the parser, and the launcher's own switches.

Each capability declares its flags in its own settings module (a :class:`~launcher.flags.FlagGroup`);
:func:`core_groups` lists them, and a plugin's groups (its ``launcher_flag_groups`` hook) follow.
The parser only reads text; each group's ``read`` turns it into a checked settings object
(:func:`launcher.command_line.read_command_line`). Any error is a :class:`~launcher.errors.UsageError`:
one line, exit status 2, no traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from launcher.errors import UsageError
from launcher.flags import USAGE_LINE, FlagGroup, _Parser, check_groups, switch_value
from launcher.flags import build_parser as _build_parser
from launcher.values import quote

if TYPE_CHECKING:  # pragma: no cover
    from launcher.plugins.manager import LauncherPluginManager

__all__ = ["USAGE_LINE", "build_parser", "check_environment", "core_groups", "flag_groups", "parse_args",
           "switch_value"]

DESCRIPTION = ("Start a distributed PyTorch job: a drop-in replacement for torchrun. "
               "'launcher plugins [--json]' lists installed plugins.")


def core_groups() -> tuple[FlagGroup[Any], ...]:
    """The core's flag groups, in the order of torchrun's first flag in each (``--help`` shows them so)."""
    from launcher.agent import settings as workers
    from launcher.clusters import apply as clusters
    from launcher.devices import settings as numa
    from launcher.events import settings as events
    from launcher.hangs import settings as hangs
    from launcher.health import settings as health
    from launcher.logs import settings as logs
    from launcher.preemption import settings as preemption
    from launcher.recovery import settings as recovery
    from launcher.rendezvous import settings as rendezvous
    from launcher.status import settings as status
    from launcher.stragglers import settings as stragglers
    from launcher.topology import settings as topology

    return (rendezvous.FLAGS, workers.FLAGS, events.FLAGS, logs.FLAGS, numa.FLAGS, hangs.FLAGS,
            health.FLAGS, stragglers.FLAGS, status.FLAGS, preemption.FLAGS, recovery.FLAGS, workers.PRELOAD_FLAGS,
            workers.PROGRESS_FLAGS, clusters.FLAGS, topology.FLAGS)


def flag_groups(manager: LauncherPluginManager | None = None) -> tuple[FlagGroup[Any], ...]:
    """The core's groups, then every loaded plugin's (``launcher_flag_groups``), collected the same way."""
    if manager is None:
        return core_groups()
    groups = (*core_groups(), *manager.flag_groups())
    try:
        check_groups(groups)
    except ValueError as exc:  # a plugin's flag clashes with one of ours or another plugin's
        from launcher.plugins.errors import PluginConflictError

        raise PluginConflictError(f"{exc}: uninstall one, or block one with LAUNCHER_BLOCK_PLUGINS") from None
    return groups


def check_environment(environ: Mapping[str, str]) -> bool:
    """Check the launcher's own environment switches; return whether plugins autoload.

    ``LOGLEVEL`` must name a log level and ``LAUNCHER_DISABLE_PLUGIN_AUTOLOAD`` be a switch value:
    a typo there would otherwise be read silently as the default.
    """
    from launcher.console import LOG_LEVELS

    level = environ.get("LOGLEVEL")
    if level is not None and level.strip() and level.strip().upper() not in LOG_LEVELS:
        raise UsageError(
            f"LOGLEVEL={quote(level)} is not a log level: use DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    disable = environ.get("LAUNCHER_DISABLE_PLUGIN_AUTOLOAD")
    return disable is None or not switch_value("LAUNCHER_DISABLE_PLUGIN_AUTOLOAD", disable)


def build_parser(groups: Sequence[FlagGroup[Any]] | None = None) -> _Parser:
    """The argument parser for ``groups`` (the core's by default): torchrun 2.13's flags and defaults, and ours."""
    from launcher import __version__

    return _build_parser(core_groups() if groups is None else groups, description=DESCRIPTION,
                         version=f"launcher {__version__}")


def parse_args(argv: Sequence[str], groups: Sequence[FlagGroup[Any]] | None = None) -> argparse.Namespace:
    """Parse ``argv`` (without the program name) with ``groups`` (the core's by default)."""
    return build_parser(groups).parse_args(list(argv))
