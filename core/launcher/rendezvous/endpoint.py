"""Parsing ``host[:port]`` endpoints, IPv6 included."""

from __future__ import annotations

from launcher.errors import UsageError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain"})


def parse_endpoint(endpoint: str, default_port: int) -> tuple[str, int]:
    """Split ``host[:port]``; IPv6 hosts are written in brackets (``[::1]:29400``).

    A bare IPv6 address without brackets (``::1``) is accepted as a host with the default port.
    """
    text = endpoint.strip()
    if not text:
        raise UsageError("the rendezvous endpoint is empty: give --rdzv-endpoint host[:port]")
    host, port_text = text, ""
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise UsageError(f"rendezvous endpoint {endpoint!r} is invalid: IPv6 looks like [::1]:29400")
        host, rest = text[1:close], text[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise UsageError(f"rendezvous endpoint {endpoint!r} is invalid: IPv6 looks like [::1]:29400")
            port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    if not host:
        raise UsageError(f"rendezvous endpoint {endpoint!r} has no host: use host[:port]")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UsageError(f"rendezvous endpoint {endpoint!r} has an invalid port: use a number 0..65535")
    return host, int(port_text)


def format_endpoint(host: str, port: int) -> str:
    """``host:port``, with brackets around IPv6 hosts."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    return host.lower() in LOOPBACK_NAMES or host.startswith("127.")
