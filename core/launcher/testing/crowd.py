"""A crowd of simulated rendezvous nodes on one asyncio loop, for rounds of thousands of nodes.

A thread per simulated node (:mod:`launcher.testing.simulated_nodes`) is faithful but costs a
thread and an interpreter's share of the lock each: past about a thousand nodes on a small
machine the threads, not the store, are what a benchmark would measure. Here each node is a
coroutine with a socket of its own to the real store server (launcher's, or torch's: the same
TCPStore wire protocol), and joins a first round with the store requests a real node makes, in
the same order, under the real key names (:class:`~launcher.rendezvous.keys.RendezvousKeys`):

1. ``compare_set(current, "", "0")``; ``add(<r>/seq, 1)``; ``set(<r>/node/<i>, record)``
   (:meth:`~launcher.rendezvous.membership.NodeDescriptor.record`);
2. the node whose index is MAX closes the round: ``multi_get`` of every record, then
   ``compare_set(<r>/roster, "", record)`` with :func:`~launcher.rendezvous.rounds.sealed_value`,
   one ``multi_set`` of every ``<r>/place/<i>``
   (:func:`~launcher.rendezvous.membership.places`), and ``compare_set(<r>/sealed, "", summary)``
   (:func:`~launcher.rendezvous.membership.sealed_summary`);
3. every node waits for ``<r>/sealed`` in slices (a wait, then a cancel, as
   :func:`~launcher.rendezvous.store_ops.wait_in_slices`, as long as
   :func:`~launcher.rendezvous.store_ops.wait_slice_for` says), reads it, then reads its own
   ``<r>/place/<i>`` (a plain get: it exists once ``sealed`` does): O(1) bytes each;
4. group rank 0 publishes ``<r>/master``, the others read it (the workers' store).

Like a real node, no node but the closer reads the round's participants list (``<r>/roster``).
Only rounds of ``--nnodes N:N`` (no spares, no last call) are simulated: the protocol's other
paths are the conformance suites' subject.

:meth:`Crowd.steady` then runs what each node sends per interval once the workers run (the
heartbeat ring, status records, a straggler summary), timing every request.
"""

from __future__ import annotations

import asyncio
import json
import random
import struct
import time
from collections import defaultdict
from dataclasses import dataclass, field

from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.rendezvous.keys import RendezvousKeys
from launcher.rendezvous.membership import NodeDescriptor, decode, encode, encode_large, places, sealed_summary
from launcher.rendezvous.rounds import sealed_value, segment_tally
from launcher.rendezvous.store_ops import wait_slice_for
from launcher.store.protocol import VALIDATION_MAGIC, CheckResponse, QueryType, WaitResponse, encode_key
from launcher.topology.order import location_record

__all__ = ["Crowd", "CrowdClient", "SteadyLoad"]

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
#: Longest single wait of a client made alone (launcher.rendezvous.store_ops.WAIT_SLICE).
WAIT_SLICE = 1.0
#: Bytes asked of one recv() by a node's transport. asyncio asks for 256 KiB, which puts every
#: read past glibc's mmap threshold (an mmap, an mremap and a munmap each, several times the
#: read itself): thousands of nodes in one process would then measure the allocator, not the
#: store. A real node reads a few replies per round; 64 KiB stays on the heap.
RECV_SIZE = 64 * 1024


def _blob(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def _key(key: str) -> bytes:
    return _blob(encode_key(key))


def _keys(keys: list[str]) -> bytes:
    return _U64.pack(len(keys)) + b"".join(_key(k) for k in keys)


class CrowdClient:
    """One node's connection: the TCPStore requests the rendezvous uses, as coroutines.

    ``latencies`` (when given) collects each request's seconds under its name.
    """

    def __init__(self, latencies: dict[str, list[float]] | None = None, wait_slice: float = WAIT_SLICE) -> None:
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.latencies = latencies
        self.wait_slice = wait_slice

    async def connect(self, host: str, port: int) -> None:
        """Connect and validate, as torch's client does (VALIDATE, then a PING)."""
        self._reader, self._writer = await asyncio.open_connection(host, port)
        transport = self._writer.transport
        if hasattr(transport, "max_size"):  # the selector event loop's transports (CPython's default)
            transport.max_size = RECV_SIZE
        nonce = random.getrandbits(32)
        self._writer.write(_U8.pack(QueryType.VALIDATE) + _U32.pack(VALIDATION_MAGIC)
                           + _U8.pack(QueryType.PING) + _U32.pack(nonce))
        (echo,) = _U32.unpack(await self._reader.readexactly(4))
        if echo != nonce:
            raise ConnectionError("the store answered the ping with another number")

    def close(self) -> None:
        """Close the connection."""
        if self._writer is not None:
            self._writer.close()

    async def _ask(self, name: str, message: bytes, reply: int) -> bytes:
        assert self._reader is not None and self._writer is not None
        start = time.perf_counter()
        self._writer.write(message)
        data = await self._reader.readexactly(reply) if reply else b""
        self._note(name, start)
        return data

    def _note(self, name: str, start: float) -> None:
        if self.latencies is not None:
            self.latencies[name].append(time.perf_counter() - start)

    async def _blob_reply(self) -> bytes:
        assert self._reader is not None
        (n,) = _U64.unpack(await self._reader.readexactly(8))
        return await self._reader.readexactly(n) if n else b""

    async def set(self, key: str, value: bytes, *, timed: bool = True) -> None:
        """SET (no reply). ``timed``: a PING after it, so that its latency is measured to its
        execution (the steady load's figures); without, nothing more is sent, as by a real
        node's client (the round's sets: a PING each would be a request and a reply more per
        node than a real round costs the store's host)."""
        message = _U8.pack(QueryType.SET) + _key(key) + _blob(value)
        if not timed:
            assert self._writer is not None
            self._writer.write(message)
            return
        await self._ask("set", message + _U8.pack(QueryType.PING) + _U32.pack(0), 4)

    async def add(self, key: str, amount: int) -> int:
        """ADD: the new value."""
        return int(_I64.unpack(await self._ask("add", _U8.pack(QueryType.ADD) + _key(key) + _I64.pack(amount), 8))[0])

    async def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """COMPARE_SET: the value now stored."""
        assert self._writer is not None
        start = time.perf_counter()
        self._writer.write(_U8.pack(QueryType.COMPARE_SET) + _key(key) + _blob(expected) + _blob(desired))
        value = await self._blob_reply()
        self._note("compare_set", start)
        return value

    async def check(self, keys: list[str]) -> bool:
        """CHECK: whether every key exists."""
        reply = await self._ask("check", _U8.pack(QueryType.CHECK) + _keys(keys), 1)
        return reply[0] == CheckResponse.READY

    async def wait(self, keys: list[str], timeout: float) -> bool:
        """WAIT up to ``timeout`` seconds (CANCEL_WAIT after it); whether the keys exist."""
        assert self._reader is not None and self._writer is not None
        self._writer.write(_U8.pack(QueryType.WAIT) + _keys(keys))
        try:
            reply = await asyncio.wait_for(self._reader.readexactly(1), timeout)
        except asyncio.TimeoutError:
            self._writer.write(_U8.pack(QueryType.CANCEL_WAIT))
            reply = await self._reader.readexactly(1)
            if reply[0] == WaitResponse.STOP_WAITING:  # it finished just before the cancel
                await self._reader.readexactly(1)
                return True
            return False
        return reply[0] == WaitResponse.STOP_WAITING

    async def wait_in_slices(self, keys: list[str]) -> None:
        """Wait for ``keys`` in slices of :attr:`wait_slice` seconds, as the rendezvous does."""
        while not await self.wait(keys, self.wait_slice):
            pass

    async def get(self, key: str, *, wait: bool = True) -> bytes:
        """GET after waiting for the key, as the clients do (``wait`` false: a key known to
        exist, read at once, as :meth:`~launcher.rendezvous.store_ops.StoreOps.get_present`)."""
        if wait:
            await self.wait_in_slices([key])
        assert self._writer is not None
        start = time.perf_counter()
        self._writer.write(_U8.pack(QueryType.GET) + _key(key))
        value = await self._blob_reply()
        self._note("get", start)
        return value

    async def multi_set(self, keys: list[str], values: list[bytes]) -> None:
        """MULTI_SET (no reply, as a real node's client)."""
        assert self._writer is not None
        body = b"".join(_key(k) + _blob(v) for k, v in zip(keys, values, strict=True))
        self._writer.write(_U8.pack(QueryType.MULTI_SET) + _I64.pack(len(keys)) + body)

    async def multi_get(self, keys: list[str]) -> list[bytes]:
        """MULTI_GET after waiting for every key."""
        await self.wait_in_slices(keys)
        assert self._writer is not None
        self._writer.write(_U8.pack(QueryType.MULTI_GET) + _keys(keys))
        return [await self._blob_reply() for _ in keys]


@dataclass
class SteadyLoad:
    """What each node sends per interval while its workers run (defaults: launcher's)."""

    #: The heartbeat ring: a node reads its neighbour's counter every tick, beats every interval.
    tick_s: float = 1.0
    keep_alive_s: float = 5.0
    #: Status publishing: one record per node per interval (``status/<rank>`` in the round's keys).
    status_s: float = 2.0
    status_bytes: int = 1500
    #: Straggler summaries, aggregated: a node writes its summary and reads the one verdict.
    straggler_s: float = 5.0
    straggler_bytes: int = 1600


@dataclass
class Crowd:
    """``count`` simulated nodes (``first`` ... of ``nodes`` in all) of run ``run_id``."""

    host: str
    port: int
    run_id: str
    nodes: int
    first: int
    count: int
    local_world_size: int = 8
    #: Longest single wait: ``None``, the rendezvous's own for a round this size
    #: (:func:`~launcher.rendezvous.store_ops.wait_slice_for`, default settings).
    wait_slice: float | None = None
    #: ``--topology``: the nodes spread over this many domains (node ``i`` in domain ``i % domains``,
    #: path ``spine0.dom<d>``), a path in every record; 0: none (torchrun's order).
    domains: int = 0
    #: ``--segment N`` (needs ``domains``): the round is formed of whole segments of N nodes of one
    #: domain, closed by the node that completes its last one (``nodes`` a multiple of N in each
    #: domain then, so that every node takes part).
    segment: int | None = None
    clients: list[CrowdClient] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    #: When the phases of :meth:`join` ended in this crowd (monotonic), for a benchmark's timeline.
    marks: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.keys = RendezvousKeys(self.run_id)
        if self.wait_slice is None:
            config = DynamicRendezvousConfig()
            self.wait_slice = wait_slice_for(self.nodes, config.keep_alive_interval, config.liveness_timeout)

    def descriptor(self, i: int) -> NodeDescriptor:
        """Node ``i``'s descriptor: a host of its own (an address in 10.0.0.0/8), as on a cluster."""
        return NodeDescriptor(f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", 10_000 + i, 0)

    async def connect(self, parallel: int = 64) -> None:
        """Connect every node's client (not part of any measurement)."""
        gate = asyncio.Semaphore(parallel)

        async def one() -> CrowdClient:
            async with gate:
                assert self.wait_slice is not None
                client = CrowdClient(wait_slice=self.wait_slice)
                await client.connect(self.host, self.port)
                return client

        self.clients = list(await asyncio.gather(*(one() for _ in range(self.count))))

    async def join(self) -> float:
        """Every node joins the first round; when the last one had its place (monotonic)."""
        self.ranks = [-1] * self.count
        done = await asyncio.gather(*(self._join(k) for k in range(self.count)))
        return max(done)

    async def _join(self, k: int) -> float:
        client, me = self.clients[k], self.descriptor(self.first + k)
        r = int(await client.compare_set(self.keys.current, b"", b"0"))
        index = await client.add(self.keys.seq(r), 1)
        if index > self.nodes:
            raise RuntimeError(f"node {me.id} took index {index} of a round of {self.nodes}: another run's keys?")
        i = self.first + k
        path = ("spine0", f"dom{i % self.domains}") if self.domains else None
        await client.set(self.keys.node(r, index), me.record(is_host=False, was_rank0=False,
                                                             local_world_size=self.local_world_size,
                                                             topo=location_record(path, i) if path else None),
                         timed=False)
        self.marks["recorded"] = max(self.marks.get("recorded", 0.0), time.monotonic())
        # With --segment too the MAX-th node closes: every domain holds whole segments here (as
        # Rounds does, it counts the records it reads to seal; the nodes before it count nothing).
        full = index == self.nodes
        if full:  # the round is full: this node closes it
            self.marks["closer_start"] = time.monotonic()
            records = await client.multi_get([self.keys.node(r, i) for i in range(1, self.nodes + 1)])
            nodes = [{**decode(raw), "idx": i} for i, raw in enumerate(records, start=1)]
            tally = segment_tally(nodes, self.segment) if self.segment is not None else None
            value = sealed_value(nodes, self.nodes, self.nodes, stable_rank0=False, closer=me.id,
                                 segment=self.segment, max_nodes=self.nodes)
            await client.compare_set(self.keys.roster(r), b"", encode_large(value))
            await client.multi_set([self.keys.place(r, i) for i in range(1, self.nodes + 1)], places(value))
            await client.compare_set(self.keys.sealed(r), b"", encode(sealed_summary(value)))
            self.marks["sealed"] = time.monotonic()
            if tally is not None:  # for nodes beyond MAX (there are none here), after the seal
                await client.set(self.keys.tally(r), encode(tally), timed=False)
        state = decode(await client.get(self.keys.sealed(r)))
        place = decode(await client.get(self.keys.place(r, index), wait=False))
        self.marks["read"] = max(self.marks.get("read", 0.0), time.monotonic())
        rank = place["rank"]
        if state.get("state") != "sealed" or not isinstance(rank, int):
            raise RuntimeError(f"node {me.id} has no place in round {r}: {state}, {place}")
        self.ranks[k] = rank
        self.round = r
        if rank == 0:
            await client.set(self.keys.master(r), json.dumps([me.addr, 29500]).encode(), timed=False)
        else:
            json.loads(await client.get(self.keys.master(r)))
        return time.monotonic()

    def assume_round(self) -> None:
        """Take group ranks ``first ...`` in round 0 without forming it: the steady load alone."""
        self.ranks = [self.first + k for k in range(self.count)]
        self.round = 0

    async def steady(self, seconds: float, load: SteadyLoad | None = None) -> dict[str, list[float]]:
        """Every node sends its per-interval requests for ``seconds``; each request's latency.
        The nodes must have joined a round (:meth:`join`) or taken ranks (:meth:`assume_round`)."""
        load = load or SteadyLoad()
        self.latencies = defaultdict(list)
        for client in self.clients:
            client.latencies = self.latencies
        end = time.monotonic() + seconds
        await asyncio.gather(*(self._steady(k, load, end) for k in range(self.count)))
        return self.latencies

    async def _steady(self, k: int, load: SteadyLoad, end: float) -> None:
        client, rank, r = self.clients[k], self.ranks[k], self.round
        agent = self.keys.agent(r)
        status = b"s" * load.status_bytes
        summary = b"t" * load.straggler_bytes
        # Spread the nodes over the first interval, as agents that started at different times are.
        now = time.monotonic()
        start = now + random.uniform(0, load.tick_s)
        due = {"tick": start, "beat": start, "status": now + random.uniform(0, load.status_s),
               "straggler": now + random.uniform(0, load.straggler_s)}
        while True:
            what = min(due, key=due.__getitem__)
            if due[what] >= end:
                return
            await asyncio.sleep(max(0.0, due[what] - time.monotonic()))
            if what == "tick":
                await client.add(self.keys.heartbeat(r, (rank + 1) % self.nodes), 0)
                due["tick"] += load.tick_s
            elif what == "beat":
                await client.add(self.keys.heartbeat(r, rank), 1)
                due["beat"] += load.keep_alive_s
            elif what == "status":
                await client.set(f"{agent}status/{rank}", status)
                due["status"] += load.status_s
            else:
                await client.set(f"{agent}stragglers/{rank}", summary)
                if rank == 0:  # the aggregating node publishes the one verdict everybody reads
                    await client.set(f"{agent}stragglers/verdict", b"v" * 200)
                if await client.check([f"{agent}stragglers/verdict"]):
                    await client.get(f"{agent}stragglers/verdict")
                due["straggler"] += load.straggler_s

    def close(self) -> None:
        """Close every connection (on the crowd's loop, before it ends)."""
        for client in self.clients:
            client.close()
