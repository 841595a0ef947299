"""Conformance suite for cluster environments (``launcher_cluster_environments``).

A cluster environment's ``detect(environ)`` reads a process environment and returns a
:class:`~launcher.clusters.api.ClusterInfo` for its scheduler's jobs, ``None`` for anything
else. The suite gives it sample jobs (the environment each node's launcher sees) and checks that
every node of a job is detected and derives the same node count, endpoint, run id and rendezvous
backend, with distinct node ranks in range; that environments of no scheduler (and a
torchrun worker's) are not claimed; that detection leaves the environment unchanged and answers
the same twice; and that ``launcher --cluster NAME`` accepts the name.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import ClassVar

import pytest

from launcher.clusters.api import ClusterInfo
from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import ClusterEnvironment, Registration
from launcher.testing.plugin_suite import PluginModuleConformance

__all__ = ["ClusterEnvironmentConformance", "plain_environments"]


def plain_environments() -> list[dict[str, str]]:
    """Environments of no scheduler: empty, a login shell, and a torchrun worker's."""
    shell = {"HOME": "/home/user", "PATH": "/usr/bin:/bin", "USER": "user", "LANG": "C.UTF-8"}
    worker = {
        **shell, "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    }
    return [{}, shell, worker]


class ClusterEnvironmentConformance(PluginModuleConformance):
    """Tests a cluster environment on sample jobs.

    Set ``cluster_environment_name`` (the ``--cluster`` name) and ``jobs``: a list of jobs, each
    the list of environments its launchers see, one per node (a real dump of ``env`` on each node
    is best). ``foreign_environments`` (default :func:`plain_environments`) must not be claimed.
    """

    registration_type: ClassVar[type[Registration]] = ClusterEnvironment
    registration_fixture: ClassVar[str] = "cluster_environment"

    #: The ``--cluster`` name under test.
    cluster_environment_name: ClassVar[str | None] = None
    #: Sample jobs: each a list of the environments of its nodes' launchers.
    jobs: ClassVar[Sequence[Sequence[Mapping[str, str]]]] = ()
    #: Environments that are not this scheduler's.
    foreign_environments: ClassVar[Sequence[Mapping[str, str]] | None] = None

    @pytest.fixture
    def cluster_environment(self, plugin_manager: LauncherPluginManager) -> ClusterEnvironment:
        """The registration under test (default: ``cluster_environment_name`` on the plugin manager)."""
        return self.registration_under_test(plugin_manager, self.cluster_environment_name, ClusterEnvironment)

    def _jobs(self) -> Sequence[Sequence[Mapping[str, str]]]:
        if not self.jobs:
            pytest.fail(f"{type(self).__name__}: give sample jobs in the 'jobs' class attribute")
        return self.jobs

    def _detect(self, reg: ClusterEnvironment, environ: Mapping[str, str], where: str) -> ClusterInfo:
        info = reg.detect(dict(environ))
        assert info is not None, f"{where}: detect() returned None for a {reg.name} job's environment"
        assert isinstance(info, ClusterInfo), f"{where}: detect() returned {type(info).__name__}, not ClusterInfo"
        return info

    def test_every_node_of_a_job_is_detected(self, cluster_environment: ClusterEnvironment) -> None:
        for number, job in enumerate(self._jobs()):
            assert job, f"job {number} has no node"
            for node, environ in enumerate(job):
                info = self._detect(cluster_environment, environ, f"job {number}, node {node}")
                assert info.scheduler.strip(), f"job {number}, node {node}: the scheduler has no name"
                if info.problem is not None:
                    assert info.problem.strip() and "\n" not in info.problem.strip(), (
                        f"job {number}, node {node}: a problem must be one line"
                    )

    def test_nodes_of_a_job_agree(self, cluster_environment: ClusterEnvironment) -> None:
        for number, job in enumerate(self._jobs()):
            infos = [self._detect(cluster_environment, env, f"job {number}, node {n}") for n, env in enumerate(job)]
            shared = [(i.nnodes, i.master_addr, i.master_port, i.run_id, i.backend) for i in infos]
            assert len(set(shared)) == 1, (
                f"job {number}: nodes derive different (nnodes, address, port, run id, backend): {shared}"
            )

    def test_node_ranks_are_distinct_and_in_range(self, cluster_environment: ClusterEnvironment) -> None:
        for number, job in enumerate(self._jobs()):
            infos = [self._detect(cluster_environment, env, f"job {number}, node {n}") for n, env in enumerate(job)]
            ranks = [i.node_rank for i in infos if i.node_rank is not None]
            assert len(ranks) == len(set(ranks)), f"job {number}: two nodes share a node rank: {ranks}"
            for info in infos:
                if info.node_rank is not None and info.nnodes is not None:
                    assert 0 <= info.node_rank < info.nnodes, f"job {number}: node rank {info.node_rank} out of range"
                if info.master_port is not None:
                    assert 0 < info.master_port <= 65535, f"job {number}: port {info.master_port} out of range"
                if info.master_addr is not None:
                    assert info.master_addr.strip() and " " not in info.master_addr, (
                        f"job {number}: address {info.master_addr!r} is not a host"
                    )
                assert info.backend in ("static", "c10d"), f"job {number}: unknown backend {info.backend!r}"

    def test_other_environments_are_not_claimed(self, cluster_environment: ClusterEnvironment) -> None:
        foreign = plain_environments() if self.foreign_environments is None else self.foreign_environments
        for number, environ in enumerate(foreign):
            info = cluster_environment.detect(dict(environ))
            assert info is None, f"foreign environment {number} ({sorted(environ)[:6]}...) was claimed: {info}"

    def test_detection_is_pure(self, cluster_environment: ClusterEnvironment) -> None:
        for job in self._jobs():
            for environ in job:
                before = copy.deepcopy(dict(environ))
                given = dict(environ)
                first = cluster_environment.detect(given)
                assert given == before, "detect() changed the environment it was given"
                assert cluster_environment.detect(dict(environ)) == first, "detect() answered differently twice"

    def test_accepted_by_the_cluster_option(
        self, cluster_environment: ClusterEnvironment, plugin_manager: LauncherPluginManager
    ) -> None:
        from launcher.clusters.apply import detect

        environ = dict(self._jobs()[0][0])
        for name in cluster_environment.names:
            info = detect(name, plugin_manager, environ)
            assert info is not None and info == cluster_environment.detect(environ)
