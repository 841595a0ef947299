"""A rendezvous endpoint whose host cannot exist is a usage error before anything starts.

The resolver is faked: what matters is how each of its answers is read, not this machine's DNS.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from launcher.errors import UsageError
from launcher.rendezvous.endpoint import check_resolvable


def _resolver(monkeypatch: pytest.MonkeyPatch, answers: dict[str, object]) -> list[str]:
    """getaddrinfo answering from ``answers`` (an errno to raise, ``"hang"``, or anything for success)."""
    asked: list[str] = []

    def getaddrinfo(host: str | bytes, *args: object, **kwargs: object) -> list[tuple[object, ...]]:
        # ASCII names come as bytes (launcher.addresses.lookup_name), as the socket module allows.
        host = host.decode() if isinstance(host, bytes) else host
        asked.append(host)
        answer = answers.get(host)
        if answer == "hang":
            threading.Event().wait(2)
        if isinstance(answer, int):
            raise socket.gaierror(answer, f"error {answer}")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def test_a_name_the_resolver_says_does_not_exist_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _resolver(monkeypatch, {"nosuch": socket.EAI_NONAME})
    with pytest.raises(UsageError) as info:
        check_resolvable(["nosuch"], "rendezvous endpoint 'nosuch:29400'")
    assert str(info.value) == (
        f"rendezvous endpoint 'nosuch:29400': cannot resolve the host 'nosuch' (error {socket.EAI_NONAME}); "
        "check the name, or give an IP address if this node has no working DNS"
    )
    assert info.value.exit_code == 2


def test_the_invalid_domain_is_refused_without_asking(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _resolver(monkeypatch, {})
    with pytest.raises(UsageError, match=r"'no-such-host\.INVALID\.' \(the \.invalid domain never resolves\)"):
        check_resolvable(["no-such-host.INVALID."], "x")
    assert asked == []


@pytest.mark.parametrize(
    ("hosts", "answers"),
    [
        (["up"], {}),  # resolves
        (["flaky"], {"flaky": socket.EAI_AGAIN}),  # a temporary failure: the backend retries
        (["gone", "up"], {"gone": socket.EAI_NONAME}),  # one member that resolves is enough
        (["a.invalid", "up"], {}),
        (["localhost"], {"localhost": socket.EAI_NONAME}),  # loopback: no lookup
        (["::1"], {"::1": socket.EAI_NONAME}),
    ],
)
def test_a_host_that_may_exist_passes(monkeypatch: pytest.MonkeyPatch, hosts: list[str],
                                      answers: dict[str, object]) -> None:
    _resolver(monkeypatch, answers)
    check_resolvable(hosts, "x")


def test_every_member_unknown_lists_them_all(monkeypatch: pytest.MonkeyPatch) -> None:
    _resolver(monkeypatch, {"a": socket.EAI_NONAME, "b": getattr(socket, "EAI_NODATA", socket.EAI_NONAME)})
    with pytest.raises(UsageError, match="cannot resolve any of the hosts 'a', 'b'"):
        check_resolvable(["a", "b", "a"], "--rdzv-endpoint 'a,b'")


def test_a_slow_resolver_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    _resolver(monkeypatch, {"slow": "hang"})
    started = time.monotonic()
    check_resolvable(["slow"], "x", wait=0.2)
    assert time.monotonic() - started < 4  # returned on the wait, not on the resolver
