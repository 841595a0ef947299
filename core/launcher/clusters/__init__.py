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

from launcher.clusters.api import ClusterError, ClusterInfo, derived_port

__all__ = ["ClusterError", "ClusterInfo", "derived_port"]
