"""Who may use the store: address ranges, a member list, and a shared-secret handshake.

The store server asks an :class:`Admission` policy, per accepted connection, for one of three
verdicts (:class:`Verdict`): admit the peer by its address, require it to prove the shared
secret first, or refuse it. See ``docs/store-security.md`` for the threat model.

The handshake is a challenge-response over HMAC-SHA256; the secret never crosses the wire:

1. client -> server: ``u8 AUTH_HELLO`` + 32-byte client nonce ``cn``
2. server -> client: 32-byte server nonce ``sn`` + ``HMAC(secret, "launcher-store-server" | cn | sn)``
   (the server proves it knows the secret too, so a client cannot be fooled by an impostor)
3. client -> server: ``u8 AUTH_PROOF`` + ``HMAC(secret, "launcher-store-client" | sn | cn)``
4. server: compares with :func:`hmac.compare_digest`; a wrong proof closes the connection.

The two proofs carry different labels, so one side's answer is never usable as the other's.
Only the standard library is imported here.
"""

from __future__ import annotations

import enum
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from launcher.addresses import lookup_name

if TYPE_CHECKING:  # pragma: no cover
    import ipaddress
    from typing import TypeAlias

__all__ = [
    "AUTH_HELLO",
    "AUTH_PROOF",
    "READER_HELLO",
    "SPARE_ADMITTED",
    "SPARE_ENDED",
    "SPARE_HELLO",
    "SPARE_PROVE",
    "SPARE_RUNNING",
    "NONCE_LEN",
    "PROOF_LEN",
    "Admission",
    "IPAddress",
    "IPNetwork",
    "Verdict",
    "client_proof",
    "new_nonce",
    "parse_networks",
    "proofs_match",
    "peer_ip",
    "resolve_addresses",
    "server_proof",
]

# ipaddress is imported only where an address is parsed: a launch whose store nobody has
# connected to yet (every launch, before its first worker starts) never needs it.
if TYPE_CHECKING:  # pragma: no cover
    IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
    IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network


def __getattr__(name: str) -> Any:
    # IPAddress and IPNetwork, for code that uses them at run time (isinstance, say).
    if name in ("IPAddress", "IPNetwork"):
        import ipaddress

        if name == "IPAddress":
            return ipaddress.IPv4Address | ipaddress.IPv6Address
        return ipaddress.IPv4Network | ipaddress.IPv6Network
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: Query codes of the handshake: outside torch's range (0-18) so they never collide with it.
AUTH_HELLO: Final = 0xA0
AUTH_PROOF: Final = 0xA1
#: Sent first by a client that only reads (``launcher status``): no payload, no reply. A store
#: restricted to a round's members that refuses it does not take it for an agent knocking to
#: join (``StoreServer.knocking``), so reading a job's status never makes it start a new round.
READER_HELLO: Final = 0xA2
#: Sent first by an agent that the store refused once (no secret: the job's round is full or
#: closed) and that waits as a spare: one byte, answered with one byte, and the connection is
#: closed. It reads and writes no key: a refused peer learns only whether the job still runs.
#: A store restricted to a round's members answers it for a refused peer that the site policy
#: would admit to an open round (it counts as a node waiting to join, ``StoreServer.knocking``).
SPARE_HELLO: Final = 0xA3
#: The answers to :data:`SPARE_HELLO`.
SPARE_RUNNING: Final = 0  # refused: the job runs without this peer; ask again later
SPARE_ENDED: Final = 1  # refused: the job has ended (its rendezvous is closed)
SPARE_ADMITTED: Final = 2  # admitted: the handshake goes on over this connection
SPARE_PROVE: Final = 3  # this store wants the shared secret first (the peer has none)
NONCE_LEN: Final = 32
PROOF_LEN: Final = 32  # SHA-256 digest size

_SERVER_LABEL: Final = b"launcher-store-server"
_CLIENT_LABEL: Final = b"launcher-store-client"


class Verdict(enum.Enum):
    """What the server does with a new connection."""

    ADMIT = "admit"  # serve it (loopback, a member, or no restriction configured)
    AUTHENTICATE = "authenticate"  # serve it once it proves the shared secret
    REFUSE = "refuse"  # close it at once


def new_nonce() -> bytes:
    """A fresh random nonce for the handshake."""
    return os.urandom(NONCE_LEN)


def _hmac_sha256(secret: bytes, message: bytes) -> bytes:
    # Imported here: hashlib loads OpenSSL, which an agent without a secret never needs.
    import hashlib
    import hmac

    return hmac.new(secret, message, hashlib.sha256).digest()


def server_proof(secret: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """What the server sends to prove it knows ``secret``."""
    return _hmac_sha256(secret, _SERVER_LABEL + client_nonce + server_nonce)


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What a joining client sends to prove it knows ``secret``."""
    return _hmac_sha256(secret, _CLIENT_LABEL + server_nonce + client_nonce)


def proofs_match(received: bytes, expected: bytes) -> bool:
    """Constant-time comparison (:func:`hmac.compare_digest`), so timing leaks nothing."""
    import hmac

    return hmac.compare_digest(received, expected)


def parse_networks(networks: Iterable[str | IPNetwork]) -> tuple[IPNetwork, ...]:
    """CIDR ranges (``"10.0.0.0/8"``, ``"fd00::/8"``, a bare address = one host); raises
    :class:`ValueError` naming the first bad one."""
    parsed: list[IPNetwork] = []
    for net in networks:
        import ipaddress  # only once there is a range: most launches configure none

        if isinstance(net, ipaddress.IPv4Network | ipaddress.IPv6Network):
            parsed.append(net)
            continue
        text = net.strip()
        try:
            parsed.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ValueError(f"{text!r} is not an address range (expected e.g. 10.0.0.0/8 or fd00::/8)") from None
    return tuple(parsed)


def _unmapped(ip: IPAddress) -> IPAddress:
    import ipaddress

    # A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d; compare them as IPv4.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def peer_ip(peer: object) -> IPAddress | None:
    """The IP address of an accepted socket's peer (``None`` for a Unix socket)."""
    if isinstance(peer, tuple) and peer and isinstance(peer[0], str):
        import ipaddress

        try:
            return _unmapped(ipaddress.ip_address(peer[0].split("%", 1)[0]))
        except ValueError:
            return None
    return None


def resolve_addresses(addresses: Iterable[str]) -> frozenset[IPAddress]:
    """IP addresses of ``addresses`` (literals kept, names resolved to all their addresses).

    Raises :class:`ValueError` for a name that does not resolve: admitting nobody for a member
    would break the job, so the caller must know.
    """
    import ipaddress

    result: set[IPAddress] = set()
    for entry in addresses:
        host = entry.strip()
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            result.add(_unmapped(ipaddress.ip_address(host.split("%", 1)[0])))
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(lookup_name(host), None, socket.AF_UNSPEC, socket.SOCK_STREAM)
        except OSError as exc:
            raise ValueError(f"cannot resolve store member {host!r}: {exc}") from None
        for info in infos:
            ip = peer_ip(info[4])
            if ip is not None:
                result.add(ip)
    return frozenset(result)


@dataclass(frozen=True)
class Admission:
    """A site's admission policy for the store while a rendezvous round is open.

    ``join_networks``: only peers in these CIDR ranges may connect (empty: any address).
    ``secret``: when set, a peer that is not admitted by address must prove it knows the secret
    (launcher's :class:`~launcher.store.client.TCPStoreClient` does, given the same secret).
    Loopback peers are always admitted. Once the round closes the rendezvous calls
    :meth:`~launcher.store.server.StoreServer.restrict_to` with the members' addresses.
    """

    join_networks: Sequence[str | IPNetwork] = ()
    secret: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "join_networks", parse_networks(self.join_networks))
        if self.secret is not None:
            if isinstance(self.secret, str):
                object.__setattr__(self, "secret", self.secret.encode("utf-8"))
            if not self.secret:
                raise ValueError("the store secret is empty")

    @property
    def networks(self) -> tuple[IPNetwork, ...]:
        """The parsed join ranges."""
        return tuple(self.join_networks)  # type: ignore[arg-type]

    def in_join_networks(self, ip: IPAddress | None) -> bool:
        """Whether ``ip`` may join (always, when no ranges are configured)."""
        if not self.join_networks or ip is None:
            return True
        return any(ip.version == net.version and ip in net for net in self.networks)

    def verdict(
        self,
        ip: IPAddress | None,
        members: frozenset[IPAddress] | None,
        authenticated_joiners: bool = False,
    ) -> Verdict:
        """The verdict for a peer at ``ip``.

        ``members`` is ``None`` while the round is open; once restricted, members are admitted
        by address and anyone else is refused, unless ``authenticated_joiners`` lets peers that
        prove the secret (and are in the join ranges) in, e.g. agents asking to scale up.
        """
        if ip is None or ip.is_loopback:
            return Verdict.ADMIT
        if members is not None:
            if ip in members:
                return Verdict.ADMIT
            if authenticated_joiners and self.secret is not None and self.in_join_networks(ip):
                return Verdict.AUTHENTICATE
            return Verdict.REFUSE
        if not self.in_join_networks(ip):
            return Verdict.REFUSE
        return Verdict.AUTHENTICATE if self.secret is not None else Verdict.ADMIT
