"""One loopback check and one ``host:port`` writer, shared by the rendezvous and the store."""

from __future__ import annotations

import pytest
from launcher.addresses import format_address, is_loopback
from launcher.rendezvous import endpoint
from launcher.store import protocol


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LOCALHOST",
        "localhost.",
        "localhost.localdomain",
        "ip6-localhost",
        "127.0.0.1",
        "127.1.2.3",
        "::1",
        "[::1]",
        "::1%lo",
        "0:0:0:0:0:0:0:1",
        "::ffff:127.0.0.1",
        "::FFFF:127.9.9.9",
    ],
)
def test_loopback(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host",
    ["", "10.0.0.1", "128.0.0.1", "127.example.com", "::", "::2", "::ffff:10.0.0.1", "node-a", "localhost-2"],
)
def test_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_one_address_writer() -> None:
    assert endpoint.format_endpoint is format_address
    assert protocol.format_address is format_address
    assert endpoint.is_loopback is is_loopback
    assert format_address("::1", 29500) == "[::1]:29500"
    assert format_address("node-a", 1) == "node-a:1"


def test_lookup_name_passes_ascii_names_as_bytes_and_resolves_them():
    import socket

    from launcher.addresses import lookup_name

    assert lookup_name("localhost") == b"localhost"
    assert lookup_name("127.0.0.1") == b"127.0.0.1"
    assert lookup_name("bücher.example") == "bücher.example"  # left to the IDNA codec
    assert socket.getaddrinfo(lookup_name("localhost"), None, type=socket.SOCK_STREAM)
