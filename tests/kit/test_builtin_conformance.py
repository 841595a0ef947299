"""The core's built-in plugins against launcher.testing's suites for their kinds.

The built-ins register through the same entry-point group as a third party's plugins, so they
are held to the same contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from launcher.testing import (
    ClusterEnvironmentConformance,
    DeviceProviderConformance,
    EventHandlerConformance,
    LogsSpecsConformance,
    NumaStrategyConformance,
)


class TestDefaultLogsSpecs(LogsSpecsConformance):
    logs_specs_name = "default"


class TestNullEventHandler(EventHandlerConformance):
    event_handler_name = "null"


class TestConsoleEventHandler(EventHandlerConformance):
    event_handler_name = "console"


class TestJsonlEventHandler(EventHandlerConformance):
    event_handler_name = "jsonl"

    @pytest.fixture
    def sink_environ(self, tmp_path: Path) -> Mapping[str, str]:
        return {"LAUNCHER_EVENTS_FILE": str(tmp_path / "events" / "{run_id}-{node}.jsonl")}


class TestNodeStrategy(NumaStrategyConformance):
    numa_strategy_name = "node"


class TestSocketStrategy(NumaStrategyConformance):
    numa_strategy_name = "socket"


class TestExclusiveStrategy(NumaStrategyConformance):
    numa_strategy_name = "exclusive"


class TestCoreComplexStrategy(NumaStrategyConformance):
    numa_strategy_name = "core-complex"


class TestCpuDevices(DeviceProviderConformance):
    device_provider_name = "cpu"


class TestCudaDevices(DeviceProviderConformance):
    device_provider_name = "cuda"


class TestXpuDevices(DeviceProviderConformance):
    device_provider_name = "xpu"


class TestAutoDevices(DeviceProviderConformance):
    device_provider_name = "auto"


class TestPrivateuse1Devices(DeviceProviderConformance):
    device_provider_name = "privateuse1"


# The built-in cluster environments on environments captured from real schedulers
# (tests/clusters/data) and, for LSF and Kubeflow, their documented variables.
from tests.clusters.samples import dump, kubeflow_job, lsf_job  # noqa: E402


class TestOpenMpiCluster(ClusterEnvironmentConformance):
    cluster_environment_name = "openmpi"
    jobs = [dump("openmpi-two-nodes"), dump("openmpi-in-salloc-two-per-node")]
    foreign_environments = [dump("slurm-batch-srun")[0], dump("mpich-two-nodes")[0], kubeflow_job()[0]]


class TestMpichCluster(ClusterEnvironmentConformance):
    cluster_environment_name = "mpich"
    jobs = [dump("mpich-two-nodes"), dump("slurm-srun-pmi2")]
    foreign_environments = [dump("slurm-batch-srun")[0], dump("openmpi-two-nodes")[0], lsf_job()[0]]


class TestPmixCluster(ClusterEnvironmentConformance):
    cluster_environment_name = "pmix"
    jobs = [[{**env, "PMIX_RANK": env["SLURM_PROCID"], "PMIX_NAMESPACE": "slurm.pmix.9.0"}
             for env in dump("slurm-srun-one-task-per-node")]]
    foreign_environments = [dump("openmpi-two-nodes")[0], dump("slurm-batch-srun")[0]]


class TestSlurmCluster(ClusterEnvironmentConformance):
    cluster_environment_name = "slurm"
    jobs = [dump("slurm-batch-srun"), dump("slurm-srun-one-task-per-node"), dump("slurm-srun-two-tasks-per-node"),
            dump("slurm-salloc"), dump("slurm-batch-direct")]
    foreign_environments = [dump("openmpi-two-nodes")[0], dump("mpich-two-nodes")[0], lsf_job()[0], kubeflow_job()[0]]


class TestLsfCluster(ClusterEnvironmentConformance):
    cluster_environment_name = "lsf"
    jobs = [lsf_job()]
    foreign_environments = [dump("slurm-batch-srun")[0], kubeflow_job()[0]]


class TestKubeflowCluster(ClusterEnvironmentConformance):
    cluster_environment_name = "kubeflow"
    jobs = [kubeflow_job(2), kubeflow_job(4)]
    foreign_environments = [dump("slurm-batch-srun")[0], dump("openmpi-two-nodes")[0], lsf_job()[0]]
