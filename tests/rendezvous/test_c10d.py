"""The c10d backend: endpoint parsing, is_host detection, serving and reaching launcher's TCPStore,
leaving without writing to a closed store, and never importing torch (but for store_type=file)."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from launcher.rendezvous.api import RendezvousConfigError, RendezvousError, RendezvousParameters
from launcher.rendezvous.c10d import DEFAULT_PORT, create_handler, is_local_host, parse_c10d_endpoint
from launcher.rendezvous.dynamic import DynamicRendezvousHandler

from .conftest import rendezvous_all

pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.timeout(60)

FAST = {"join_timeout": "20", "last_call_timeout": "0.5", "keep_alive_interval": "0.2", "heartbeat_timeout": "1"}


def _free_port(host: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _params(endpoint: str, run_id: str = "c10d-test", nodes: int = 2, **config: str) -> RendezvousParameters:
    return RendezvousParameters(
        backend="c10d",
        endpoint=endpoint,
        run_id=run_id,
        min_nodes=nodes,
        max_nodes=nodes,
        local_addr="127.0.0.1",
        config={**FAST, **config},
    )


@pytest.fixture
def handlers() -> Iterator[list[DynamicRendezvousHandler]]:
    made: list[DynamicRendezvousHandler] = []
    yield made
    for handler in reversed(made):  # clients first, the serving node last
        handler.shutdown()


# -- endpoints ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("node1:1234", ("node1", 1234)),
        ("node1", ("node1", DEFAULT_PORT)),
        ("10.0.0.1:29500", ("10.0.0.1", 29500)),
        ("[::1]:29400", ("::1", 29400)),
        ("[fe80::1]", ("fe80::1", DEFAULT_PORT)),
        ("::1", ("::1", DEFAULT_PORT)),
        (" localhost:0 ", ("localhost", 0)),
    ],
)
def test_endpoint_parsing(endpoint: str, expected: tuple[str, int]) -> None:
    assert parse_c10d_endpoint(endpoint) == expected


@pytest.mark.parametrize("endpoint", ["node1:http", "node1:70000", "[::1:29400", "[::1]x"])
def test_invalid_endpoint_is_a_config_error(endpoint: str) -> None:
    with pytest.raises(RendezvousConfigError):
        parse_c10d_endpoint(endpoint)


def test_missing_endpoint_is_a_rendezvous_error() -> None:
    with pytest.raises(RendezvousError, match="needs --rdzv-endpoint"):
        create_handler(_params(""))


def test_local_host_detection() -> None:
    assert is_local_host("localhost")
    assert is_local_host("127.0.0.1")
    assert is_local_host("::1")
    assert is_local_host("[::1]")
    assert is_local_host(socket.gethostname())
    assert is_local_host("node-a.example", local_addr="node-a.example")
    assert not is_local_host("192.0.2.1")  # TEST-NET-1: never assigned to a real interface
    assert not is_local_host("nonexistent-host.invalid")


def test_local_host_detection_by_interface_address() -> None:
    # An address of this machine other than loopback, if it has one.
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a source address
            address = probe.getsockname()[0]
    except OSError:
        pytest.skip("no non-loopback IPv4 address")
    if address.startswith("127."):
        pytest.skip("no non-loopback IPv4 address")
    assert is_local_host(address)


# -- serving and joining --------------------------------------------------------------------------


def test_host_serves_and_others_connect(handlers: list[DynamicRendezvousHandler]) -> None:
    port = _free_port()
    endpoint = f"127.0.0.1:{port}"
    # Both guess that they are the host (loopback): the second finds the store served and connects.
    handlers += [create_handler(_params(endpoint)) for _ in range(2)]
    infos = rendezvous_all(handlers)
    assert sorted(i.group_rank for i in infos) == [0, 1]
    workers_stores = {(i.master_port, i.use_agent_store) for i in infos}
    assert len(workers_stores) == 1
    workers_port, use_agent_store = workers_stores.pop()
    assert use_agent_store and workers_port != port
    assert handlers[0].get_backend() == "c10d"
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # the rendezvous store, served on the endpoint's port
    with socket.create_connection(("127.0.0.1", workers_port), timeout=5):
        pass  # the workers' store, served by group rank 0's agent


def test_each_round_gets_a_fresh_workers_store(handlers: list[DynamicRendezvousHandler]) -> None:
    """A re-formed group must not read the previous group's keys (dead ranks' addresses)."""
    endpoint = f"127.0.0.1:{_free_port()}"
    handlers += [create_handler(_params(endpoint)) for _ in range(2)]
    first = rendezvous_all(handlers)
    second = rendezvous_all(handlers)
    assert len({i.master_port for i in first}) == len({i.master_port for i in second}) == 1
    assert first[0].master_port != second[0].master_port


def test_ipv6_endpoint(handlers: list[DynamicRendezvousHandler]) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        port = _free_port("::1")
    except OSError:
        pytest.skip("::1 is not configured")
    handlers.append(create_handler(_params(f"[::1]:{port}", is_host="1")))
    handlers.append(create_handler(_params(f"[::1]:{port}", is_host="0")))
    infos = rendezvous_all(handlers)
    assert sorted(i.group_rank for i in infos) == [0, 1]
    assert len({(i.master_addr, i.master_port) for i in infos}) == 1


def test_port_0_serves_on_a_free_port(handlers: list[DynamicRendezvousHandler]) -> None:
    handlers.append(create_handler(_params("127.0.0.1:0", nodes=1, is_host="1")))
    info = handlers[0].next_rendezvous()
    assert info.master_port > 0 and info.group_world_size == 1


def test_port_0_on_a_client_is_refused() -> None:
    with pytest.raises(RendezvousConfigError, match="port 0"):
        create_handler(_params("127.0.0.1:0", is_host="0"))


def test_unreachable_endpoint_fails_within_join_timeout() -> None:
    port = _free_port()  # nobody listens there
    started = time.monotonic()
    with pytest.raises(RendezvousError, match="cannot reach the rendezvous store") as caught:
        create_handler(_params(f"127.0.0.1:{port}", is_host="0", join_timeout="1"))
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 5, f"gave up after {elapsed:.1f} s; join_timeout is 1 s"
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert "Traceback" not in str(caught.value) and "frame #" not in str(caught.value)


def test_unresolvable_endpoint_is_a_clear_error() -> None:
    with pytest.raises(RendezvousError, match="cannot resolve the rendezvous endpoint host"):
        create_handler(_params("nonexistent-host.invalid:29400", is_host="0", join_timeout="1"))


def test_explicit_host_on_a_busy_port_is_an_error() -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(RendezvousError, match=f"cannot serve the rendezvous store on port {port}"):
            create_handler(_params(f"127.0.0.1:{port}", is_host="1"))


def test_unknown_config_key_lists_the_known_ones() -> None:
    with pytest.raises(RendezvousConfigError, match="known keys: .*join_timeout.*stable_rank0"):
        create_handler(_params("127.0.0.1:29400", lats_call_timeout="1"))


def test_file_store(tmp_path: Path, handlers: list[DynamicRendezvousHandler]) -> None:
    path = str(tmp_path / "rdzv-store")
    handlers += [create_handler(_params(path, store_type="file")) for _ in range(2)]
    infos = rendezvous_all(handlers)
    assert sorted(i.group_rank for i in infos) == [0, 1]
    # A FileStore cannot serve workers: group rank 0's agent serves their store.
    assert infos[0].use_agent_store  # rank 0's agent serves the workers' store
    assert len({(i.master_addr, i.master_port) for i in infos}) == 1


_ALL_REDUCE = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"rank {dist.get_rank()} all_reduce ok {value.item():.0f}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_file_store_from_the_command_line(tmp_path: Path) -> None:
    """``--rdzv-conf store_type=file``: the endpoint is a path, not host:port; two agents
    rendezvous through the file and their workers all_reduce."""
    from tests.conftest import LAUNCHER, launcher_env

    script = tmp_path / "all_reduce.py"
    script.write_text(_ALL_REDUCE)
    store = tmp_path / "shared dir" / "rdzv-store"  # a path no host:port parser would accept
    store.parent.mkdir()
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", str(store),
            "--rdzv-id", "file-job", "--rdzv-conf", "store_type=file,last_call_timeout=1,join_timeout=60",
            "--local-addr", "127.0.0.1", "--monitor-interval", "0.2", str(script)]
    env = launcher_env({"OMP_NUM_THREADS": "1"})
    agents = [subprocess.Popen([*LAUNCHER, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for _ in range(2)]
    try:
        outputs = [agent.communicate(timeout=150) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    for agent, (_, err) in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, err
    assert sorted(line.split("]:", 1)[-1] for out, _ in outputs for line in out.splitlines()
                  if "all_reduce ok" in line) == ["rank 0 all_reduce ok 3", "rank 1 all_reduce ok 3"]
    # Without a path it is a usage error, before anything starts.
    missing = subprocess.run([*LAUNCHER, "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-conf", "store_type=file",
                              str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "store_type=file needs --rdzv-endpoint" in missing.stderr, missing.stderr


# -- no torch, and a clean exit ----------------------------------------------------------------------

_NO_TORCH = """
import json, socket, sys
from launcher.rendezvous.api import RendezvousParameters
from launcher.rendezvous.c10d import create_handler
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
params = RendezvousParameters("c10d", f"127.0.0.1:{port}", "no-torch", 1, 1, "127.0.0.1", {"is_host": "1"})
handler = create_handler(params)
info = handler.next_rendezvous()
handler.set_closed(); handler.shutdown()
print(json.dumps({"torch": "torch" in sys.modules, "world": info.group_world_size}))
"""


def test_c10d_agent_side_never_imports_torch() -> None:
    out = subprocess.run([sys.executable, "-c", _NO_TORCH], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"torch": False, "world": 1}


def test_host_serves_until_every_participant_left(
    handlers: list[DynamicRendezvousHandler], caplog: pytest.LogCaptureFixture
) -> None:
    """The store's host keeps serving in shutdown() until the other node has left; the other
    node's last write (leaving) meets a live store: no warning on either side."""
    port = _free_port()
    host = create_handler(_params(f"127.0.0.1:{port}", is_host="1", close_timeout="60"))
    client = create_handler(_params(f"127.0.0.1:{port}", is_host="0"))
    handlers += [client, host]
    rendezvous_all([host, client])
    host.set_closed()
    caplog.set_level(logging.INFO, logger="launcher.rendezvous")
    done = threading.Event()
    waiting = threading.Thread(target=lambda: (host.shutdown(), done.set()), daemon=True)
    waiting.start()
    # However long we look, the host does not stop serving while the client has not left.
    assert not done.wait(1.0)
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    assert client.shutdown()
    assert done.wait(30), "the host did not stop serving once every node had left"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_host_whose_last_rendezvous_failed_still_serves_until_the_others_left(
    handlers: list[DynamicRendezvousHandler],
) -> None:
    """The host re-forms, but the other node never comes (it waits at its exit barrier, say):
    the host's next round times out, and it still serves until that node has left round 0."""
    from launcher.rendezvous.api import RendezvousTimeoutError

    port = _free_port()
    host = create_handler(_params(f"127.0.0.1:{port}", is_host="1", close_timeout="60", join_timeout="2"))
    client = create_handler(_params(f"127.0.0.1:{port}", is_host="0", close_timeout="60", join_timeout="2"))
    handlers += [client, host]
    rendezvous_all([host, client])
    with pytest.raises(RendezvousTimeoutError):
        host.next_rendezvous()
    host.set_closed()
    done = threading.Event()
    threading.Thread(target=lambda: (host.shutdown(), done.set()), daemon=True).start()
    assert not done.wait(1.0)  # the client has not left round 0 yet
    assert client.shutdown()
    assert done.wait(30), "the host did not stop serving once the other node had left"


def test_store_problem_names_a_store_that_is_gone(handlers: list[DynamicRendezvousHandler]) -> None:
    port = _free_port()
    host = create_handler(_params(f"127.0.0.1:{port}", is_host="1", close_timeout="1"))
    client = create_handler(_params(f"127.0.0.1:{port}", is_host="0"))
    handlers.append(client)
    rendezvous_all([host, client])
    assert client.store_problem() is None
    assert client.store_location() == f"the rendezvous store on 127.0.0.1:{port} (node 0)"
    host.set_closed()
    host.shutdown()  # gives up waiting after close_timeout: the client never leaves
    assert "refused" in (client.store_problem() or "").lower()
    client.abandon_store()  # its shutdown (by the fixture) then writes nothing
