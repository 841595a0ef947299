"""--rdzv-endpoint and --rdzv-conf for the etcd backend: parsing, torchrun's names, errors (no etcd)."""

from __future__ import annotations

from pathlib import Path

import pytest
from etcd_helpers import node_params
from launcher.rendezvous.api import RendezvousConfigError
from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.rendezvous.keys import RendezvousKeys
from launcher_etcd.backend import owned_by_node
from launcher_etcd.settings import (
    ALL_CONFIG_KEYS,
    Endpoint,
    EtcdSettings,
    default_lease_ttl,
    parse_endpoints,
    rendezvous_config,
)


def settings(endpoint: str = "h1:2379", backend: str = "etcd", environ: dict[str, str] | None = None,
             **conf: str) -> EtcdSettings:  # fmt: skip
    params = node_params(endpoint, "job/1", backend=backend, **conf)
    return EtcdSettings.from_parameters(params, environ=environ or {})


def test_endpoints_several_with_default_port_ipv6_and_scheme() -> None:
    endpoints, scheme = parse_endpoints("a.example, b.example:2400,[::1]:2500,10.0.0.1")
    assert endpoints == (
        Endpoint("a.example", 2379),
        Endpoint("b.example", 2400),
        Endpoint("::1", 2500),
        Endpoint("10.0.0.1", 2379),
    )
    assert scheme is None
    assert str(endpoints[2]) == "[::1]:2500" and endpoints[2].url("https") == "https://[::1]:2500"
    assert parse_endpoints("https://h:1,https://g:2/") == ((Endpoint("h", 1), Endpoint("g", 2)), "https")


@pytest.mark.parametrize(
    ("endpoint", "error", "words"),
    [
        ("", RendezvousConfigError, "needs --rdzv-endpoint"),
        (" , ", RendezvousConfigError, "names no etcd member"),
        (":::", RendezvousConfigError, "not an IPv6 address"),
        ("a b:1", RendezvousConfigError, "not a host name"),
        ("http://a:1,https://b:2", RendezvousConfigError, "mixes"),
        ("ftp://a:1", RendezvousConfigError, "not supported"),
        ("a:0", RendezvousConfigError, "cannot be 0"),
        ("a:notaport", RendezvousConfigError, "invalid port"),
    ],
)
def test_bad_endpoints_are_one_line_errors(endpoint: str, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words) as info:
        parse_endpoints(endpoint)
    assert "\n" not in str(info.value)


def test_defaults_prefix_per_job_and_lease_from_heartbeat() -> None:
    s = settings()
    assert s.protocol == "http" and s.username is None and s.ca_cert is None
    assert s.prefix == "/launcher/job%2F1/"  # the run id is quoted: "/" cannot reach another job's keys
    assert s.read_timeout == 15.0
    # heartbeat_timeout=2 in the FAST settings: 1.5 * (2 + 1) = 4.5 -> 5
    assert s.lease_ttl == 5
    assert default_lease_ttl(DynamicRendezvousConfig()) == 24  # 1.5 * (5 * 3 + 1)
    assert settings(etcd_prefix="/torchelastic/p2p").prefix == "/torchelastic/p2p/"
    assert settings(lease_ttl="7.2").lease_ttl == 8


@pytest.mark.parametrize(
    ("ca", "cert", "key"),
    [("cacert", "cert", "key"), ("ca_cert", "ssl_cert", "ssl_cert_key")],
    ids=["legacy-etcd-names", "etcd-v2-names"],
)
def test_tls_keys_in_both_torchrun_spellings(tmp_path: Path, ca: str, cert: str, key: str) -> None:
    for name in ("ca.pem", "c.pem", "k.pem"):
        (tmp_path / name).write_text("x")
    conf = {ca: str(tmp_path / "ca.pem"), cert: str(tmp_path / "c.pem"), key: str(tmp_path / "k.pem")}
    s = EtcdSettings.from_parameters(node_params("h1:2379", "job/1", **conf), environ={})
    assert s.protocol == "https"  # implied by the TLS files
    assert (s.ca_cert, s.client_cert, s.client_key) == tuple(str(tmp_path / n) for n in ("ca.pem", "c.pem", "k.pem"))
    assert s.urls == ["https://h1:2379"]


def test_tls_mistakes(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("x")
    with pytest.raises(RendezvousConfigError, match="no such file"):
        settings(cacert=str(tmp_path / "missing.pem"))
    with pytest.raises(RendezvousConfigError, match="cert and key go together"):
        settings(cert=str(tmp_path / "c.pem"))
    with pytest.raises(RendezvousConfigError, match="protocol=http"):
        settings(cacert=str(tmp_path / "c.pem"), protocol="http")
    with pytest.raises(RendezvousConfigError, match="one setting"):
        settings(cacert=str(tmp_path / "c.pem"), ca_cert="/other")
    with pytest.raises(RendezvousConfigError, match="contradicts"):
        settings(endpoint="https://h:1", protocol="http")
    with pytest.raises(RendezvousConfigError, match="use http or https"):
        settings(protocol="grpc")


def test_credentials_from_conf_or_environment() -> None:
    s = settings(username="alice", password="pw")
    assert (s.username, s.password) == ("alice", "pw")
    s = settings(environ={"LAUNCHER_ETCD_USERNAME": "bob", "LAUNCHER_ETCD_PASSWORD": "secret"})
    assert (s.username, s.password) == ("bob", "secret")
    with pytest.raises(RendezvousConfigError, match="without a password"):
        settings(username="alice")
    with pytest.raises(RendezvousConfigError, match="password without username"):
        settings(password="pw")


def test_unknown_and_c10d_only_keys_are_refused_with_the_list() -> None:
    with pytest.raises(RendezvousConfigError, match="'lease_tll' is unknown.*lease_ttl"):
        rendezvous_config(node_params("h", "j", lease_tll="3"))
    # c10d's store choice and host flag mean nothing over etcd; nor does the admission to a store
    # an agent serves (etcd's own authentication guards the rendezvous keys).
    assert "store_type" not in ALL_CONFIG_KEYS and "is_host" not in ALL_CONFIG_KEYS
    assert "join_networks" not in ALL_CONFIG_KEYS and "secret_file" not in ALL_CONFIG_KEYS
    with pytest.raises(RendezvousConfigError, match="'secret_file' is unknown"):
        rendezvous_config(node_params("h", "j", secret_file="/etc/launcher/rdzv.secret"))
    assert {"join_timeout", "last_call_timeout", "heartbeat_timeout", "read_timeout", "etcd_prefix"} <= ALL_CONFIG_KEYS


def test_timeout_is_the_join_timeout_for_etcd_and_ignored_for_etcd_v2() -> None:
    base = {"timeout": "77"}
    assert rendezvous_config(node_params("h", "j", backend="etcd", join_timeout="", **base)).join_timeout == 77
    assert rendezvous_config(node_params("h", "j", backend="etcd-v2", join_timeout="", **base)).join_timeout == 600
    # join_timeout, when given, wins.
    assert rendezvous_config(node_params("h", "j", backend="etcd", join_timeout="5", **base)).join_timeout == 5


def test_owned_keys_are_exactly_the_cores_per_node_keys() -> None:
    # Built with the core's own key names: this fails if the core renames them.
    keys = RendezvousKeys("job/with/slashes")
    assert owned_by_node(keys.node(3, 17)) and owned_by_node(keys.heartbeat(0, 0))
    for shared in (keys.seq(3), keys.sealed(3), keys.roster(3), keys.place(3, 17), keys.current, keys.closed,
                   keys.lost(3, 1), keys.lost_count(3), keys.rejoin(3), keys.master(3), keys.open(4),
                   keys.agent(3) + "x"):  # fmt: skip
        assert not owned_by_node(shared), shared
