"""The rendezvous flags: the job's size and how its nodes meet (``--nnodes``, ``--rdzv-*``, the static ones).

Declared, parsed and checked here (:data:`FLAGS`); :func:`read_rendezvous` gives one
:class:`RendezvousSettings`. ``--standalone`` and the static backend's ``--node-rank``,
``--master-addr`` and ``--master-port`` are folded in: what the rest of the launcher sees is a
backend, an endpoint and its ``--rdzv-conf``.
"""

# No "from __future__ import annotations": typing.NamedTuple would compile every field's
# annotation string at import, which every launch pays.

import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.rendezvous.endpoint import check_host, format_endpoint
from launcher.values import MAX_NODES, parse_int, quote, read_int

__all__ = [
    "DEFAULT_MASTER_PORT",
    "FLAGS",
    "RendezvousSettings",
    "new_run_id",
    "parse_nnodes",
    "parse_rdzv_conf",
    "read_rendezvous",
]

DEFAULT_MASTER_PORT = 29500


class RendezvousSettings(NamedTuple):
    """Where and how this node meets the others, checked."""

    min_nodes: int
    max_nodes: int
    backend: str
    endpoint: str
    run_id: str
    #: ``--rdzv-conf``, with the static backend's ``rank`` added.
    configs: Mapping[str, str] = MappingProxyType({})
    #: ``--local-addr``: how other nodes reach this one (``None``: the backend's guess).
    local_addr: str | None = None
    standalone: bool = False


def new_run_id() -> str:
    """A random job id (what ``uuid.uuid4().hex`` gives, without importing uuid)."""
    return os.urandom(16).hex()


def parse_nnodes(value: str, name: str = "--nnodes") -> tuple[int, int]:
    """``N`` or ``MIN:MAX``, each an integer from 1 to :data:`~launcher.values.MAX_NODES`."""
    parts = value.split(":")  # plain ASCII decimal: no spaces, as every number
    hint = f"{name} must be N or MIN:MAX with integers from 1 to {MAX_NODES}, e.g. 2 or 1:4; got {quote(value)}"
    numbers = [read_int(part) for part in parts]
    if len(parts) > 2 or any(n is None or not 1 <= n <= MAX_NODES for n in numbers):
        raise UsageError(hint)
    low, high = numbers[0], numbers[-1]
    assert low is not None and high is not None
    if low > high:
        raise UsageError(f"{name} {quote(value)} is invalid: need MIN <= MAX, e.g. 2 or 1:4")
    return low, high


_QUOTES = "'\""


def _check_stray_quotes(value: str) -> None:
    """Refuse a value that still carries the quotes of a quoting layer that did not remove them.

    ``--rdzv-conf='join_timeout=5,timeout=5'`` quoted once more (in a YAML command list, a script
    that quotes its arguments) arrives with the quotes in it. torchrun then silently ignores the
    mangled keys; here it is refused, with the value as it was meant. Keys never hold quotes, and
    a value is never wrapped in them.
    """
    for item in value.split(","):
        key, _, val = item.strip().partition("=")
        val = val.strip()
        if any(mark in key for mark in _QUOTES) or (val and (val[0] in _QUOTES or val[-1] in _QUOTES)):
            unquoted = value.translate({ord(mark): None for mark in _QUOTES})
            raise UsageError(
                f"--rdzv-conf {quote(value)} carries quote characters (a quoting layer passed them on): "
                f"give it without them, --rdzv-conf {unquoted}"
            )


def parse_rdzv_conf(value: str) -> dict[str, str]:
    """``key1=value1,key2=value2``; an empty value is an error (it would silently mean the default)."""
    _check_stray_quotes(value)
    conf: dict[str, str] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(
                f"--rdzv-conf item {quote(item)} is invalid: use key=value pairs, e.g. join_timeout=900"
            )
        if not val.strip():
            raise UsageError(
                f"--rdzv-conf {quote(key.strip())} has no value: give key=value, or leave the key out for its default"
            )
        if key.strip() in conf:
            raise UsageError(f"--rdzv-conf gives {quote(key.strip())} twice: give each key once")
        conf[key.strip()] = val.strip()
    return conf


def read_rendezvous(values: FlagValues) -> RendezvousSettings:
    """The rendezvous flags, checked; ``--standalone`` and the static flags folded into an endpoint."""
    nnodes = values["nnodes"]
    min_nodes, max_nodes = parse_nnodes(nnodes, values.source("nnodes"))
    # The script and the worker count are checked before the rendezvous settings, as ever: a
    # missing script is the first thing a user hears about.
    values.settings("workers")
    configs = parse_rdzv_conf(values["rdzv_conf"])
    standalone = bool(values["standalone"])
    if standalone and max_nodes > 1:
        raise UsageError(
            f"{values.source('nnodes')} {quote(nnodes)} with --standalone: a standalone job is one node; drop "
            "--standalone and give --rdzv-backend c10d --rdzv-endpoint HOST:PORT for several nodes"
        )
    if standalone:
        backend, endpoint, run_id = "c10d", "localhost:0", new_run_id()
    else:
        backend, endpoint, run_id = values["rdzv_backend"].strip().lower(), values["rdzv_endpoint"], values["rdzv_id"]
    if backend == "static":
        if min_nodes != max_nodes:
            raise UsageError(f"--nnodes {nnodes}: the static backend needs a fixed size; use c10d for MIN:MAX")
        node_rank = parse_int(values["node_rank"], values.source("node_rank"), 0, max_nodes - 1)
        configs["rank"] = str(node_rank)
        if not endpoint.strip():
            given = values["master_port"]
            port = DEFAULT_MASTER_PORT if given is None else parse_int(given, values.source("master_port"), 0, 65535)
            host = check_host(values["master_addr"].strip(), values.source("master_addr"))
            endpoint = format_endpoint(host, port)
    local_addr = values["local_addr"]
    if local_addr is not None:
        check_host(local_addr.strip(), values.source("local_addr"))
    return RendezvousSettings(min_nodes=min_nodes, max_nodes=max_nodes, backend=backend, endpoint=endpoint,
                              run_id=run_id, configs=MappingProxyType(configs), local_addr=local_addr,
                              standalone=standalone)


FLAGS: FlagGroup[RendezvousSettings] = FlagGroup(
    name="rendezvous",
    title="rendezvous (the job's size and how its nodes meet)",
    read=read_rendezvous,
    flags=(
        Flag("--nnodes", default="1:1", torchrun=True,
             help="Number of nodes, or MIN:MAX for an elastic job (default 1:1)."),
        Flag("--rdzv-backend", default="static", torchrun=True, help="Rendezvous backend (default static)."),
        Flag("--rdzv-endpoint", default="", torchrun=True,
             help="Rendezvous endpoint, host[:port]; IPv6 as [::1]:29400."),
        Flag("--rdzv-id", default="none", torchrun=True, help="Job id shared by every node."),
        Flag("--rdzv-conf", default="", torchrun=True, help="More rendezvous settings, key1=value1,key2=value2."),
        Flag("--standalone", switch=True, torchrun=True,
             help="Single-node job with a local rendezvous on a free port; overrides --rdzv-backend, "
             "--rdzv-endpoint and --rdzv-id."),
        Flag("--node-rank", default="0", torchrun=True, help="This node's rank (static backend)."),
        Flag("--master-addr", default="127.0.0.1", torchrun=True,
             help="Address of the node with rank 0 (static backend)."),
        Flag("--master-port", default=None, torchrun=True,
             help="Port of the store on the rank-0 node (static backend, default 29500)."),
        Flag("--local-addr", default=None, torchrun=True,
             help="This node's address as the other nodes should reach it (default: its FQDN)."),
    ),
)
