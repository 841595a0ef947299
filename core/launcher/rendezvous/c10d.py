"""The ``c10d`` rendezvous backend: the core's algorithm over torch's TCPStore.

The node whose address the endpoint names (``is_host``) serves a TCPStore on the endpoint's
port; every node, host included, runs :class:`~launcher.rendezvous.dynamic.DynamicRendezvousHandler`
over it, and the workers use the same store (``MASTER_ADDR``/``MASTER_PORT`` = the endpoint), so
it is served before any worker needs it and no second port is ever picked.

This is the only rendezvous module that imports torch, and only inside :func:`create_handler`.
Before torch sees the endpoint it is resolved and probed with plain sockets, so a missing,
unresolvable or unreachable endpoint ends in one :class:`RendezvousError` sentence within
``join_timeout`` instead of torch's retry loop and C++ traces.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import logging
import socket
import time
from datetime import timedelta
from typing import Any

from launcher.errors import UsageError
from launcher.rendezvous.api import RendezvousConfigError, RendezvousError, RendezvousParameters
from launcher.rendezvous.config import CONFIG_KEYS, DynamicRendezvousConfig
from launcher.rendezvous.dynamic import DynamicRendezvousHandler
from launcher.rendezvous.endpoint import format_endpoint, parse_endpoint
from launcher.rendezvous.torch_store import TorchStore

__all__ = ["DEFAULT_PORT", "create_handler", "is_local_host", "parse_c10d_endpoint"]

log = logging.getLogger("launcher.rendezvous")

#: torchrun's default port for the c10d endpoint.
DEFAULT_PORT = 29400
_PROGRESS_INTERVAL = 10.0


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


def _is_loopback_name(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


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
    if _is_loopback_name(name):
        return True
    if local_addr and name == local_addr.strip().strip("[]").lower():
        return True
    hostname = socket.gethostname().lower()
    if name == hostname or hostname.startswith(name + "."):
        return True
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        infos = []
    for family, _, _, _, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        if ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]).is_loopback:
            return True
        if not _binds_anything(family) and _can_bind(family, sockaddr):
            return True
    # Slowest check last: getfqdn can wait on DNS.
    return name == socket.getfqdn().lower()


def _resolve(host: str, port: int) -> list[tuple[Any, ...]]:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
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
    next_progress = start + _PROGRESS_INTERVAL
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


def _serve(host: str, port: int, read_timeout: float) -> Any:
    import torch.distributed as dist

    # multi_tenant lets several handlers of one process (tests, simulations) share the server.
    return dist.TCPStore(
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        multi_tenant=True,
        timeout=timedelta(seconds=read_timeout),
    )


def _connect(host: str, port: int, config: DynamicRendezvousConfig, run_id: str) -> Any:
    start = time.monotonic()
    wait_until_reachable(host, port, config.join_timeout, run_id)
    import torch.distributed as dist

    left = max(1.0, config.join_timeout - (time.monotonic() - start))
    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=left))
    except (RuntimeError, ValueError, TimeoutError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RendezvousError(
            f"reached {format_endpoint(host, port)} but could not open the rendezvous store there: {first}. "
            "Is another program listening on that port?"
        ) from None
    store.set_timeout(timedelta(seconds=config.read_timeout))
    return store


def open_store(
    host: str, port: int, *, is_host: bool, explicit: bool, config: DynamicRendezvousConfig, run_id: str = ""
) -> tuple[Any, bool]:
    """A TCPStore for the endpoint: served here when ``is_host``, else a client; and whether served.

    A guessed host finding the port busy (another agent of this machine serves it) connects as
    a client instead; an explicit ``is_host=1`` finding it busy is an error.
    """
    if is_host:
        # Someone already serving (another agent on this machine) answers a connect: join it
        # rather than fail to bind (torch logs a C++ trace for that).
        if port and not explicit and _accepts(_resolve(host, port), 0.5) is None:
            log.info("rendezvous %r: %s is already served on this machine; connecting to it", run_id, host)
            return _connect(host, port, config, run_id), False
        try:
            store = _serve(host, port, config.read_timeout)
            log.info("rendezvous %r: this node serves the store on port %d", run_id, store.port)
            return store, True
        except (RuntimeError, ValueError, OSError) as exc:
            text = str(exc)
            if explicit or "EADDRINUSE" not in text:
                first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
                raise RendezvousError(
                    f"cannot serve the rendezvous store on port {port}: {first}. Choose a free port in "
                    "--rdzv-endpoint, or stop the program that uses it"
                ) from None
    if port == 0:
        raise RendezvousConfigError(
            "--rdzv-endpoint with port 0 works only on the node that serves the store (--standalone or "
            "is_host=1); give the other nodes a fixed port"
        )
    return _connect(host, port, config, run_id), False


def _file_handler(params: RendezvousParameters, config: DynamicRendezvousConfig) -> DynamicRendezvousHandler:
    import torch.distributed as dist

    if not params.endpoint.strip():
        raise RendezvousError("store_type=file needs --rdzv-endpoint naming the store's file (shared by every node)")
    try:
        store = dist.FileStore(params.endpoint.strip(), -1)
    except (RuntimeError, ValueError, OSError) as exc:
        raise RendezvousError(f"cannot open the file store {params.endpoint!r}: {exc}") from None
    # A FileStore cannot serve workers: group rank 0 names an address and port for their store.
    return DynamicRendezvousHandler(
        TorchStore(store),
        run_id=params.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        config=config,
        local_addr=params.local_addr,
        backend_name="c10d",
    )


def create_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """The c10d rendezvous handler for ``params`` (torch's TCPStore, or FileStore with store_type=file).

    Raises :class:`RendezvousConfigError` for invalid ``--rdzv-conf`` and :class:`RendezvousError`
    when the endpoint is missing, unresolvable or unreachable within ``join_timeout``.
    """
    config = DynamicRendezvousConfig.from_parameters(params, known=CONFIG_KEYS, backend="c10d")
    if config.store_type == "file":
        return _file_handler(params, config)
    host, port = parse_c10d_endpoint(params.endpoint)
    explicit = config.is_host is not None
    is_host = bool(config.is_host) if explicit else is_local_host(host, params.local_addr)
    store, served = open_store(host, port, is_host=is_host, explicit=explicit, config=config, run_id=params.run_id)
    return DynamicRendezvousHandler(
        TorchStore(store),
        run_id=params.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        config=config,
        local_addr=params.local_addr,
        is_host=served,
        backend_name="c10d",
    )
