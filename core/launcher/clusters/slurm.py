"""Slurm: ``srun`` steps, a batch script run directly, and ``salloc``.

The launcher must run once per node: ``srun --ntasks-per-node=1`` (or ``-n NNODES
--ntasks-per-node=1`` inside an allocation that asked for more tasks per node). What each case
sees (see ``docs/clusters/slurm.md``):

- an ``srun`` step: ``SLURM_STEP_ID``, ``SLURM_NODEID`` (the node's index in the step),
  ``SLURM_STEP_NUM_NODES``, ``SLURM_STEP_NODELIST``, ``SLURM_STEP_TASKS_PER_NODE``;
- a batch script, run on the first node only: ``SLURM_NODEID=0`` but no ``SLURM_STEP_ID``;
- ``salloc``: job-level variables only.

The endpoint is the step's first node (node rank 0 of the static rendezvous) on a port derived
from the job id. A node name that does not resolve (virtual nodes, a test cluster) falls back to
``SLURM_LAUNCH_NODE_IPADDR``, the address ``srun`` ran from: inside a batch script that is the
job's first node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from launcher.clusters.api import ClusterInfo, derived_port, env_int, resolves
from launcher.clusters.hostlist import HostListError, expand_counts, expand_hostlist

Resolver = Callable[[str], bool]


def job_id(environ: Mapping[str, str]) -> str | None:
    """The Slurm job id, or ``None`` outside a Slurm job."""
    value = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    return value.strip() if value and value.strip() else None


def step_id(environ: Mapping[str, str]) -> str | None:
    """The step id inside an ``srun`` step, ``None`` in a batch script or ``salloc``."""
    value = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")
    return value.strip() if value and value.strip() else None


def endpoint(environ: Mapping[str, str], resolve: Resolver = resolves) -> tuple[str | None, dict[str, str], str | None]:
    """The rendezvous host every node of the step derives: ``(host, sources, problem)``."""
    in_step = step_id(environ) is not None
    var = "SLURM_STEP_NODELIST" if in_step and environ.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
    nodelist = environ.get(var) or environ.get("SLURM_NODELIST", "")
    try:
        hosts = expand_hostlist(nodelist)
    except HostListError as exc:
        return None, {}, f"Slurm: cannot read the node list {var}={nodelist!r}: {exc}; give --master-addr"
    if not hosts:
        return None, {}, f"Slurm: {var} is empty; give --master-addr"
    first = hosts[0]
    if resolve(first):
        return first, {"master_addr": f"{var} (first node)"}, None
    launch = environ.get("SLURM_LAUNCH_NODE_IPADDR", "").strip()
    if launch:
        return launch, {"master_addr": f"SLURM_LAUNCH_NODE_IPADDR ({first} does not resolve)"}, None
    return None, {}, f"Slurm: the first node {first!r} of {var} does not resolve here; give --master-addr"


def detect(environ: Mapping[str, str], resolve: Resolver = resolves) -> ClusterInfo | None:
    """What a Slurm job's environment says; ``None`` outside Slurm."""
    job = job_id(environ)
    if job is None:
        return None
    step = step_id(environ)
    port = derived_port(job)
    sources = {"master_port": "SLURM_JOB_ID", "run_id": "SLURM_JOB_ID"}
    run_id = f"slurm-{job}" if step is None else f"slurm-{job}.{step}"
    if step is not None:
        nnodes = env_int(environ, "SLURM_STEP_NUM_NODES") or env_int(environ, "SLURM_NNODES")
        sources["nnodes"] = "SLURM_STEP_NUM_NODES" if environ.get("SLURM_STEP_NUM_NODES") else "SLURM_NNODES"
        node_rank = env_int(environ, "SLURM_NODEID")
        sources["node_rank"] = "SLURM_NODEID"
        tasks_var = "SLURM_STEP_TASKS_PER_NODE" if environ.get("SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
        try:
            tasks = expand_counts(environ.get(tasks_var, ""))
        except HostListError:
            tasks = []
        here = tasks[node_rank] if node_rank is not None and node_rank < len(tasks) else 1
        if here > 1:
            node = environ.get("SLURMD_NODENAME") or f"node {node_rank}"
            message = (
                f"Slurm job {job}: srun started {here} launchers on {node} ({tasks_var}="
                f"{environ.get(tasks_var)}); the launcher starts the workers of its node itself: run it once "
                f"per node, srun --nodes={nnodes} --ntasks={nnodes} --ntasks-per-node=1 launcher "
                "--nproc-per-node=N ..."
            )
            return ClusterInfo(scheduler="Slurm", job=f"job {job}", nnodes=nnodes, master_port=port,
                               run_id=run_id, sources=sources, problem=message)
        nproc = None
    else:
        nnodes = env_int(environ, "SLURM_JOB_NUM_NODES") or env_int(environ, "SLURM_NNODES")
        sources["nnodes"] = "SLURM_JOB_NUM_NODES" if environ.get("SLURM_JOB_NUM_NODES") else "SLURM_NNODES"
        nproc = env_int(environ, "SLURM_NTASKS_PER_NODE") or None
        if nproc:
            sources["nproc_per_node"] = "SLURM_NTASKS_PER_NODE"
        if nnodes is not None and nnodes > 1:
            where = "a batch script" if "SLURM_NODEID" in environ else "salloc"
            message = (
                f"Slurm job {job} has {nnodes} nodes, but {where} runs the launcher on one of them only: start "
                f"it on every node with srun --nodes={nnodes} --ntasks={nnodes} --ntasks-per-node=1 launcher ..."
            )
            return ClusterInfo(scheduler="Slurm", job=f"job {job}", nnodes=nnodes, master_port=port,
                               run_id=run_id, nproc_per_node=nproc, sources=sources, problem=message)
        node_rank = 0
        sources["node_rank"] = "a one-node job"
    host: str | None
    problem: str | None = None
    if nnodes == 1:
        host = "127.0.0.1"
        sources["master_addr"] = "a one-node job"
    else:
        host, host_sources, problem = endpoint(environ, resolve)
        sources.update(host_sources)
    return ClusterInfo(
        scheduler="Slurm",
        job=f"job {job}",
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=host,
        master_port=port,
        run_id=run_id,
        nproc_per_node=nproc,
        sources=sources,
        problem=problem,
    )
