"""Cluster environments: what a scheduler's variables say about the job (``--cluster``).

Most multi-node jobs are started by a scheduler (Slurm, an MPI launcher, LSF, Kubeflow) that
already knows how many nodes there are and which one this is. A *cluster environment* plugin
reads the process environment and supplies what the command line did not: the number of nodes,
this node's rank, a rendezvous endpoint every node derives identically, a run id and, where the
scheduler says it, the processes per node (:class:`~launcher.clusters.api.ClusterInfo`).
:func:`launcher.clusters.apply.apply_cluster` merges that into the parsed flags; explicit flags
and ``PET_*`` variables always win. See ``docs/clusters/``.

The modules here import only the standard library: detection runs on every launch.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from launcher.clusters.api import ClusterError, ClusterInfo, derived_port

__all__ = ["ClusterError", "ClusterInfo", "derived_port"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: ``--cluster auto`` imports this package on every launch, and where no
    # scheduler is found the records are never needed.
    if name in __all__:
        from launcher.clusters import api

        return getattr(api, name)
    raise AttributeError(f"module 'launcher.clusters' has no attribute {name!r}")
