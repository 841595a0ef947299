"""Parsing ``host[:port]`` endpoints, IPv6 included, checking host names' syntax and existence.

A malformed endpoint is a usage error found before anything starts. So is a host name that the
resolver says does not exist (:func:`check_resolvable`, asked by the backends that connect to
their endpoint): retrying it would only turn a typo into a long wait. A resolver that cannot
answer now (a temporary failure, or slower than :data:`RESOLVE_WAIT`) leaves the question to the
backend, which retries when it connects. Writing an endpoint back as text and telling loopback
hosts apart is :mod:`launcher.addresses`, shared with the store.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from launcher.addresses import format_address, is_loopback, lookup_name
from launcher.errors import UsageError
from launcher.values import quote

__all__ = ["RESOLVE_WAIT", "check_host", "check_resolvable", "format_endpoint", "is_loopback", "parse_endpoint"]

#: ``host:port`` with brackets around IPv6 hosts: the same function as the store's
#: :func:`~launcher.addresses.format_address`, under the name the rendezvous code uses.
format_endpoint = format_address

# RFC 1123 labels, plus "_" (seen in container and cloud host names); ASCII only.
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")

#: Seconds :func:`check_resolvable` waits for the resolver before leaving the question to the backend.
RESOLVE_WAIT = 3.0


def check_host(host: str, what: str) -> str:
    """``host`` if it is a host name, an IPv4 or an IPv6 address; else a one-line :class:`UsageError`.

    ``what`` names the input in the message (``rendezvous endpoint '...'``, ``--master-addr``).
    """
    if ":" in host:
        import ipaddress

        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise UsageError(f"{what}: {quote(host)} is not an IPv6 address; IPv6 looks like [::1]:29400") from None
        return host
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise UsageError(
            f"{what}: {quote(host)} is not a host name or IP address (letters, digits, '-', '_' and '.'; "
            "internationalised names in their xn-- form)"
        )
    return host


def parse_endpoint(endpoint: str, default_port: int) -> tuple[str, int]:
    """Split ``host[:port]``; IPv6 hosts are written in brackets (``[::1]:29400``).

    A bare IPv6 address without brackets (``::1``) is accepted as a host with the default port.
    Raises :class:`UsageError` for anything that is not a valid host and port 0..65535.
    """
    text = endpoint.strip()
    if not text:
        raise UsageError("the rendezvous endpoint is empty: give --rdzv-endpoint host[:port]")
    what = f"rendezvous endpoint {quote(endpoint)}"
    host, port_text = text, None
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise UsageError(f"{what} is invalid: IPv6 looks like [::1]:29400")
        host, rest = text[1:close], text[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise UsageError(f"{what} is invalid: IPv6 looks like [::1]:29400")
            port_text = rest[1:]
        if ":" not in host:
            raise UsageError(f"{what} is invalid: brackets are for IPv6 addresses, e.g. [::1]:29400")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    if not host:
        raise UsageError(f"{what} has no host: use host[:port]")
    check_host(host, what)
    if port_text is None:
        return host, default_port
    if not _PORT.fullmatch(port_text) or not 0 <= int(port_text) <= 65535:
        raise UsageError(f"{what} has an invalid port: use a number from 0 to 65535")
    return host, int(port_text)


def check_resolvable(hosts: Sequence[str], what: str, wait: float = RESOLVE_WAIT) -> None:
    """Raise a one-line :class:`UsageError` when none of ``hosts`` can exist.

    A host cannot exist when the resolver answers "no such name" (``EAI_NONAME``/``EAI_NODATA``)
    or it is in the ``.invalid`` domain, which never resolves (RFC 6761). One host that resolves,
    a temporary failure, or no answer within ``wait`` seconds is enough to go on: the backend
    retries when it connects. IP addresses and loopback names are answered without a lookup.
    """
    import socket
    import threading

    names = list(dict.fromkeys(host.strip("[]") for host in hosts))
    if not names or any(is_loopback(name) for name in names):
        return
    reasons: dict[str, str] = {}
    lookups = []
    for name in names:
        if name.lower().rstrip(".").rsplit(".", 1)[-1] == "invalid":
            reasons[name] = "the .invalid domain never resolves"
        else:
            lookups.append(name)
    definitive = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}

    def resolve() -> None:
        for name in lookups:
            try:
                socket.getaddrinfo(lookup_name(name), None, type=socket.SOCK_STREAM)
            except socket.gaierror as exc:
                if exc.errno not in definitive:
                    return  # a temporary failure: cannot tell
                reasons[name] = exc.strerror or "no such name"
            except (OSError, UnicodeError):
                return
            else:
                return  # it exists

    if lookups:
        worker = threading.Thread(target=resolve, name="launcher-resolve", daemon=True)
        worker.start()
        worker.join(wait)
        if worker.is_alive():
            return
    if len(reasons) != len(names):
        return
    listed = ", ".join(quote(name) for name in names)
    plural = "any of the hosts" if len(names) > 1 else "the host"
    raise UsageError(
        f"{what}: cannot resolve {plural} {listed} ({reasons[names[0]]}); check the name, "
        "or give an IP address if this node has no working DNS"
    )
