"""``launcher status --rdzv-endpoint HOST:PORT --rdzv-id ID``: a job's status through its rendezvous.

Each agent of a multi-node job writes its record (see :mod:`launcher.status.publisher`) into the
rendezvous's own store too, below its round's agent keys. This module reads them from any host
the rendezvous admits, with the job's own endpoint, id, backend and ``--rdzv-conf`` (its
``secret_file``, or ``LAUNCHER_RDZV_SECRET``): a c10d store restricted to a running job's nodes
admits whoever proves the job's secret. The reader is a plain client of the store, never of the
rendezvous: it serves nothing, writes nothing (not even the ``current`` key the rendezvous
creates on a first read), takes no join index or lease, and so is never counted as a node
waiting to join and never holds a round open.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from launcher.errors import UsageError
from launcher.rendezvous.api import RendezvousConfigError, RendezvousError, RendezvousParameters
from launcher.status.report import JobNotRunning, assemble
from launcher.status.settings import RENDEZVOUS_STATUS_KEY, SCHEMA_VERSION

if TYPE_CHECKING:  # pragma: no cover
    from launcher.store.api import KeyValueStore

#: Seconds one read of the status may wait for the store (connecting included).
READ_TIMEOUT = 5.0
#: What ``current`` holds once the job ended (launcher.rendezvous.rounds.CLOSED).
_CLOSED = b"closed"


def parse_conf(text: str) -> dict[str, str]:
    """``--rdzv-conf K=V,K=V`` as a mapping (one :class:`UsageError` line for an item without ``=``)."""
    config: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"launcher status: --rdzv-conf item {item!r} is not KEY=VALUE")
        config[key.strip()] = value.strip()
    return config


def c10d_read_store(params: RendezvousParameters) -> KeyValueStore:
    """A client of the c10d rendezvous's store at ``params.endpoint``, proving the job's secret
    when one is configured; a :class:`RendezvousError` line when it cannot be used."""
    from launcher.rendezvous.config import store_admission
    from launcher.rendezvous.endpoint import format_endpoint, parse_endpoint
    from launcher.store.api import StoreError
    from launcher.store.client import TCPStoreClient

    if params.config.get("store_type", "tcp") == "file":
        raise RendezvousConfigError("launcher status reads a c10d rendezvous over TCP only, not store_type=file")
    host, port = parse_endpoint(params.endpoint, 29400)
    admission = store_admission(params.config)
    secret = admission.secret if admission is not None else None
    where = format_endpoint(host, port)
    try:
        # Refused at once is final here: a running job admits only its nodes and those that
        # prove its secret, and retrying would not change that.
        return TCPStoreClient(host, port, timeout=READ_TIMEOUT, connect_timeout=READ_TIMEOUT, secret=secret,
                              refused_timeout=0.0, reader=True)
    except StoreError as exc:
        text = str(exc)
        if "secret" in text:
            raise RendezvousError(f"the rendezvous store at {where} refuses this client: {text}") from None
        if "does not admit this host" in text:
            hint = ("it admits, while the job runs, only the job's nodes and clients that prove the job's secret"
                    if secret is None else "is this host outside the job's join_networks?")
            raise RendezvousError(f"the rendezvous store at {where} does not admit this host: {hint}") from None
        raise RendezvousError(f"cannot reach the rendezvous store at {where}: {text}") from None
    except (OSError, ValueError) as exc:
        raise RendezvousError(f"cannot reach the rendezvous store at {where}: {exc}") from None


def read_store(params: RendezvousParameters, environ: Mapping[str, str] | None = None) -> KeyValueStore:
    """The backend's read-only store for ``params`` (its plugin's ``read_store``)."""
    from launcher.options import check_environment
    from launcher.plugins.manager import get_plugin_manager
    from launcher.plugins.types import RendezvousBackend

    environ = os.environ if environ is None else environ
    manager = get_plugin_manager(autoload=check_environment(environ))
    backend = manager.get(RendezvousBackend, params.backend)
    if backend.read_store is None:
        raise UsageError(f"launcher status: the {backend.name} rendezvous backend cannot be read from outside "
                         "the job; run `launcher status LOGDIR|PID` on one of its nodes")
    return backend.read_store(params)


def _read(store: KeyValueStore, key: str) -> bytes | None:
    return store.get(key, READ_TIMEOUT) if store.check([key]) else None


def _record(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA_VERSION else None


def round_records(store: KeyValueStore, run_id: str) -> tuple[list[dict[str, Any]], list[int]]:
    """The records of the newest round that has any (the current one, or while it forms, the
    one before), and the group ranks of that round without one."""
    from launcher.rendezvous.keys import RendezvousKeys

    keys = RendezvousKeys(run_id)
    current = _read(store, keys.current)
    if current is None:
        raise JobNotRunning(f"no job {run_id!r} at this rendezvous (its store has no round of it)")
    if current.strip() == _CLOSED:
        raise JobNotRunning(f"job {run_id!r} has ended (its rendezvous is closed)")
    try:
        newest = int(current)
    except ValueError:
        raise JobNotRunning(f"job {run_id!r}: the rendezvous's current round reads {current[:40]!r}") from None
    for r in range(newest, max(-1, newest - 2), -1):
        def key(group_rank: int, r: int = r) -> str:
            return keys.agent(r) + RENDEZVOUS_STATUS_KEY.format(group_rank=group_rank)

        first = _record(_read(store, key(0)))
        if first is None:
            continue
        world = int(first.get("group_world_size", 1))
        records, missing = [first], []
        for group_rank in range(1, world):
            record = _record(_read(store, key(group_rank)))
            (records.append(record) if record is not None else missing.append(group_rank))
        return records, missing
    raise JobNotRunning(f"job {run_id!r} runs no workers yet (round {newest} is forming): no status to show")


def rendezvous_status(params: RendezvousParameters, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``--json`` document of the job ``params`` names, read through its rendezvous."""
    try:
        store = read_store(params, environ)
    except RendezvousConfigError as exc:
        raise UsageError(f"launcher status: {exc}") from None
    try:
        records, missing = round_records(store, params.run_id)
    except (JobNotRunning, UsageError):
        raise
    except Exception as exc:  # the store went away or refused mid-read: one line, no traceback
        raise RendezvousError(f"reading job {params.run_id!r}'s status from its rendezvous failed: {exc}") from None
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return assemble(records, missing, None)
