"""``--cluster``: fill the flags the command line left out from the scheduler's environment.

Explicit flags and ``PET_*`` variables always win; the environment only fills what is missing.
A flag that contradicts the environment (``--nnodes 2`` in a 4-node allocation) is kept, with a
warning naming both values. ``--cluster none`` (or ``--standalone``) leaves the flags exactly as
torchrun would read them. The agent prints one line saying what it took from where.

The flag itself is declared here too (:data:`FLAGS`), beside the code that reads it.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.plugins.manager import LauncherPluginManager
from launcher.plugins.types import ClusterEnvironment

if TYPE_CHECKING:  # pragma: no cover
    from launcher.clusters.api import ClusterInfo

# The rendezvous logger: its INFO lines are shown by default (cli._setup_logging).
log = logging.getLogger("launcher.rendezvous.cluster")

#: The flags a cluster environment may fill (argparse dests).
FILLABLE = ("nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "node_rank",
            "master_addr", "master_port", "standalone")
_WHAT = {
    "nnodes": "nodes", "node_rank": "node rank", "master_addr": "address", "master_port": "port",
    "run_id": "run id", "nproc_per_node": "processes per node",
}


class ClusterSettings(NamedTuple):
    """``auto``, ``none`` or a cluster environment's name (checked when the environment is detected)."""

    choice: str = "auto"


def read_cluster(values: FlagValues) -> ClusterSettings:
    """``--cluster``, as given (:func:`launcher.clusters.apply.detect` checks the name against the plugins)."""
    return ClusterSettings((values["cluster"] or "auto").strip().lower())


FLAGS: FlagGroup[ClusterSettings] = FlagGroup(
    name="clusters",
    title="cluster environments",
    read=read_cluster,
    flags=(
        Flag("--cluster", default="auto", underscore=False,
             help="Fill missing flags from a scheduler's environment: auto (default), none (torchrun's "
             "behaviour), or a cluster environment's name (slurm, openmpi, mpich, pmix, lsf, kubeflow)."),
    ),
)


def given_flags(args: argparse.Namespace, environ: Mapping[str, str]) -> set[str]:
    """The dests set on the command line or by a ``PET_*`` variable."""
    given = set(getattr(args, "given_flags", ()) or ())
    given.update(dest for dest in FILLABLE if f"PET_{dest.upper()}" in environ)
    return given


def environments(manager: LauncherPluginManager) -> list[ClusterEnvironment]:
    """Every registered cluster environment, in the order ``auto`` tries them."""
    unique = [provided.registration for provided in manager.unique_registrations(ClusterEnvironment)]
    return sorted(unique, key=lambda reg: (reg.priority, reg.name))


def detect(choice: str, manager: LauncherPluginManager, environ: Mapping[str, str]) -> ClusterInfo | None:
    """The job ``choice`` (``auto``, ``none`` or a name) finds in ``environ``; ``None`` if none."""
    name = choice.strip().lower()
    if name == "none":
        return None
    if name == "auto":
        for reg in environments(manager):
            info = reg.detect(environ)
            if info is not None:
                return info
        return None
    found = manager.registrations(ClusterEnvironment)
    if name not in found:
        choices = ", ".join(["auto", "none", *sorted(found)])
        raise UsageError(f"unknown --cluster {choice!r}: choose one of {choices}")
    chosen = found[name].registration
    info = chosen.detect(environ)
    if info is None:
        marks = " or ".join(chosen.variables) or "its variables"
        raise UsageError(f"--cluster {chosen.name}: this is not a {chosen.name} job here ({marks} not set); "
                         "use --cluster auto or none")
    return info


def _need(info: ClusterInfo, value: object, flag: str) -> None:
    if value is None:
        raise UsageError(info.problem or f"{info.label}: the environment does not give {flag}; give {flag}")


def apply_cluster(args: argparse.Namespace, manager: LauncherPluginManager,
                  environ: Mapping[str, str] | None = None) -> ClusterInfo | None:
    """Fill ``args`` from the cluster environment ``args.cluster`` names; the job found, if any."""
    env = os.environ if environ is None else environ
    choice = getattr(args, "cluster", None) or "auto"
    if choice.strip().lower() != "none" and getattr(args, "standalone", False):
        if choice.strip().lower() != "auto":
            detect(choice, manager, env)  # still reject an unknown name
        return None  # --standalone is a complete one-node rendezvous: nothing to fill
    info = detect(choice, manager, env)
    if info is None:
        return None
    given = given_flags(args, env)
    took: list[str] = []

    def note(field: str) -> None:
        source = info.sources.get(field)
        took.append(f"{_WHAT[field]} from {source}" if source else _WHAT[field])

    if info.nnodes is not None:
        if "nnodes" in given:
            low, _, high = str(args.nnodes).partition(":")
            if low.strip().isdigit() and (high or low).strip().isdigit() and not (
                int(low) <= info.nnodes <= int(high or low)
            ):
                log.warning("--nnodes %s contradicts the %s: %d nodes (%s); using --nnodes %s", args.nnodes,
                            info.label, info.nnodes, info.sources.get("nnodes", "environment"), args.nnodes)
        else:
            args.nnodes = str(info.nnodes)
            note("nnodes")
    elif "nnodes" not in given:
        _need(info, None, "--nnodes")
    if info.nproc_per_node is not None:
        if "nproc_per_node" in given:
            text = str(args.nproc_per_node).strip()
            if text.isdigit() and int(text) != info.nproc_per_node:
                log.warning("--nproc-per-node %s contradicts the %s: %d per node (%s); using --nproc-per-node %s",
                            text, info.label, info.nproc_per_node, info.sources.get("nproc_per_node", "environment"),
                            text)
        else:
            args.nproc_per_node = str(info.nproc_per_node)
            note("nproc_per_node")

    if "rdzv_backend" in given:
        backend = str(args.rdzv_backend).strip().lower()
    elif given & {"node_rank", "master_addr", "master_port"}:
        backend = "static"  # torchrun's static flags name the static rendezvous
    elif ":" in str(args.nnodes) and len(set(str(args.nnodes).split(":"))) > 1:
        backend = "c10d"  # an elastic MIN:MAX needs a rendezvous that admits nodes as they come
        args.rdzv_backend = backend
    elif info.backend == "static" and str(getattr(args, "topology", None) or "").strip():
        # --topology (or PET_TOPOLOGY) orders the round by where each node sits: the static
        # rendezvous fixes each node's rank from the scheduler's index, c10d's closer places them.
        backend = "c10d"
        args.rdzv_backend = backend
    else:
        backend = info.backend
        args.rdzv_backend = backend
    single = args.nnodes.strip() in ("1", "1:1")
    if backend == "static":
        if "node_rank" in given:
            if info.node_rank is not None and str(args.node_rank).strip() != str(info.node_rank):
                log.warning("--node-rank %s contradicts the %s: node %d (%s); using --node-rank %s", args.node_rank,
                            info.label, info.node_rank, info.sources.get("node_rank", "environment"), args.node_rank)
        elif not single:
            _need(info, info.node_rank, "--node-rank")
            args.node_rank = str(info.node_rank)
            note("node_rank")
        if "master_addr" not in given and not single:
            _need(info, info.master_addr, "--master-addr")
            args.master_addr = info.master_addr
            note("master_addr")
        if "master_port" not in given and info.master_port is not None:
            args.master_port = str(info.master_port)
            note("master_port")
        endpoint = f"{args.master_addr}:{args.master_port or 29500}"
    else:
        if "rdzv_endpoint" not in given:
            host = info.master_addr or ("127.0.0.1" if single else None)
            _need(info, host, "--rdzv-endpoint")
            port = info.master_port if info.master_port is not None else (0 if single else None)
            _need(info, port, "--rdzv-endpoint HOST:PORT")
            args.rdzv_endpoint = f"[{host}]:{port}" if host and ":" in host else f"{host}:{port}"
            if info.master_addr:
                note("master_addr")
            if info.master_port is not None:
                note("master_port")
        endpoint = args.rdzv_endpoint
    if "rdzv_id" not in given and info.run_id:
        args.rdzv_id = info.run_id
        note("run_id")
    if not single and "worker_tty" not in given and "PET_WORKER_TTY" not in env:
        # Live worker output assumes this launcher alone writes its terminal. The scheduler merges
        # every node's output into one (mpirun even gives each node a pty of its own), so one
        # node's live line would be erased and torn by the others': whole lines stay intact.
        args.worker_tty = "never"
    if took:
        where = f"node {args.node_rank} of {args.nnodes}" if backend == "static" else f"{args.nnodes} nodes"
        log.info("%s: %s, %s rendezvous at %s (%s)", info.label, where, backend, endpoint, "; ".join(took))
    return info
