"""Kubeflow's PyTorchJob without an elastic policy: one pod per node.

The training operator gives every pod ``MASTER_ADDR`` (the master pod's service), ``MASTER_PORT``,
``WORLD_SIZE`` (the number of pods) and ``RANK`` (this pod's index, 0 for the master), the
variables ``torch.distributed`` reads when a pod runs one process. Under the launcher they are
the node count, the node rank and the static rendezvous' endpoint. ``PET_*`` variables (an
elastic PyTorchJob, or ``nprocPerNode``) are flags and win.

A launcher started inside a torchrun/launcher worker also sees ``MASTER_ADDR``, ``RANK`` and
``WORLD_SIZE`` (of the workers): ``LOCAL_RANK`` or ``TORCHELASTIC_RUN_ID`` there mean it is not a
pod's entry point, and ``KUBERNETES_SERVICE_HOST`` (set in every pod) must be present.
"""

from __future__ import annotations

from collections.abc import Mapping

from launcher.clusters.api import ClusterInfo, env_int

_NEEDED = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "KUBERNETES_SERVICE_HOST")


def detect(environ: Mapping[str, str]) -> ClusterInfo | None:
    """A PyTorchJob pod; ``None`` otherwise."""
    if not all(environ.get(name, "").strip() for name in _NEEDED):
        return None
    if "LOCAL_RANK" in environ or "TORCHELASTIC_RUN_ID" in environ:
        return None
    size, rank, port = env_int(environ, "WORLD_SIZE"), env_int(environ, "RANK"), env_int(environ, "MASTER_PORT")
    if size is None or rank is None or port is None or not 0 <= rank < size or not 0 < port <= 65535:
        return None
    master = environ["MASTER_ADDR"].strip()
    sources = {
        "nnodes": "WORLD_SIZE (pods)",
        "node_rank": "RANK (pod index)",
        "master_addr": "MASTER_ADDR",
        "master_port": "MASTER_PORT",
        "run_id": "MASTER_ADDR",
    }
    # With nprocPerNode the operator also sets PET_NNODES/PET_NODE_RANK and WORLD_SIZE counts
    # processes, not pods: report only what stands for pods, so no contradiction is claimed.
    elastic = "PET_NNODES" in environ
    return ClusterInfo(
        scheduler="Kubeflow",
        job=f"PyTorchJob at {master}",
        nnodes=None if elastic else size,
        node_rank=None if elastic else rank,
        master_addr=master,
        master_port=port,
        run_id=f"kubeflow-{master}",
        sources=sources,
    )
