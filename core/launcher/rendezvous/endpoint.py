"""Parsing ``host[:port]`` endpoints, IPv6 included, and checking host names' syntax.

Syntax only: a malformed endpoint is a usage error found before anything starts. Whether a
well-formed host name resolves is a run-time question (a peer's DNS name may appear only when
its pod does), answered by the backend when it connects. Writing an endpoint back as text and
telling loopback hosts apart is :mod:`launcher.addresses`, shared with the store.
"""

from __future__ import annotations

import re

from launcher.addresses import format_address, is_loopback
from launcher.errors import UsageError
from launcher.values import quote

__all__ = ["check_host", "format_endpoint", "is_loopback", "parse_endpoint"]

#: ``host:port`` with brackets around IPv6 hosts: the same function as the store's
#: :func:`~launcher.addresses.format_address`, under the name the rendezvous code uses.
format_endpoint = format_address

# RFC 1123 labels, plus "_" (seen in container and cloud host names); ASCII only.
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")


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
