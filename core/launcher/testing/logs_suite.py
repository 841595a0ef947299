"""Conformance suite for LogsSpecs (``launcher_logs_specs``).

The agent builds the LogsSpecs once with torchrun's keyword arguments, calls ``reify(envs)`` at
the start of every attempt, opens every destination of the returned LogsDest for appending
(the console, ``os.devnull``, a file, or a line sink), reads each rank's error file when it
fails, and calls ``finish(succeeded)`` (when present) at the end. The suite does the same.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from launcher.config import STD_ALL, STD_ERR, STD_NONE, STD_OUT, StdSpec
from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import LogsSpecsLike, LogsSpecsProvider, Registration, finish_logs
from launcher.testing.plugin_suite import PluginModuleConformance, manager_holding

__all__ = ["LogsSpecsConformance", "worker_envs"]

_STREAMS = ("stdouts", "stderrs", "tee_stdouts", "tee_stderrs", "error_files")


def worker_envs(
    nproc: int,
    *,
    run_id: str = "conformance",
    restart_count: int = 0,
    role: str = "default",
    group_rank: int = 0,
    group_world_size: int = 1,
) -> dict[int, dict[str, str]]:
    """The environments ``reify`` receives: torchrun's worker variables, per local rank."""
    world = nproc * group_world_size
    return {
        local_rank: {
            "LOCAL_RANK": str(local_rank),
            "RANK": str(group_rank * nproc + local_rank),
            "GROUP_RANK": str(group_rank),
            "ROLE_RANK": str(group_rank * nproc + local_rank),
            "ROLE_NAME": role,
            "LOCAL_WORLD_SIZE": str(nproc),
            "WORLD_SIZE": str(world),
            "GROUP_WORLD_SIZE": str(group_world_size),
            "ROLE_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": "3",
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
        for local_rank in range(nproc)
    }


class LogsSpecsConformance(PluginModuleConformance):
    """Tests a LogsSpecs the way the agent uses it.

    Set ``logs_specs_name`` (the ``--logs-specs`` name) or override the ``logs_specs_provider``
    fixture. ``nproc`` is the number of local ranks reified (default 3); ``std_settings`` the
    ``(redirects, tee)`` pairs the class is built with (default: none, both streams redirected,
    both tee'd, and per-rank settings).
    """

    registration_type: ClassVar[type[Registration]] = LogsSpecsProvider
    registration_fixture: ClassVar[str] = "logs_specs_provider"

    #: The ``--logs-specs`` name under test.
    logs_specs_name: ClassVar[str | None] = None
    #: Local ranks per reified attempt.
    nproc: ClassVar[int] = 3
    #: ``(redirects, tee)`` pairs the class is built with.
    std_settings: ClassVar[tuple[tuple[StdSpec, StdSpec], ...]] = (
        (STD_NONE, STD_NONE),
        (STD_ALL, STD_NONE),
        (STD_NONE, STD_ALL),
        ({0: STD_OUT, 1: STD_ERR}, {2: STD_ALL}),
    )

    @pytest.fixture
    def logs_specs_provider(self, plugin_manager: LauncherPluginManager) -> LogsSpecsProvider:
        """The registration under test (default: ``logs_specs_name`` on the plugin manager)."""
        return self.registration_under_test(plugin_manager, self.logs_specs_name, LogsSpecsProvider)

    def build(
        self,
        provider: LogsSpecsProvider,
        log_dir: str | None,
        redirects: StdSpec = STD_NONE,
        tee: StdSpec = STD_NONE,
        local_ranks_filter: set[int] | None = None,
    ) -> LogsSpecsLike:
        """The LogsSpecs instance, built by the core's own code for ``--logs-specs``."""
        from launcher.logs.select import create_logs_specs

        manager = manager_holding(provider)
        config = SimpleNamespace(
            logs_specs=provider.name,
            log_dir=log_dir,
            redirects=redirects,
            tee=tee,
            local_ranks_filter=local_ranks_filter,
        )
        return create_logs_specs(config, manager)  # type: ignore[arg-type]

    def check_dest(self, dest: Any, envs: dict[int, dict[str, str]], where: str) -> None:
        """Every destination of ``dest`` is of a kind the agent can open, and opens."""
        from launcher.logs.pump import open_log
        from launcher.logs.sink import SinkDestination

        for name in _STREAMS:
            mapping = getattr(dest, name, None)
            assert isinstance(mapping, dict), f"{where}: LogsDest.{name} must be a dict of local rank to path"
            assert set(mapping) <= set(envs), (
                f"{where}: LogsDest.{name} names ranks {sorted(mapping)}, not all among {sorted(envs)}"
            )
        for name in ("filtered_stdout", "filtered_stderr"):
            assert isinstance(getattr(dest, name, ""), str), f"{where}: LogsDest.{name} must be a str"
        for rank in envs:
            for name in ("stdouts", "stderrs"):
                target = getattr(dest, name).get(rank, "")
                assert isinstance(target, str), f"{where}: {name}[{rank}] = {target!r}"
                if target in ("", os.devnull):
                    continue
                handle: Any = open_log(target)  # what the agent does for each worker stream
                try:
                    if isinstance(target, SinkDestination):
                        handle.write_lines(b"conformance line\n", time.time())
                    else:
                        handle.write(b"conformance line\n")
                    handle.flush()
                finally:
                    handle.close()
            error_file = dest.error_files.get(rank, "")
            assert isinstance(error_file, str), f"{where}: error_files[{rank}] = {error_file!r}"
            given = envs[rank].get("TORCHELASTIC_ERROR_FILE", "")
            if given:
                assert error_file == given, (
                    f"{where}: rank {rank} writes its error to {given!r} but the agent would read {error_file!r}"
                )
                assert os.path.isdir(os.path.dirname(given) or "."), f"{where}: {given!r} is in no directory"

    def test_builds_and_reifies(self, logs_specs_provider: LogsSpecsProvider, tmp_path: Path) -> None:
        for index, (redirects, tee) in enumerate(self.std_settings):
            where = f"redirects={redirects!r} tee={tee!r}"
            specs = self.build(logs_specs_provider, str(tmp_path / f"logs{index}"), redirects, tee)
            envs = worker_envs(self.nproc)
            self.check_dest(specs.reify(envs), envs, where)
            assert isinstance(specs.root_log_dir, str)
            finish_logs(specs, True)

    def test_every_attempt(self, logs_specs_provider: LogsSpecsProvider, tmp_path: Path) -> None:
        specs = self.build(logs_specs_provider, str(tmp_path / "logs"), STD_ALL, STD_ERR)
        for attempt in range(3):
            envs = worker_envs(self.nproc, restart_count=attempt)
            self.check_dest(specs.reify(envs), envs, f"attempt {attempt}")
        finish_logs(specs, False)

    def test_without_log_dir(self, logs_specs_provider: LogsSpecsProvider) -> None:
        # The agent builds it with log_dir=None when --log-dir is not given. A LogsSpecs that
        # needs a directory refuses in its constructor (ValueError): one line, before any worker.
        from launcher.errors import UsageError

        try:
            specs = self.build(logs_specs_provider, None)
        except UsageError as exc:
            assert len(str(exc).strip().splitlines()) == 1, "the error must be one line"
            return
        envs = worker_envs(1)
        self.check_dest(specs.reify(envs), envs, "log_dir=None")
        finish_logs(specs, True)

    def test_local_ranks_filter(self, logs_specs_provider: LogsSpecsProvider, tmp_path: Path) -> None:
        specs = self.build(logs_specs_provider, str(tmp_path / "logs"), STD_NONE, STD_ALL, {0})
        envs = worker_envs(self.nproc)
        self.check_dest(specs.reify(envs), envs, "local_ranks_filter={0}")
        finish_logs(specs, True)
