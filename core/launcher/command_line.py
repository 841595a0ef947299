"""From the parsed command line to the flag groups' settings objects and the workers' command.

:mod:`launcher.options` reads the flags as text; :func:`read_command_line` has every flag group
(the core's and the plugins') read and check its own flags once, naming the flag or the ``PET_*``
variable a value came from. The plan is built from those settings objects
(:meth:`CommandLine.plan`, :func:`launcher.plan.plan_from_settings`); no
:class:`~launcher.config.LaunchConfig` is made on the way. Every problem is a
:class:`~launcher.errors.UsageError`: one line, exit status 2.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import argparse

    from launcher.agent.group import Entrypoint
    from launcher.flags import FlagGroup
    from launcher.plan import LaunchPlan
    from launcher.plugins.manager import LauncherPluginManager

__all__ = ["CommandLine", "read_command_line"]


@dataclass
class CommandLine:
    """What the CLI runs: every flag group's settings object, checked, and what is not a flag."""

    #: Every flag group's settings object by group name, the plugins' included (:func:`launcher.flags.read_groups`).
    settings: dict[str, Any]
    #: ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``; ``None`` gives ``[<role><local_rank>]:``.
    prefix_template: str | None = None

    def entrypoint(self) -> Entrypoint:
        """What every worker runs: the command, or for ``--run-path`` the script run in-process."""
        from launcher.agent.group import Entrypoint

        workers = self.settings["workers"]
        if workers.run_path is not None:
            from launcher.run_path import run_script

            script, script_args = workers.run_path
            return Entrypoint(function=run_script, args=(script, *script_args))
        return Entrypoint(command=list(workers.command))

    def plan(self, manager: LauncherPluginManager) -> LaunchPlan:
        """The launch plan, built from the settings objects (:func:`launcher.plan.plan_from_settings`)."""
        from launcher.plan import plan_from_settings

        return plan_from_settings(self.settings, manager, self.entrypoint(), prefix_template=self.prefix_template)


def read_command_line(args: argparse.Namespace, manager: LauncherPluginManager,
                      environ: Mapping[str, str] | None = None,
                      groups: Sequence[FlagGroup[Any]] | None = None) -> CommandLine:
    """Read every flag group (``groups``: the core's and ``manager``'s plugins'), each value once.

    Raises :class:`UsageError`. Messages name where a value came from: the flag, or its ``PET_*``
    variable. The plugins the settings name (beyond the device kind ``--nproc-per-node`` counts)
    are resolved afterwards, when the plan is built (:meth:`CommandLine.plan`).
    """
    from launcher.flags import read_groups
    from launcher.options import flag_groups

    env = os.environ if environ is None else environ
    settings = read_groups(args, flag_groups(manager) if groups is None else groups, manager, env)
    return CommandLine(settings=settings, prefix_template=env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"))
