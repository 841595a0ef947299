"""MPI launchers: Open MPI (``OMPI_COMM_WORLD_*``), MPICH / Intel MPI / PMI (``PMI_RANK``), PMIx.

Start one launcher per node (``mpirun --map-by ppr:1:node``, ``-npernode 1``, ``-ppn 1``): each
MPI rank is then one node, ``nnodes`` the world size and the node rank the world rank. Several
ranks on one host (a local size above 1) would start workers that share devices, so that stops
with a line saying how to call it.

The rendezvous host is not in an MPI rank's environment. What this module uses:

- inside a Slurm job (``mpirun`` in an allocation, ``srun --mpi=pmi2``): the Slurm endpoint,
  the job's first node on a port derived from the Slurm job id;
- Open MPI alone: the host that ran ``mpirun`` (the first ``tcp://`` address of
  ``OMPI_MCA_orte_hnp_uri``), on a port derived from the Open MPI job id, with the **c10d**
  rendezvous: whichever launcher runs on that host serves the store, whatever its MPI rank. Its
  limit: ``mpirun`` must run on one of the job's nodes;
- MPICH alone: nothing; give ``--rdzv-endpoint HOST:PORT`` (c10d) or ``--master-addr`` (static).
  A Hydra rank sees ``PMI_RANK``, ``PMI_SIZE``, ``PMI_FD``, ``MPI_LOCALNRANKS``, ``MPI_LOCALRANKID``
  and its own host (``MPIR_CVAR_CH3_INTERFACE_HOSTNAME``): rank 0's host would take the PMI
  protocol over ``PMI_FD``, which the launcher does not speak.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from launcher.clusters import slurm
from launcher.clusters.api import ClusterInfo, derived_port, env_int, resolves

Resolver = Callable[[str], bool]


def _hnp_host(uri: str) -> str | None:
    """The first IPv4 address of an Open MPI contact URI ``JOBID.VPID;tcp://A,B:PORT;tcp6://...``."""
    for part in uri.split(";")[1:]:
        if part.startswith("tcp://"):
            addresses, _, _port = part[len("tcp://"):].rpartition(":")
            first = addresses.split(",")[0].strip()
            if first:
                return first
    return None


def _world(
    environ: Mapping[str, str],
    scheduler: str,
    rank_var: str,
    size_var: str | None,
    local_size_var: str | None,
    resolve: Resolver,
) -> ClusterInfo:
    """The parts every MPI flavour shares: ranks, the once-per-node check, the Slurm endpoint."""
    rank = env_int(environ, rank_var)
    size = env_int(environ, size_var) if size_var else None
    sources: dict[str, str] = {"node_rank": rank_var}
    if size is None and slurm.job_id(environ) and slurm.step_id(environ):
        size = env_int(environ, "SLURM_STEP_NUM_TASKS") or env_int(environ, "SLURM_NTASKS")
        size_var = "SLURM_STEP_NUM_TASKS"
    if size is not None:
        sources["nnodes"] = f"{size_var} (one node per MPI rank)"
    local = env_int(environ, local_size_var) if local_size_var else None
    job = slurm.job_id(environ)
    label = f"job {job}" if job else ""
    if local is not None and local > 1:
        message = (
            f"{scheduler}: {local} launchers were started on this host ({local_size_var}={local}); the launcher "
            "starts the workers of its node itself: start one per node (mpirun --map-by ppr:1:node, "
            "-npernode 1, or -ppn 1) with --nproc-per-node=N"
        )
        return ClusterInfo(scheduler=scheduler, job=label, nnodes=size, backend="c10d", sources=sources,
                           problem=message)
    if rank is not None and size is not None and not 0 <= rank < size:
        message = f"{scheduler}: {rank_var}={rank} is outside 0..{size - 1} ({size_var})"
        return ClusterInfo(scheduler=scheduler, job=label, backend="c10d", sources=sources, problem=message)
    host: str | None = None
    port: int | None = None
    run_id: str | None = None
    problem: str | None = None
    if job:
        # MPI inside Slurm: ranks from MPI (Slurm's describe the MPI daemons), endpoint from Slurm.
        host, host_sources, problem = slurm.endpoint(environ, resolve)
        sources.update(host_sources)
        port, run_id = derived_port(job), f"slurm-{job}"
        sources["master_port"] = sources["run_id"] = "SLURM_JOB_ID"
    return ClusterInfo(
        scheduler=scheduler,
        job=label,
        nnodes=size,
        node_rank=rank,
        master_addr=host if size != 1 else "127.0.0.1",
        master_port=port,
        run_id=run_id,
        backend="c10d",
        sources=sources,
        problem=problem,
    )


def detect_openmpi(environ: Mapping[str, str], resolve: Resolver = resolves) -> ClusterInfo | None:
    """An Open MPI rank (``mpirun``/``mpiexec`` of Open MPI); ``None`` otherwise."""
    if "OMPI_COMM_WORLD_RANK" not in environ:
        return None
    info = _world(environ, "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  "OMPI_COMM_WORLD_LOCAL_SIZE", resolve)
    if info.problem or slurm.job_id(environ) or info.nnodes == 1:
        return info
    jobid = environ.get("OMPI_MCA_ess_base_jobid", "").strip() or environ.get("PMIX_NAMESPACE", "").strip()
    host = _hnp_host(environ.get("OMPI_MCA_orte_hnp_uri", ""))
    sources = dict(info.sources)
    problem = None
    if host is None:
        problem = "Open MPI: OMPI_MCA_orte_hnp_uri names no mpirun host; give --rdzv-endpoint HOST:PORT"
    else:
        sources["master_addr"] = "OMPI_MCA_orte_hnp_uri (the host that ran mpirun)"
    if jobid:
        sources["master_port"] = sources["run_id"] = "OMPI_MCA_ess_base_jobid"
    return ClusterInfo(
        scheduler="Open MPI",
        job=f"job {jobid}" if jobid else "",
        nnodes=info.nnodes,
        node_rank=info.node_rank,
        master_addr=host,
        master_port=derived_port(jobid) if jobid else None,
        run_id=f"ompi-{jobid}" if jobid else None,
        backend="c10d",
        sources=sources,
        problem=problem,
    )


def detect_mpich(environ: Mapping[str, str], resolve: Resolver = resolves) -> ClusterInfo | None:
    """An MPICH, Intel MPI or other PMI-1/PMI-2 rank (``PMI_RANK``, ``PMI_SIZE``); ``None`` otherwise."""
    if "PMI_RANK" not in environ or "OMPI_COMM_WORLD_RANK" in environ:
        return None
    local_var = "MPI_LOCALNRANKS" if "MPI_LOCALNRANKS" in environ else None
    info = _world(environ, "MPI (PMI)", "PMI_RANK", "PMI_SIZE", local_var, resolve)
    if local_var is None and slurm.job_id(environ):
        # srun --mpi=pmi2 says nothing of ranks per node: Slurm's step does.
        tasks = slurm.detect(environ, resolve)
        if tasks is not None and tasks.problem and "launchers on" in tasks.problem:
            return ClusterInfo(scheduler=info.scheduler, job=info.job, nnodes=info.nnodes, backend="c10d",
                               sources=info.sources, problem=tasks.problem)
    if info.problem or info.master_addr or info.nnodes == 1:
        return info
    return ClusterInfo(
        scheduler=info.scheduler, job=info.job, nnodes=info.nnodes, node_rank=info.node_rank, backend="c10d",
        sources=info.sources,
        problem="MPI (PMI): the environment does not say where to meet; give --rdzv-endpoint HOST:PORT (a host "
        "that runs one of the launchers) or --master-addr HOST (the host of PMI rank 0)",
    )


def detect_pmix(environ: Mapping[str, str], resolve: Resolver = resolves) -> ClusterInfo | None:
    """A PMIx rank that is not Open MPI's (``srun --mpi=pmix``, ``prterun``); ``None`` otherwise.

    PMIx puts only the rank and namespace in the environment: the size comes from Slurm, or
    from ``--nnodes``.
    """
    if "PMIX_RANK" not in environ or "OMPI_COMM_WORLD_RANK" in environ:
        return None
    info = _world(environ, "PMIx", "PMIX_RANK", None, None, resolve)
    if slurm.job_id(environ):
        tasks = slurm.detect(environ, resolve)
        if tasks is not None and tasks.problem and "launchers on" in tasks.problem:
            return ClusterInfo(scheduler="PMIx", job=info.job, nnodes=info.nnodes, backend="c10d",
                               sources=info.sources, problem=tasks.problem)
    if info.problem or info.master_addr:
        return info
    namespace = environ.get("PMIX_NAMESPACE", "").strip()
    sources = dict(info.sources)
    if namespace:
        sources["run_id"] = "PMIX_NAMESPACE"
    return ClusterInfo(
        scheduler="PMIx", job=f"namespace {namespace}" if namespace else "", nnodes=info.nnodes,
        node_rank=info.node_rank if info.nnodes else None, run_id=f"pmix-{namespace}" if namespace else None,
        backend="c10d", sources=sources,
        problem="PMIx: the environment gives neither the number of ranks nor where to meet; give --nnodes N and "
        "--rdzv-endpoint HOST:PORT",
    )
