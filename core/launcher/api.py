"""The Python API: run a function or a command on the local worker group.

Example::

    from launcher import LaunchConfig, launch

    def train(scale):
        import os
        return int(os.environ["RANK"]) * scale

    if __name__ == "__main__":
        results = launch(LaunchConfig(nproc_per_node=4), train)(10)
        assert results == {0: 0, 1: 10, 2: 20, 3: 30}

Callables run in new processes started with ``LaunchConfig.start_method``; with ``spawn`` (the
default) they must be importable (defined at module level). A string entrypoint is a program:
``launch(config, "/usr/bin/env")("python", "train.py")`` runs ``/usr/bin/env python train.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from launcher.config import LaunchConfig
from launcher.errors import LaunchError

__all__ = ["LaunchConfig", "WorkerFailedError", "launch"]


class WorkerFailedError(LaunchError):
    """Workers failed; ``failures`` holds every failure, earliest (the root cause) first."""

    def __init__(self, message: str, failures: list[Any], report: Any) -> None:
        super().__init__(message)
        self.failures = failures
        self.report = report


def launch(config: LaunchConfig, entrypoint: Callable[..., Any] | str) -> Callable[..., dict[int, Any]]:
    """Return a callable that runs ``entrypoint(*args)`` on every local worker.

    It returns the return value of each worker by global rank (``None`` for commands), and raises
    :class:`WorkerFailedError` when the job fails after its restarts.
    """

    def run(*args: Any) -> dict[int, Any]:
        from launcher.agent.agent import Agent
        from launcher.agent.group import Entrypoint
        from launcher.console import ensure_console_logging
        from launcher.plan import build_plan
        from launcher.plugins.manager import get_plugin_manager

        # The same notices, in the same format, as the command line prints (OMP_NUM_THREADS...).
        ensure_console_logging()

        if isinstance(entrypoint, str):
            entry = Entrypoint(command=[entrypoint, *map(str, args)])
        else:
            entry = Entrypoint(function=entrypoint, args=args)
        # Every check of the command line, before anything starts (a UsageError).
        plan = build_plan(config, get_plugin_manager(), entry)
        result = Agent(plan).run()
        if result.exit_code != 0:
            if result.report is not None:
                raise WorkerFailedError(result.report.render(), result.failures, result.report)
            raise LaunchError(result.message or f"the job failed with exit code {result.exit_code}")
        if isinstance(entrypoint, str):
            return dict.fromkeys(range(config.nproc_per_node))
        return result.return_values

    return run
