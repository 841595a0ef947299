"""From component parameters to a TorchX ``AppDef`` whose role runs ``python -m launcher``.

This module holds the parsing and the command line; :mod:`launcher_torchx.components` holds the
two functions TorchX shows to users. They are kept apart because TorchX treats every function of
a registered component module as a candidate component.
"""

from __future__ import annotations

import os
import re
import shlex
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from torchx import specs
from torchx.components.structured_arg import StructuredNameArgument
from torchx.specs import macros

#: The interpreter that starts the agent inside the image (found on the replica's ``PATH``).
PYTHON = "python"

#: Where multi-node jobs meet when ``rdzv_port`` is not given, as with ``dist.ddp``.
DEFAULT_RDZV_PORT = 29500

#: Variables set by ``debug=True``: the usual switches for debugging PyTorch and NCCL.
DEBUG_ENV: Mapping[str, str] = {
    "CUDA_LAUNCH_BLOCKING": "1",
    "NCCL_DESYNC_DEBUG": "1",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_SHOW_CPP_STACKTRACES": "1",
}

_J_EXAMPLES = "1:2x4 or 1x4 or 4"
# [MIN:]NNODESxNPROC, or NPROC alone (one node).
_DDP_J = re.compile(r"(?:(?:(?P<min>\d+):)?(?P<nodes>\d+)x)?(?P<nproc>\d+)")
# [MIN:]NNODES[xNPROC]: spmd takes the node count alone and reads NPROC from the host type.
_SPMD_J = re.compile(r"(?:(?P<min>\d+):)?(?P<nodes>\d+)(?:x(?P<nproc>\d+))?")


class _Unquoted(str):
    """A command word that must reach the shell as is (it holds a ``${VAR:=default}`` expansion)."""


@dataclass(frozen=True)
class JobSize:
    """The size of a job as ``-j`` gives it: nodes (a range when elastic) and workers per node."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int

    @property
    def multi_node(self) -> bool:
        """Whether the job may span more than one node (and so needs a shared rendezvous)."""
        return self.max_nodes > 1

    @property
    def nnodes(self) -> str:
        """The launcher's ``--nnodes`` value: ``N``, or ``MIN:MAX`` for an elastic job."""
        if self.min_nodes == self.max_nodes:
            return str(self.max_nodes)
        return f"{self.min_nodes}:{self.max_nodes}"

    def __str__(self) -> str:
        prefix = f"{self.min_nodes}:" if self.min_nodes != self.max_nodes else ""
        return f"{prefix}{self.max_nodes}x{self.nproc_per_node}"


def _format_error(j: str) -> ValueError:
    # The same exception type and wording as torchx's dist.ddp, so tooling that matches it keeps working.
    return ValueError(f"Invalid format for -j, usage example: {_J_EXAMPLES}. Given: {j}")


def _check_size(j: str, min_nodes: int, max_nodes: int, nproc: int) -> JobSize:
    if min_nodes < 1 or max_nodes < 1:
        raise ValueError(f"Invalid -j: a job needs at least 1 node, usage example: {_J_EXAMPLES}. Given: {j}")
    if min_nodes > max_nodes:
        raise ValueError(
            f"Invalid -j: the minimum number of nodes ({min_nodes}) exceeds the maximum ({max_nodes}),"
            f" usage example: {_J_EXAMPLES}. Given: {j}"
        )
    if nproc < 1:
        raise ValueError(f"Invalid -j: a node needs at least 1 process, usage example: {_J_EXAMPLES}. Given: {j}")
    return JobSize(min_nodes, max_nodes, nproc)


def parse_ddp_j(j: str) -> JobSize:
    """Parse ``dist.ddp``'s ``-j``: ``[MIN:]NNODESxNPROC``, or ``NPROC`` for one node.

    Raises:
        ValueError: for text that does not have that form (torchx's own message), or for sizes
            that cannot run (no nodes, no processes, MIN above NNODES).
    """
    match = _DDP_J.fullmatch(j.strip())
    if match is None:
        raise _format_error(j)
    nproc = int(match["nproc"])
    if match["nodes"] is None:
        return _check_size(j, 1, 1, nproc)
    max_nodes = int(match["nodes"])
    min_nodes = int(match["min"]) if match["min"] is not None else max_nodes
    return _check_size(j, min_nodes, max_nodes, nproc)


def parse_spmd_j(j: str, h: str) -> JobSize:
    """Parse ``dist.spmd``'s ``-j``: ``[MIN:]NNODES[xNPROC]``; NPROC defaults to the GPUs of host type ``h``.

    Raises:
        ValueError: for malformed text, for sizes that cannot run, or when NPROC is left out and
            ``h`` has no GPUs to count.
        KeyError: when ``h`` is not a registered named resource (TorchX's own error).
    """
    match = _SPMD_J.fullmatch(j.strip())
    if match is None:
        raise ValueError(
            f"Invalid format for -j, usage example: 1:2x8 or 2x8 or 2 (NPROC from the host's GPUs). Given: {j}"
        )
    max_nodes = int(match["nodes"])
    min_nodes = int(match["min"]) if match["min"] is not None else max_nodes
    gpus = specs.named_resources[h].gpu
    if match["nproc"] is None:
        if gpus <= 0:
            raise ValueError(
                f"Invalid -j: NPROC cannot be inferred because host type `{h}` has no GPUs;"
                f" give it as `-j {j}xNPROC` (e.g. `-j {j}x8`). Given: {j}"
            )
        nproc = gpus
    else:
        nproc = int(match["nproc"])
        if gpus > 0 and nproc != gpus:
            warnings.warn(
                f"-j {j}: {nproc} processes per node on host type `{h}`, which has {gpus} GPUs;"
                f" use `-j {match['nodes']}` for one process per GPU",
                stacklevel=3,
            )
    return _check_size(j, min_nodes, max_nodes, nproc)


def role_name(script: str | None, m: str | None) -> str:
    """The role's name: the script's file name without extension, or the module's last part."""
    if script:
        return os.path.splitext(os.path.basename(script))[0] or "trainer"
    if m:
        return m.rpartition(".")[2]
    raise ValueError("exactly one of --script and -m must be given")


def _join(words: Iterable[str]) -> str:
    return " ".join(word if isinstance(word, _Unquoted) else shlex.quote(word) for word in words)


def rendezvous_endpoint(size: JobSize, rdzv_port: int) -> str:
    """Where the agents meet.

    One node: ``localhost:0``, a free port the single agent picks (no port to configure or clash).
    More nodes: the rank-0 replica's host as the scheduler publishes it, read in the shell from the
    variable TorchX names through ``${rank0_env}`` (``localhost`` when unset or empty, as on the
    rank-0 replica itself on some schedulers), and ``rdzv_port``.
    """
    if not size.multi_node:
        return "localhost:0"
    # "$$" survives TorchX's macro substitution as one "$", for the shell.
    return _Unquoted(f"$${{{macros.rank0_env}:=localhost}}:{rdzv_port}")


def launcher_command(
    *,
    size: JobSize,
    role: str,
    script: str | None,
    m: str | None,
    script_args: Sequence[str],
    rdzv_backend: str,
    rdzv_port: int,
    tee: int,
    max_restarts: int,
    launcher_args: Sequence[str] = (),
) -> list[str]:
    """The words of the agent's command line (before shell quoting), macros still unexpanded."""
    backend = rdzv_backend if size.multi_node else "c10d"
    words: list[str] = [
        PYTHON, "-m", "launcher",
        "--rdzv-backend", backend,
        "--rdzv-endpoint", rendezvous_endpoint(size, rdzv_port),
        "--rdzv-id", macros.app_id,
        "--nnodes", size.nnodes if size.multi_node else "1",
        "--nproc-per-node", str(size.nproc_per_node),
        "--max-restarts", str(max_restarts),
        "--tee", str(tee),
        "--role", role,
    ]  # fmt: skip
    if backend == "static":
        words += ["--node-rank", macros.replica_id]
    words += list(launcher_args)
    if script is not None:
        words.append(script)
    else:
        assert m is not None
        words += ["-m", m]
    words += list(script_args)
    return words


def build_app(
    *,
    script_args: Sequence[str],
    script: str | None,
    m: str | None,
    image: str,
    name: str,
    resource: specs.Resource,
    size: JobSize,
    env: Mapping[str, str] | None,
    max_retries: int,
    rdzv_port: int,
    rdzv_backend: str,
    mounts: Sequence[str] | None,
    debug: bool,
    tee: int,
    max_restarts: int = 0,
    launcher_args: str | None = None,
) -> specs.AppDef:
    """The AppDef of a DDP-style job: one role, one replica per node, each running the launcher.

    Raises:
        ValueError: for a parameter the job could not run with; the message names it.
    """
    if (script is None) == (m is None):
        given = "both" if script is not None else "neither"
        raise ValueError(f"exactly one of --script and -m must be given (got {given})")
    if tee not in (0, 1, 2, 3):
        raise ValueError(f"--tee must be 0 (none), 1 (stdout), 2 (stderr) or 3 (both), got {tee}")
    if max_retries < 0:
        raise ValueError(f"--max_retries must be 0 or more, got {max_retries}")
    if max_restarts < 0:
        raise ValueError(f"--max_restarts must be 0 or more, got {max_restarts}")
    backend = rdzv_backend.strip()
    if not backend or any(c.isspace() for c in backend):
        raise ValueError(f"--rdzv_backend must be a backend name such as c10d or static, got {rdzv_backend!r}")
    if size.multi_node:
        if not 0 < rdzv_port < 65536:
            raise ValueError(f"--rdzv_port must be a TCP port (1-65535), got {rdzv_port}")
        if backend == "static" and size.min_nodes != size.max_nodes:
            raise ValueError(
                f"-j {size}: the static rendezvous needs a fixed number of nodes; use -j {size.max_nodes}x"
                f"{size.nproc_per_node}, or rdzv_backend c10d for an elastic job"
            )

    names = StructuredNameArgument.parse_from(name=name, m=m, script=script)
    role = role_name(script, m)
    extra = shlex.split(launcher_args) if launcher_args else []

    role_env: dict[str, str] = dict(env or {})
    role_env["TORCHX_TRACKING_EXPERIMENT_NAME"] = names.experiment_name
    role_env.setdefault("LOGLEVEL", os.environ.get("LOGLEVEL", "WARNING"))
    if debug:
        role_env.update(DEBUG_ENV)

    words = launcher_command(
        size=size,
        role=role,
        script=script,
        m=m,
        script_args=script_args,
        rdzv_backend=backend,
        rdzv_port=rdzv_port,
        tee=tee,
        max_restarts=max_restarts,
        launcher_args=extra,
    )
    return specs.AppDef(
        name=names.run_name,
        roles=[
            specs.Role(
                name=role,
                image=image,
                entrypoint="bash",
                # exec: the scheduler's signals reach the agent itself, which forwards them to the workers.
                args=["-c", "exec " + _join(words)],
                env=role_env,
                min_replicas=size.min_nodes,
                num_replicas=size.max_nodes,
                resource=resource,
                port_map={"c10d": rdzv_port},
                max_retries=max_retries,
                mounts=specs.parse_mounts(list(mounts)) if mounts else [],
            )
        ],
    )
