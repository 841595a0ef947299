"""Built-in cluster environments: Open MPI, MPICH/PMI, PMIx, Slurm, LSF and Kubeflow.

The detectors are in :mod:`launcher.clusters` (standard library only); ``--cluster auto`` tries
them in priority order, MPI first, since an MPI rank inside a Slurm job sees both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from launcher.plugins import hookimpl
from launcher.plugins.types import ClusterEnvironment

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from launcher.clusters.api import ClusterInfo


def _lazy(module: str, function: str) -> Callable[[Mapping[str, str]], ClusterInfo | None]:
    def detect(environ: Mapping[str, str]) -> ClusterInfo | None:
        import importlib

        found: ClusterInfo | None = getattr(importlib.import_module(f"launcher.clusters.{module}"), function)(environ)
        return found

    return detect


@hookimpl
def launcher_cluster_environments() -> Iterator[ClusterEnvironment]:
    yield ClusterEnvironment(
        name="openmpi", aliases=("ompi",), priority=10, variables=("OMPI_COMM_WORLD_RANK",),
        description="Open MPI ranks (OMPI_COMM_WORLD_*), one launcher per node",
        detect=_lazy("mpi", "detect_openmpi"),
    )
    yield ClusterEnvironment(
        name="mpich", aliases=("pmi", "intel-mpi"), priority=11, variables=("PMI_RANK", "PMI_SIZE"),
        description="MPICH, Intel MPI and PMI ranks (PMI_RANK, PMI_SIZE), one launcher per node",
        detect=_lazy("mpi", "detect_mpich"),
    )
    yield ClusterEnvironment(
        name="pmix", priority=12, variables=("PMIX_RANK",),
        description="PMIx ranks (PMIX_RANK) that are not Open MPI's, one launcher per node",
        detect=_lazy("mpi", "detect_pmix"),
    )
    yield ClusterEnvironment(
        name="slurm", priority=20, variables=("SLURM_JOB_ID",),
        description="Slurm jobs: srun steps (one task per node), batch scripts, salloc",
        detect=_lazy("slurm", "detect"),
    )
    yield ClusterEnvironment(
        name="lsf", priority=30, variables=("LSB_JOBID",),
        description="IBM Spectrum LSF jobs (LSB_JOBID, LSB_MCPU_HOSTS or LSB_DJOB_HOSTFILE)",
        detect=_lazy("lsf", "detect"),
    )
    yield ClusterEnvironment(
        name="kubeflow", aliases=("pytorchjob",), priority=40,
        variables=("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"),
        description="Kubeflow PyTorchJob pods (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK)",
        detect=_lazy("kubeflow", "detect"),
    )
