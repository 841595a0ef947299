"""The ``c10d`` rendezvous backend: the core's algorithm over launcher's own TCPStore.

The node whose address the endpoint names (``is_host``) serves launcher's pure-Python
:class:`~launcher.store.server.StoreServer` on the endpoint's port; every node, host included,
runs :class:`~launcher.rendezvous.dynamic.DynamicRendezvousHandler` over a
:class:`~launcher.store.client.TCPStoreClient` connected to it. The server speaks torch's TCPStore
protocol, so a torch client reaches it as well; no agent imports torch (``import torch`` costs
about 1.5 s of CPU per agent). Only ``store_type=file`` uses torch (its FileStore).

Before the client connects, the endpoint is resolved and probed with plain sockets, so a
missing, unresolvable or unreachable endpoint ends in one :class:`RendezvousError` sentence
within ``join_timeout``.

The host serves until every participant of the last round has left or ``close_timeout``
passes (see :meth:`DynamicRendezvousHandler.shutdown`), so no node ever talks to a store that
has already been shut down. It applies the site's ``join_networks`` and ``secret_file`` to the
store, and once a round is closed serves only its participants (docs/store-security.md); every
agent's client proves the secret when one is configured.
"""

from __future__ import annotations

import errno
import functools
import logging
import socket
import time
from typing import Any

from launcher.addresses import is_loopback, lookup_name
from launcher.errors import UsageError
from launcher.rendezvous.api import RendezvousConfigError, RendezvousError, RendezvousParameters
from launcher.rendezvous.config import CONFIG_KEYS, DynamicRendezvousConfig
from launcher.rendezvous.dynamic import DynamicRendezvousHandler, SpareNotNeeded
from launcher.rendezvous.endpoint import format_endpoint, parse_endpoint
from launcher.store.api import KeyValueStore, StoreError

__all__ = ["DEFAULT_PORT", "create_handler", "is_local_host", "parse_c10d_endpoint"]

log = logging.getLogger("launcher.rendezvous")

#: torchrun's default port for the c10d endpoint.
DEFAULT_PORT = 29400
_PROGRESS_INTERVAL = 10.0
#: Seconds a dropped connection to the store is retried before a call fails.
_RECONNECT_TIMEOUT = 5.0


def parse_c10d_endpoint(endpoint: str) -> tuple[str, int]:
    """``host[:port]`` (IPv6 as ``[::1]:29400``) to ``(host, port)``, port 29400 by default.

    A missing endpoint is a :class:`RendezvousError`: a multi-node c10d job cannot guess where
    its store is, and torchrun's silent fallback to ``localhost`` makes every node wait alone.
    """
    if not endpoint or not endpoint.strip():
        raise RendezvousError(
            "the c10d rendezvous needs --rdzv-endpoint host[:port] naming the node that serves the store "
            f"(port {DEFAULT_PORT} by default); every node must give the same endpoint"
        )
    try:
        return parse_endpoint(endpoint, DEFAULT_PORT)
    except UsageError as exc:
        raise RendezvousConfigError(str(exc)) from None


def _can_bind(family: int, sockaddr: tuple[Any, ...]) -> bool:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((sockaddr[0], 0, *sockaddr[2:]))
        return True
    except OSError:
        return False


@functools.cache
def _binds_anything(family: int) -> bool:
    """Whether this host lets a socket bind an address it does not have (ip_nonlocal_bind):
    then a successful bind proves nothing about which addresses are local."""
    probe = ("192.0.2.1", 0) if family == socket.AF_INET else ("2001:db8::1", 0, 0, 0)
    return _can_bind(family, probe)


def is_local_host(host: str, local_addr: str | None = None) -> bool:
    """Whether ``host`` (the endpoint's host) names this machine.

    True for loopback, this host's name, FQDN or ``--local-addr``, and for a name or address
    that resolves to an address bound on one of this machine's interfaces (tested by binding a
    socket to it, which covers every NIC, IPv6 included, without listing interfaces).
    """
    name = host.strip().strip("[]").lower()
    if is_loopback(name):
        return True
    if local_addr and name == local_addr.strip().strip("[]").lower():
        return True
    hostname = socket.gethostname().lower()
    if name == hostname or hostname.startswith(name + "."):
        return True
    try:
        infos = socket.getaddrinfo(lookup_name(name), None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        infos = []
    for family, _, _, _, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        if is_loopback(str(sockaddr[0])):
            return True
        if not _binds_anything(family) and _can_bind(family, sockaddr):
            return True
    # Slowest check last: getfqdn can wait on DNS.
    return name == socket.getfqdn().lower()


def _resolve(host: str, port: int) -> list[tuple[Any, ...]]:
    try:
        return socket.getaddrinfo(lookup_name(host), port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise RendezvousError(
            f"cannot resolve the rendezvous endpoint host {host!r}: {reason}; check --rdzv-endpoint, "
            "or give an IP address if this node has no working DNS"
        ) from None


def _accepts(infos: list[tuple[Any, ...]], timeout: float) -> OSError | None:
    """None if something accepts connections at one of the addresses, else the last error."""
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(max(timeout, 0.05))
                sock.connect(sockaddr)
            return None
        except OSError as exc:
            error = exc
    return error or OSError(errno.EHOSTUNREACH, "no address")


def wait_until_reachable(host: str, port: int, timeout: float, run_id: str = "") -> None:
    """Probe ``host:port`` with plain TCP connects until one succeeds, for at most ``timeout`` s.

    Raises :class:`RendezvousError` naming the endpoint and the last error.
    """
    endpoint = format_endpoint(host, port)
    start = time.monotonic()
    deadline = start + timeout
    next_progress = start  # said at the first refusal (a node started before the host), then every interval
    delay = 0.05
    while True:
        infos = _resolve(host, port)
        left = deadline - time.monotonic()
        error = _accepts(infos, min(2.0, left))
        if error is None:
            return
        now = time.monotonic()
        if now >= deadline:
            reason = error.strerror or str(error) or type(error).__name__
            raise RendezvousError(
                f"cannot reach the rendezvous store at {endpoint} (tried for {timeout:g} s, join_timeout): "
                f"{reason}. Is the node that serves it (the endpoint's host, or is_host=1) started, is port "
                f"{port} open in its firewall, and do all nodes use the same --rdzv-endpoint?"
            )
        if now >= next_progress:
            next_progress = now + _PROGRESS_INTERVAL
            log.info(
                "rendezvous %r: waiting for the store at %s to accept connections (%s); timeout in %.0f s",
                run_id,
                endpoint,
                error.strerror or error,
                deadline - now,
            )
        time.sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * 2, 1.0)


def _serve(port: int, config: DynamicRendezvousConfig, nodes: int | None = None) -> Any:
    """launcher's store server on ``port`` of every interface (as torch's TCPStore master binds),
    admitting whom the site's ``join_networks`` and ``secret_file`` allow (docs/store-security.md).
    ``nodes`` (MAX of ``--nnodes``) is how many agents it must hold connections for: it raises
    its open-files limit to that, or says at once that the hard limit is too low."""
    from launcher.store.server import StoreServer

    server = StoreServer("", port, clients=nodes)
    if config.store_admission is not None:
        server.admission = config.store_admission
    return server.start()


def _connect(host: str, port: int, config: DynamicRendezvousConfig, run_id: str) -> KeyValueStore:
    from launcher.store.client import TCPStoreClient
    from launcher.store.connection import JobEnded, SpareStoreGone

    start = time.monotonic()
    wait_until_reachable(host, port, config.join_timeout, run_id)
    left = max(1.0, config.join_timeout - (time.monotonic() - start))
    secret = config.store_admission.secret if config.store_admission is not None else None
    try:
        # A store that accepts and closes our connections does not admit this host now (a job
        # whose round is closed): keep trying while the join timeout lasts, a new round may admit it.
        # Without a secret, this node then asks as a spare, and waits as one while the job runs
        # (launcher.store.connection): a store gone for gone_timeout after that is no store at all.
        client = TCPStoreClient(
            host, port, timeout=config.read_timeout, connect_timeout=left, secret=secret, refused_timeout=left,
            spare=secret is None, gone_timeout=min(config.read_timeout, _RECONNECT_TIMEOUT),
        )
    except JobEnded as exc:
        raise SpareNotNeeded(
            f"rendezvous {run_id!r} is closed: the job has ended ({exc}); this node only waited as a spare, and "
            "was not needed"
        ) from None
    except SpareStoreGone as exc:
        raise RendezvousError(f"rendezvous {run_id!r}: {exc}") from None
    except (StoreError, OSError) as exc:
        raise RendezvousError(
            f"reached {format_endpoint(host, port)} but could not open the rendezvous store there: {exc}. "
            "Is another program listening on that port, do all nodes use the same join_networks and "
            "secret (docs/store-security.md)?"
        ) from None
    # Once connected, a dropped connection is retried briefly: a store that refuses for
    # seconds is gone (its host died), and the agent should say so rather than wait. A store
    # that closes it at once (this node was cut off when a round closed without it) is
    # retried while the join timeout lasts.
    client.connect_timeout = min(config.read_timeout, _RECONNECT_TIMEOUT)
    client.refused_timeout = config.join_timeout
    return client


def _in_use(exc: BaseException) -> bool:
    cause = exc if isinstance(exc, OSError) else exc.__cause__
    return isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE


#: Seconds a port this machine cannot bind may refuse connections before the agent calls it
#: taken by another program: another agent of this machine that is starting its store listens
#: within milliseconds of binding.
TAKEN_WAIT = 2.0


def _taken_by_another_program(host: str, port: int) -> bool:
    """Whether ``port`` (which this machine cannot bind) keeps refusing connections for
    :data:`TAKEN_WAIT` seconds: a socket that is not a store holds it, and nothing will ever
    serve the rendezvous there (waiting would last the whole join timeout)."""
    infos = _resolve(host, port)
    deadline = time.monotonic() + TAKEN_WAIT
    while True:
        if _accepts(infos, 0.5) is None:
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.1)


def open_store(
    host: str,
    port: int,
    *,
    is_host: bool,
    explicit: bool,
    config: DynamicRendezvousConfig,
    run_id: str = "",
    nodes: int | None = None,
) -> tuple[KeyValueStore, Any]:
    """A client of the endpoint's store, and the server when this node serves it (else ``None``);
    ``nodes`` (MAX of ``--nnodes``) sizes the server's open-files limit.

    A guessed host finding the port busy (another agent of this machine serves it) connects as
    a client instead; an explicit ``is_host=1`` finding it busy is an error.
    """
    if is_host:
        # Someone already serving (another agent on this machine) answers a connect: join it.
        if port and not explicit and _accepts(_resolve(host, port), 0.5) is None:
            log.info("rendezvous %r: %s is already served on this machine; connecting to it", run_id, host)
            return _connect(host, port, config, run_id), None
        try:
            server = _serve(port, config, nodes)
        except (StoreError, OSError) as exc:
            if explicit or not _in_use(exc):
                raise RendezvousError(
                    f"cannot serve the rendezvous store on port {port}: {exc}. Choose a free port in "
                    "--rdzv-endpoint, or stop the program that uses it"
                ) from None
            if _taken_by_another_program(host, port):
                raise RendezvousError(
                    f"port {port} on this machine is taken by another program that accepts no connections; "
                    "choose another --rdzv-endpoint port"
                ) from None
        else:
            log.info("rendezvous %r: this node serves the store on port %d", run_id, server.port)
            try:
                return _connect(host, server.port, config, run_id), server
            except BaseException:
                server.close()
                raise
    if port == 0:
        raise RendezvousConfigError(
            "--rdzv-endpoint with port 0 works only on the node that serves the store (--standalone or "
            "is_host=1); give the other nodes a fixed port"
        )
    return _connect(host, port, config, run_id), None


def _file_handler(params: RendezvousParameters, config: DynamicRendezvousConfig) -> DynamicRendezvousHandler:
    import torch.distributed as dist

    from launcher.rendezvous.torch_store import TorchStore

    if not params.endpoint.strip():
        raise RendezvousError("store_type=file needs --rdzv-endpoint naming the store's file (shared by every node)")
    try:
        store = dist.FileStore(params.endpoint.strip(), -1)
    except (RuntimeError, ValueError, OSError) as exc:
        raise RendezvousError(f"cannot open the file store {params.endpoint!r}: {exc}") from None
    # A FileStore cannot serve workers: group rank 0 names an address and port for their store.
    return DynamicRendezvousHandler.from_parameters(TorchStore(store), params, config, backend_name="c10d")


def create_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """The c10d rendezvous handler for ``params`` (launcher's TCPStore, or torch's FileStore with
    store_type=file).

    Raises :class:`RendezvousConfigError` for invalid ``--rdzv-conf`` and :class:`RendezvousError`
    when the endpoint is missing, unresolvable or unreachable within ``join_timeout``.
    """
    config = DynamicRendezvousConfig.from_parameters(params, known=CONFIG_KEYS, backend="c10d")
    if config.store_type == "file":
        return _file_handler(params, config)
    host, port = parse_c10d_endpoint(params.endpoint)
    explicit = config.is_host is not None
    is_host = bool(config.is_host) if explicit else is_local_host(host, params.local_addr)
    store, server = open_store(
        host, port, is_host=is_host, explicit=explicit, config=config, run_id=params.run_id, nodes=params.max_nodes
    )
    return DynamicRendezvousHandler.from_parameters(
        store,
        params,
        config,
        is_host=server is not None,
        backend_name="c10d",
        store_address=format_endpoint(host, server.port if server is not None else port),
        on_shutdown=server.close if server is not None else None,
        store_server=server,
    )
