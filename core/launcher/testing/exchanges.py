"""Simulated nodes running the cross-node exchanges over a real store server, every request counted.

Each simulated node holds its own :class:`CountingStoreClient` (a real socket to a real
:class:`~launcher.store.server.StoreServer`) and runs the same code the agent runs for one
exchange: the straggler summaries and verdicts of an interval (:mod:`launcher.stragglers.exchange`),
or the hang summaries and merged report of a hang (:func:`launcher.hangs.cluster.exchange`).
:func:`stragglers` and :func:`hangs` give each node's store requests and bytes (sent and received)
per interval, or per hang.

The module also runs main's algorithm from before issue 40 (every node reads every node's key)
when the ``launcher`` package it imports is main's: ``benchmarks/bench_exchanges.py`` runs this
file as a script with main's ``core/`` first on ``PYTHONPATH`` and reads the JSON it prints. So it
imports nothing from ``launcher`` that main lacks.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from launcher.store.client import TCPStoreClient
from launcher.store.server import StoreServer

__all__ = ["CountingStoreClient", "Figures", "hangs", "stragglers"]

#: Ranks a simulated node runs (8 GPUs).
RANKS = 8
#: The straggler intervals before the measured ones: enough windows for a verdict that names one rank.
WARMUP_INTERVALS = 8
#: Under main's algorithm, intervals in which the nodes only write their keys (until each holds its
#: last 5 intervals, as in a job's steady state): what a node then reads depends on nothing else.
MAIN_WARMUP_INTERVALS = 5


class CountingStoreClient(TCPStoreClient):
    """A :class:`~launcher.store.client.TCPStoreClient` that counts the messages it sends (each
    a store request on the wire: ``get`` is a WAIT and a GET) and the bytes it sends and receives."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests = 0
        self.bytes = 0

    def reset(self) -> None:
        self.requests = self.bytes = 0

    def _send(self, sock: socket.socket, data: bytes, deadline: Any) -> None:
        self.requests += 1
        self.bytes += len(data)
        super()._send(sock, data, deadline)

    def _recv_u8(self, sock: socket.socket, deadline: Any) -> int:
        self.bytes += 1
        return super()._recv_u8(sock, deadline)

    def _recv_i64(self, sock: socket.socket, deadline: Any) -> int:
        self.bytes += 8
        return super()._recv_i64(sock, deadline)

    def _recv_blob(self, sock: socket.socket, deadline: Any) -> bytes:
        blob = super()._recv_blob(sock, deadline)
        self.bytes += 8 + len(blob)
        return blob


@dataclass
class Figures:
    """Store requests and bytes per node (per interval, or per hang)."""

    #: The mean over the nodes that neither judge nor merge.
    node_requests: float
    node_bytes: float
    #: The judging (merging) node's; main's algorithm has none (every node judges): the mean then.
    judge_requests: float
    judge_bytes: float
    #: Every node's together: what passes through the store host.
    total_requests: float
    total_bytes: float

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def _figures(clients: Sequence[CountingStoreClient], judge: int | None, per: int) -> Figures:
    others = [c for i, c in enumerate(clients) if i != judge] or list(clients)
    chief = clients[judge] if judge is not None else None
    return Figures(
        sum(c.requests for c in others) / len(others) / per, sum(c.bytes for c in others) / len(others) / per,
        (chief.requests if chief else sum(c.requests for c in clients) / len(clients)) / per,
        (chief.bytes if chief else sum(c.bytes for c in clients) / len(clients)) / per,
        sum(c.requests for c in clients) / per, sum(c.bytes for c in clients) / per,
    )


def _participant(node: int) -> str:
    return f"10.{node // 65536}.{node // 256 % 256}.{node % 256}_{100000 + node}_0"


def _samples(node: int, slow_rank: int = 3) -> list[Any]:
    """One interval of one node's ranks: 5 s, 50 collectives; global rank ``slow_rank`` works 30% more."""
    from launcher.stragglers.verdict import RankSample

    samples = []
    for local in range(RANKS):
        rank = node * RANKS + local
        wait = 0.5 if rank == slow_rank else 2.0
        samples.append(RankSample(rank, _participant(node), local, 5.0, wait, 50, 0))
    return samples


def _clients(server: StoreServer, n: int) -> list[CountingStoreClient]:
    return [CountingStoreClient(server.host, server.port, timeout=120.0) for _ in range(n)]


def stragglers(server: StoreServer, n: int, intervals: int = 2) -> Figures:
    """``n`` nodes exchange straggler summaries for :data:`WARMUP_INTERVALS` intervals
    (:data:`MAIN_WARMUP_INTERVALS` under main's algorithm), then ``intervals`` measured ones (one
    under main's algorithm); the figures per interval. Nodes take turns (the judge first), each
    interval after every node published the one before: as on real nodes in step."""
    from launcher.stragglers import cluster

    NodeExchange: Any
    try:
        from launcher.stragglers.exchange import NodeExchange
    except ImportError:  # main's algorithm: every node reads every key
        NodeExchange = None
    clients = _clients(server, n)
    run_id = f"bench-{uuid.uuid4().hex[:8]}"  # a store used before holds another run's keys
    if NodeExchange is not None:
        nodes = [NodeExchange(run_id, 0, i, n, 1.15) for i in range(n)]
    else:
        from launcher.stragglers.monitor import StragglerMonitor

        infos = [SimpleNamespace(round=0, group_rank=i, group_world_size=n, master_addr=server.host,
                                 master_port=server.port) for i in range(n)]
        monitors: list[Any] = []  # main's StragglerMonitor: its _exchange is not today's
        for client in clients:
            monitor = object.__new__(StragglerMonitor)  # only its exchange: no thread, no files
            monitor.run_id, monitor._store = run_id, client
            monitors.append(monitor)
        histories: list[dict[int, Any]] = [{} for _ in range(n)]
    locals_: list[dict[int, Any]] = [{} for _ in range(n)]
    warmup = WARMUP_INTERVALS if NodeExchange is not None else MAIN_WARMUP_INTERVALS
    if NodeExchange is None:
        intervals = 1  # every node reads every key: one interval is N^2 keys already
    try:
        for step in range(warmup + intervals):
            if step == warmup:
                for client in clients:
                    client.reset()
            number = 1000 + step
            for i in range(n):
                local = locals_[i]
                local[number] = _samples(i)
                for old in [k for k in local if k <= number - cluster.KEY_INTERVALS]:
                    del local[old]
                if NodeExchange is not None:
                    nodes[i].interval(clients[i], number, local, _participant(i))
                elif step < warmup:
                    clients[i].set(cluster.key(run_id, 0, i), cluster.encode(_participant(i), local))
                else:
                    # main's StragglerMonitor._run around its _exchange
                    wanted = [k for k in range(number - cluster.KEY_INTERVALS + 1, number) if k not in histories[i]]
                    histories[i].update(monitors[i]._exchange(infos[i], local, _participant(i), wanted))
        return _figures(clients, 0 if NodeExchange is not None else None, intervals)
    finally:
        for client in clients:
            client.close()


def _summary(node: int) -> Any:
    from launcher.hangs.report import NodeSummary, RankEntry

    entries = []
    for local in range(RANKS):
        rank = node * RANKS + local
        odd = rank == 3
        entries.append(RankEntry(
            rank=rank, local_rank=local, node=_participant(node), pid=200000 + rank, age=30.0 + 0.001 * rank,
            hung=True, collective=not odd,
            summary=("read (loader.py:88) <- next_batch (train.py:30) <- main (train.py:50)" if odd else
                     "all_reduce (distributed_c10d.py:2806) <- train_step (train.py:42) <- main (train.py:50)"),
            reason=f"no heartbeat for {30.0 + 0.001 * rank:.1f} s (timeout 30 s)"))
    return NodeSummary(_participant(node), node, entries,
                       stacks_file=f"/shared/logs/job-{node}/hang_stacks_attempt_0.txt")


def hangs(server: StoreServer, n: int) -> Figures:
    """``n`` nodes, each on a thread of its own, exchange hang summaries once (all at the same
    moment, as after an alarm); the figures per hang."""
    from launcher.hangs import cluster

    clients = _clients(server, n)
    base = cluster.prefix(f"bench-{uuid.uuid4().hex[:8]}", 0)  # a store used before holds another run's keys
    errors: list[BaseException] = []

    def node(i: int) -> None:
        try:
            summary = _summary(i)
            if hasattr(cluster, "exchange"):
                cluster.exchange(clients[i], base, summary, n, tolerance=2.5, timeout=120.0)
            else:  # main's HangMonitor._diagnose
                cluster.publish(clients[i], base, summary)
                cluster.collect(clients[i], base, n, 120.0, own=i)
                cluster.finish(clients[i], base, n, 120.0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(n)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return _figures(clients, 0 if hasattr(cluster, "exchange") else None, 1)
    finally:
        for client in clients:
            client.close()


def main(argv: Sequence[str]) -> int:
    """``exchanges.py stragglers|hangs N``: the figures as one line of JSON."""
    kind, n = argv[0], int(argv[1])
    with StoreServer("127.0.0.1", 0).start() as server:
        figures = stragglers(server, n) if kind == "stragglers" else hangs(server, n)
    print(json.dumps(figures.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
