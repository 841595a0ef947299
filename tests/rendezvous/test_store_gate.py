"""Who may use the stores an agent serves, as the rendezvous drives it (docs/store-security.md):
the c10d host's store restricted to each closed round's participants and reopened for the next
one, refused joiners counted as waiting nodes, the workers' store and the static backend's store
restricted to the members, and the agent's waits that never starve its heartbeats.

Everything runs on loopback, which every store admits; the refusals themselves, across hosts,
are in ``tests/store/test_admission.py`` and ``tests/multinode/test_store_admission.py``.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from launcher.rendezvous.api import RendezvousError, RendezvousParameters
from launcher.rendezvous.c10d import create_handler
from launcher.rendezvous.dynamic import DynamicRendezvousHandler
from launcher.rendezvous.gate import StoreGate, member_addresses
from launcher.rendezvous.membership import decode, sealed_addresses
from launcher.rendezvous.static import StaticRendezvous
from launcher.rendezvous.store_ops import RoundStore, StoreOps
from launcher.store.admission import Admission
from launcher.store.api import StoreTimeoutError
from launcher.store.client import TCPStoreClient
from launcher.store.server import StoreServer

from .conftest import rendezvous_all

pytestmark = pytest.mark.timeout(60)

FAST = {"join_timeout": "20", "last_call_timeout": "0.5", "keep_alive_interval": "0.2", "heartbeat_timeout": "1"}
LOOPBACK = ipaddress.ip_address("127.0.0.1")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _params(endpoint: str, min_nodes: int = 2, max_nodes: int = 2, **config: str) -> RendezvousParameters:
    return RendezvousParameters(
        backend="c10d", endpoint=endpoint, run_id="gate-test", min_nodes=min_nodes, max_nodes=max_nodes,
        local_addr="127.0.0.1", config={**FAST, **config},
    )


@pytest.fixture
def handlers() -> Iterator[list[DynamicRendezvousHandler]]:
    made: list[DynamicRendezvousHandler] = []
    yield made
    for handler in made:
        handler.set_closed()
    for handler in reversed(made):  # clients first, the serving node last
        handler.shutdown()


def _server(handler: DynamicRendezvousHandler) -> StoreServer:
    gate = handler._gate
    assert gate is not None, "this handler serves no store"
    server = gate._server
    assert isinstance(server, StoreServer)
    return server


# -- addresses ------------------------------------------------------------------------------------


def test_member_addresses_take_literals_and_resolve_names_only_when_needed(caplog) -> None:
    got = member_addresses([["10.0.0.1"], ["no-such-name.invalid", "10.0.0.2"], ["localhost"]], "r", "the store")
    assert got is not None and {"10.0.0.1", "10.0.0.2"} <= set(got)
    assert {ipaddress.ip_address(a) for a in got} & {LOOPBACK, ipaddress.ip_address("::1")}
    # A participant with no usable address: the store stays open for the round, and says so.
    caplog.set_level(logging.WARNING, logger="launcher.rendezvous")
    assert member_addresses([["10.0.0.1"], ["no-such-name.invalid"]], "r", "the workers' store") is None
    assert "no-such-name.invalid" in caplog.text and "the workers' store admits every address" in caplog.text


def test_sealed_record_without_addresses_falls_back_to_the_ids() -> None:
    assert sealed_addresses({"ids": ["10.0.0.1_12_0", "node_a_7_1"]}) == (("10.0.0.1",), ("node_a",))
    assert sealed_addresses({"ids": ["a_1_0"], "addrs": [["a", "10.0.0.9"]]}) == (("a", "10.0.0.9"),)


class FakeServer:
    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.knocks: frozenset[Any] = frozenset()

    def restrict_to(self, addresses: Any, *, authenticated_joiners: bool = False) -> None:
        self.calls.append((None if addresses is None else sorted(addresses), authenticated_joiners))

    def knocking(self) -> frozenset[Any]:
        return self.knocks


def test_gate_restricts_each_closed_round_and_reopens_for_the_next() -> None:
    server = FakeServer()
    gate = StoreGate(server, None, "r")  # type: ignore[arg-type]
    gate.round_opened(0)
    assert server.calls == []  # nothing to lift yet
    gate.round_sealed(0, [["10.0.0.1"], ["node-b", "10.0.0.2"]])
    assert server.calls == [(["10.0.0.1", "10.0.0.2"], True)] and gate.restricted == 0
    gate.round_sealed(0, [["10.0.0.1"]])  # read again (a late node): no change
    server.knocks = frozenset({ipaddress.ip_address("10.0.0.3")})
    assert gate.new_joiners() == 1
    assert gate.new_joiners() == 0  # announced once, however long it keeps knocking
    gate.round_opened(1)
    assert server.calls[-1] == (None, False) and gate.restricted is None
    assert gate.new_joiners() == 0  # an open round admits joiners: nobody to count
    # With a secret, a joiner proves it and takes a join index: refusals are not joiners.
    secret_gate = StoreGate(server, Admission(secret=b"0123456789abcdef0123"), "r")  # type: ignore[arg-type]
    secret_gate.round_sealed(3, [["10.0.0.1"]])
    assert secret_gate.new_joiners() == 0


# -- the c10d host ------------------------------------------------------------------------------


def test_c10d_host_serves_only_the_participants_once_the_round_closed(
    handlers: list[DynamicRendezvousHandler],
) -> None:
    endpoint = f"127.0.0.1:{_free_port()}"
    host = create_handler(_params(endpoint, 2, 3, is_host="1"))
    client = create_handler(_params(endpoint, 2, 3, is_host="0"))
    handlers += [host, client]
    server = _server(host)
    assert server.members is None  # open while the round forms
    infos = rendezvous_all([host, client])
    assert server.members == {LOOPBACK}  # both participants come from 127.0.0.1
    # The round's roster names each participant's addresses.
    sealed = decode(host._ops.get(host._keys.roster(infos[0].round)))
    assert sealed["addrs"] == [["127.0.0.1"], ["127.0.0.1"]]
    # The workers' store of the round admits the participants from the start.
    rank0 = next(h for h, i in zip([host, client], infos, strict=True) if i.group_rank == 0)
    assert rank0._workers._server.members == {LOOPBACK}
    # A refused agent that could join counts as waiting (the round has room: 2 of 3), for every
    # participant: the host announces it as a late node.
    server._knocks[ipaddress.ip_address("10.1.2.3")] = time.monotonic()
    assert host.num_nodes_waiting() == 1 and client.num_nodes_waiting() == 1
    assert host.num_nodes_waiting() == 1  # announced once
    # A new round opens (a restart): the host lifts the restriction, then closes it again.
    rendezvous_all([host, client])
    assert server.members == {LOOPBACK} and host._gate is not None and host._gate.restricted == 1
    assert host.num_nodes_waiting() == 0 and client.num_nodes_waiting() == 0  # a new round: all forgotten


def test_c10d_agents_prove_the_configured_secret(
    handlers: list[DynamicRendezvousHandler], tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAUNCHER_RDZV_SECRET", "0123456789abcdef-test-secret")
    endpoint = f"127.0.0.1:{_free_port()}"
    host = create_handler(_params(endpoint, is_host="1"))
    client = create_handler(_params(endpoint, is_host="0"))
    handlers += [host, client]
    assert _server(host).admission.secret == b"0123456789abcdef-test-secret"
    assert sorted(i.group_rank for i in rendezvous_all([host, client])) == [0, 1]
    # Every agent's client proves the secret, even over loopback: another secret fails at once.
    monkeypatch.setenv("LAUNCHER_RDZV_SECRET", "another-secret-0123456789abcdef")
    start = time.monotonic()
    with pytest.raises(RendezvousError, match="does not know our secret"):
        create_handler(_params(endpoint, is_host="0"))
    assert time.monotonic() - start < 10


# -- static ------------------------------------------------------------------------------------


def test_static_rank0_serves_only_the_nodes_after_the_first_barrier() -> None:
    port = _free_port()

    def params(rank: int) -> RendezvousParameters:
        return RendezvousParameters(backend="static", endpoint=f"127.0.0.1:{port}", run_id="static-gate",
                                    min_nodes=2, max_nodes=2, local_addr="127.0.0.1",
                                    config={"rank": str(rank), "timeout": "20"})

    nodes = [StaticRendezvous(params(0)), StaticRendezvous(params(1))]
    results: list[Any] = [None, None]

    def join(index: int) -> None:
        results[index] = nodes[index].next_rendezvous()

    threads = [threading.Thread(target=join, args=(i,), daemon=True) for i in (0, 1)]
    try:
        threads[0].start()
        time.sleep(0.2)  # rank 0 first: it serves the store
        threads[1].start()
        for thread in threads:
            thread.join(30)
        assert all(r is not None for r in results)
        assert nodes[0]._server is not None and nodes[0]._server.members == {LOOPBACK}
    finally:
        for node in reversed(nodes):
            node.shutdown()


# -- the agent's waits and the heartbeats ---------------------------------------------------------


def test_round_store_waits_leave_the_connection_to_the_heartbeat() -> None:
    """The exit barrier waits on the connection the heartbeat thread uses: a heartbeat must not
    queue behind it (it did, for 1.5 s, when the wait blocked on the connection in 1 s slices)."""
    server = StoreServer("127.0.0.1", 0).start()
    client = TCPStoreClient("127.0.0.1", server.port, timeout=30)
    ops = StoreOps(client, "starve", 30.0)
    waiting = threading.Thread(
        target=lambda: pytest.raises(StoreTimeoutError, RoundStore(ops, "p/").wait, ["never"], 2.0), daemon=True
    )
    try:
        waiting.start()
        delays = []
        while waiting.is_alive():
            start = time.monotonic()
            ops.add("hb", 1)
            delays.append(time.monotonic() - start)
            time.sleep(0.05)
        assert len(delays) > 5 and max(delays) < 0.5, delays
    finally:
        client.close()
        server.close()


def test_sealed_addresses_clean_up_entries_a_closer_did_not_write_as_strings() -> None:
    state = {"ids": ["a_1_0", "b_2_0"], "addrs": [["a", ""], ["b", 7]]}
    assert sealed_addresses(state) == (("a",), ("b", "7"))
