"""Fail-over in a three-member cluster, TLS with client certificates, auth, and clear errors."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from etcd_helpers import make_store, node_params
from etcd_servers import EtcdCluster, TLSFiles, free_ports
from launcher.rendezvous.api import RendezvousError
from launcher_etcd.backend import create_handler

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def handlers() -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def make(params: Any) -> Any:
        made.append(create_handler(params))
        return made[-1]

    yield make
    for handler in made:
        handler.shutdown()


def rendezvous_all(nodes: list[Any]) -> list[Any]:
    results: list[Any] = [None] * len(nodes)

    def run(i: int) -> None:
        try:
            results[i] = nodes[i].next_rendezvous()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(nodes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def one_line_error(params: Any, within: float) -> str:
    """The RendezvousError that building a handler raises, checked to be quick and one line."""
    start = time.monotonic()
    with pytest.raises(RendezvousError) as info:
        create_handler(params)
    assert time.monotonic() - start < within, f"took {time.monotonic() - start:.1f} s"
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    print(message)  # shown with -s: what a user reads
    return message


# -- a three-member cluster ----------------------------------------------------------------------


def test_store_fails_over_when_the_member_in_use_is_killed(etcd_cluster: Callable[..., EtcdCluster]) -> None:
    cluster = etcd_cluster(3)
    prefix = f"/failover/{uuid.uuid4().hex[:6]}/"
    store = make_store(cluster.endpoints, prefix, read_timeout=15)
    other = make_store(",".join(reversed(cluster.endpoints.split(","))), prefix, read_timeout=15)
    try:
        store.set("before", b"1")
        assert store.add("n", 1) == 1
        woke: list[bytes] = []
        waiter = threading.Thread(target=lambda: woke.append(store.get("during", timeout=20)), daemon=True)
        waiter.start()
        time.sleep(0.5)  # the waiter watches through member 0...
        cluster.members[0].kill()  # ...which dies without a word
        start = time.monotonic()
        other.set("during", b"2")
        waiter.join(20)
        assert woke == [b"2"], "the waiter was not woken through another member"
        assert store.get("before") == b"1"
        assert store.add("n", 1) == 2  # exactly once, across the fail-over
        store.multi_set(["a", "b"], [b"x", b"y"])
        assert other.multi_get(["a", "b"]) == [b"x", b"y"]
        assert time.monotonic() - start < 15
    finally:
        store.close(revoke=True)
        other.close(revoke=True)


def test_rendezvous_completes_with_one_member_of_three_killed(
    etcd_cluster: Callable[..., EtcdCluster], handlers: Callable[..., Any]
) -> None:
    cluster = etcd_cluster(3)
    params = node_params(cluster.endpoints, "failover-job", "3", read_timeout="20")
    nodes = [handlers(params) for _ in range(3)]
    results: list[Any] = [None, None]

    def run(i: int) -> None:
        try:
            results[i] = nodes[i].next_rendezvous()
        except BaseException as exc:
            results[i] = exc

    early = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for thread in early:
        thread.start()
    time.sleep(1.0)
    cluster.members[0].kill()  # the first endpoint every node was using
    third = nodes[2].next_rendezvous()
    for thread in early:
        thread.join(30)
    assert not any(isinstance(r, BaseException) for r in results), results
    infos = [*results, third]
    assert sorted(i.group_rank for i in infos) == [0, 1, 2]
    # The round's heartbeats go on through the two members left.
    time.sleep(2.5)
    assert all(node.lost_nodes() == [] for node in nodes)


# -- TLS -----------------------------------------------------------------------------------------


def test_tls_with_client_certificates(
    etcd_cluster: Callable[..., EtcdCluster], tls_files: TLSFiles, handlers: Callable[..., Any]
) -> None:
    cluster = etcd_cluster(1, tls=tls_files)
    # torchrun's etcd-v2 spellings here; the legacy spellings are checked below.
    conf = {"ca_cert": str(tls_files.ca), "ssl_cert": str(tls_files.client_cert),
            "ssl_cert_key": str(tls_files.client_key)}  # fmt: skip
    nodes = [handlers(node_params(cluster.endpoint, "tls-job", "2", backend="etcd-v2", **conf)) for _ in range(2)]
    infos = rendezvous_all(nodes)
    assert sorted(i.group_rank for i in infos) == [0, 1]

    legacy = {"cacert": str(tls_files.ca), "cert": str(tls_files.client_cert), "key": str(tls_files.client_key)}
    base = node_params(f"https://{cluster.endpoint}", "tls-job-2", "2", read_timeout="3", **legacy)
    handlers(base)  # connects

    wrong_ca = node_params(
        cluster.endpoint, "tls-job", "2", read_timeout="3", **dict(legacy, cacert=str(tls_files.other_ca))
    )
    message = one_line_error(wrong_ca, within=3)
    assert "TLS with etcd at" in message and "certificate verify failed" in message.lower()

    no_client_cert = node_params(cluster.endpoint, "tls-job", "2", read_timeout="3", cacert=str(tls_files.ca))
    message = one_line_error(no_client_cert, within=5)
    assert "TLS" in message or "certificate" in message

    plain_http = node_params(cluster.endpoint, "tls-job", "2", read_timeout="3")
    message = one_line_error(plain_http, within=5)
    assert "HTTPS" in message or "protocol" in message


# -- authentication ------------------------------------------------------------------------------


def test_auth_user_password_token_renewal_and_clear_refusals(
    etcd_cluster: Callable[..., EtcdCluster], handlers: Callable[..., Any]
) -> None:
    # Tokens that expire after 2 s: the clients must authenticate again on their own.
    cluster = etcd_cluster(1, extra_args=["--auth-token", "simple", "--auth-token-ttl", "2"])
    cluster.enable_auth({"alice": "alicepw"}, prefix="/launcher/")
    good = node_params(cluster.endpoint, "auth-job", "2", username="alice", password="alicepw")
    nodes = [handlers(good) for _ in range(2)]
    infos = rendezvous_all(nodes)
    assert sorted(i.group_rank for i in infos) == [0, 1]
    time.sleep(3.0)  # past the token TTL
    infos[0].store.set("after-expiry", b"ok")
    assert infos[1].store.get("after-expiry") == b"ok"
    assert nodes[0].lost_nodes() == [] and nodes[1].lost_nodes() == []

    wrong = node_params(cluster.endpoint, "auth-job", "2", read_timeout="3", username="alice", password="nope")
    message = one_line_error(wrong, within=3)
    assert "rejected the credentials of user 'alice'" in message

    anonymous = node_params(cluster.endpoint, "auth-job", "2", read_timeout="3")
    assert "requires authentication" in one_line_error(anonymous, within=3)

    elsewhere = node_params(cluster.endpoint, "auth-job", "2", read_timeout="3", username="alice",
                            password="alicepw", etcd_prefix="/not-hers/")  # fmt: skip
    message = one_line_error(elsewhere, within=3)
    assert "denied user 'alice' access to /not-hers/" in message


# -- nobody there --------------------------------------------------------------------------------


def test_unreachable_cluster_is_a_clear_error_within_read_timeout() -> None:
    closed = free_ports(2)
    endpoint = ",".join(f"127.0.0.1:{port}" for port in closed)
    message = one_line_error(node_params(endpoint, "nobody", "2", read_timeout="2"), within=4)
    assert message.startswith("etcd rendezvous 'nobody': cannot reach etcd")
    assert all(f"127.0.0.1:{port}" in message for port in closed)
    assert "within 2 s" in message and "Connection refused" in message
