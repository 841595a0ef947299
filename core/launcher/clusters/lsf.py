"""IBM Spectrum LSF: ``LSB_JOBID`` and the job's hosts.

The hosts come from ``LSB_MCPU_HOSTS`` (``hostA 4 hostB 4``: each host and its slots), else from
``LSB_DJOB_HOSTFILE`` (a file with one line per slot). The node rank is this host's position in
that list, found by its name (LSF knows hosts only by name); the endpoint is the first host, on
a port derived from the job id. Start the launcher once per host (``blaunch``, or ``jsrun``/
``mpirun`` with one rank per host); the slots of this host become ``--nproc-per-node``.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping

from launcher.clusters.api import ClusterInfo, derived_port


def _hosts(environ: Mapping[str, str]) -> tuple[list[tuple[str, int]], str]:
    """``[(host, slots)]`` in the job's order, and the variable they came from."""
    found: dict[str, int] = {}
    text = environ.get("LSB_MCPU_HOSTS", "").split()
    if text:
        for name, slots in zip(text[0::2], text[1::2], strict=False):
            found[name] = found.get(name, 0) + (int(slots) if slots.isdigit() else 1)
        return list(found.items()), "LSB_MCPU_HOSTS"
    path = environ.get("LSB_DJOB_HOSTFILE", "")
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    if line.strip():
                        name = line.split()[0]
                        found[name] = found.get(name, 0) + 1
        except OSError:
            return [], "LSB_DJOB_HOSTFILE"
        return list(found.items()), "LSB_DJOB_HOSTFILE"
    return [], ""


def _short(name: str) -> str:
    return name.split(".")[0].lower()


def detect(environ: Mapping[str, str], hostname: Callable[[], str] = socket.gethostname) -> ClusterInfo | None:
    """An LSF job; ``None`` otherwise."""
    job = environ.get("LSB_JOBID", "").strip()
    if not job:
        return None
    hosts, var = _hosts(environ)
    sources = {"master_port": "LSB_JOBID", "run_id": "LSB_JOBID"}
    port, run_id = derived_port(job), f"lsf-{job}"
    if not hosts:
        return ClusterInfo(scheduler="LSF", job=f"job {job}", master_port=port, run_id=run_id, sources=sources,
                           problem=f"LSF job {job}: neither LSB_MCPU_HOSTS nor LSB_DJOB_HOSTFILE lists the hosts; "
                           "give --nnodes, --node-rank and --master-addr")
    me = hostname()
    names = [name for name, _ in hosts]
    index = next((i for i, name in enumerate(names) if name == me), None)
    if index is None:
        matches = [i for i, name in enumerate(names) if _short(name) == _short(me)]
        index = matches[0] if len(matches) == 1 else None
    sources.update({"nnodes": var, "master_addr": f"{var} (first host)"})
    problem = None
    nproc = None
    if index is None:
        problem = f"LSF job {job}: this host ({me}) is not among the job's hosts ({var}); give --node-rank"
    else:
        sources["node_rank"] = f"{var} (position of {me})"
        nproc = hosts[index][1]
        sources["nproc_per_node"] = f"{var} (slots of {me})"
    return ClusterInfo(
        scheduler="LSF",
        job=f"job {job}",
        nnodes=len(hosts),
        node_rank=index,
        master_addr=names[0] if len(hosts) > 1 else "127.0.0.1",
        master_port=port,
        run_id=run_id,
        nproc_per_node=nproc,
        sources=sources,
        problem=problem,
    )
