"""Host addresses as text: ``host:port`` with IPv6 in brackets, and whether a host is loopback.

Shared by the store (which must not depend on the rendezvous) and the rendezvous endpoints, so
an address reads the same in every message and every loopback check agrees. Standard library
only, and cheap to import: the command line's path uses it.
"""

from __future__ import annotations

__all__ = ["LOOPBACK_NAMES", "format_address", "is_loopback", "lookup_name"]

#: Host names that mean this machine's loopback interface (as /etc/hosts conventionally has them).
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def format_address(host: str, port: int) -> str:
    """``host:port``, with IPv6 literals in brackets (``[::1]:29500``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def lookup_name(host: str) -> str | bytes:
    """``host`` as :func:`socket.getaddrinfo` should get it: an ASCII name as bytes, passed on
    as is; other names as text, which the socket module encodes with the IDNA codec. Loading that
    codec costs milliseconds, which every launch would pay for ``localhost`` otherwise."""
    return host.encode("ascii") if host.isascii() else host


def is_loopback(host: str) -> bool:
    """Whether ``host`` names the loopback interface without a name lookup.

    True for the names in :data:`LOOPBACK_NAMES` (any case, a trailing dot allowed), IPv4
    ``127.0.0.0/8``, IPv6 ``::1`` and IPv4-mapped ``::ffff:127.x.y.z``; brackets around an IPv6
    literal and a zone (``%lo``) are ignored. A name that merely resolves to loopback is not
    recognised: that takes a lookup, which callers that need it do themselves.
    """
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name.rstrip(".") in LOOPBACK_NAMES:
        return True
    import ipaddress  # only for literals: names are answered above without it

    try:
        ip = ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback
