"""From the parsed command line to a :class:`~launcher.config.LaunchConfig` and the workers' command.

:mod:`launcher.options` reads the flags as text; :func:`config_from_args` has every flag group
(the core's and the plugins') read and check its own flags, naming the flag or the ``PET_*``
variable a value came from, and builds the config from their settings objects. Every problem is a
:class:`~launcher.errors.UsageError`: one line, exit status 2.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.config import LaunchConfig

if TYPE_CHECKING:  # pragma: no cover
    import argparse

    from launcher.agent.group import Entrypoint
    from launcher.flags import FlagGroup
    from launcher.plugins.manager import LauncherPluginManager
    from launcher.plugins.types import DeviceProvider

__all__ = ["CommandLine", "config_from_args"]


@dataclass
class CommandLine:
    """What the CLI runs: the validated config and each worker's command."""

    config: LaunchConfig
    #: argv of the worker command (``${local_rank}`` substituted per worker); empty for run-path.
    command: list[str]
    #: For ``--run-path``: the script run in-process with runpy, and its arguments.
    run_path: tuple[str, list[str]] | None = None
    #: The provider that counted ``--nproc-per-node`` when it named a device kind.
    device_provider: DeviceProvider | None = None

    def entrypoint(self) -> Entrypoint:
        """What every worker runs: the command, or for ``--run-path`` the script run in-process."""
        from launcher.agent.group import Entrypoint

        if self.run_path is not None:
            from launcher.run_path import run_script

            script, script_args = self.run_path
            return Entrypoint(function=run_script, args=(script, *script_args))
        return Entrypoint(command=self.command)


def config_from_args(args: argparse.Namespace, manager: LauncherPluginManager,
                     environ: Mapping[str, str] | None = None,
                     groups: Sequence[FlagGroup[Any]] | None = None) -> CommandLine:
    """Read every flag group (``groups``: the core's and ``manager``'s plugins') and build the launch's config.

    Raises :class:`UsageError`. Messages name where a value came from: the flag, or its ``PET_*``
    variable. The plugins the config names (beyond the device kind ``--nproc-per-node`` counts)
    are resolved afterwards, by :func:`launcher.plan.build_plan`.
    """
    from launcher.flags import read_groups
    from launcher.options import flag_groups

    env = os.environ if environ is None else environ
    settings = read_groups(args, flag_groups(manager) if groups is None else groups, manager, env)
    config = LaunchConfig.from_settings(
        settings, log_line_prefix_template=env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
    )
    workers = settings["workers"]
    run_path = None if workers.run_path is None else (workers.run_path[0], list(workers.run_path[1]))
    return CommandLine(config=config, command=list(workers.command), run_path=run_path,
                       device_provider=workers.device_provider)
