"""``EtcdStore``: the core's :class:`~launcher.store.api.KeyValueStore` over etcd's v3 API.

Every key lives under a per-job prefix. Waiting (``get``, ``wait``, ``multi_get``) reads the keys
and, for those missing, opens a watch from the revision of that read, so a write between the
read and the watch is never missed and nothing polls. Keys that belong to one node (the
``owned`` predicate: the core's participant records and heartbeat counters) are attached to a
lease that a thread of this store keeps alive: when the node dies, etcd deletes them itself.

Counters (``add``) need care on etcd, which has no atomic increment. A counter's value is
stored as ``B:V0`` (behind a marker) and read as ``B + version - V0``, where ``version`` is the
number of writes the key has had: adding 1 is then a write of the *unchanged* value guarded by a
comparison on that value, so any number of nodes adding 1 at once all succeed in one round trip
instead of retrying a compare-and-swap in turn (the N-node rendezvous would be O(N^2)). A counter
only ever incremented by 1 keeps the form ``0:0`` (its count is its version), and a nested
transaction creates it when it is missing, so even the first add is one round trip. Other
amounts rewrite ``B:V0``. ``get`` returns a counter as a decimal string, like TCPStore.

Each ``add`` also writes this client's operation number to a marker key in the same
transaction, so that a retry after a failure that may have reached etcd (a member killed
mid-request, fail-over) first looks whether the add took effect: counters are exactly-once.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from launcher.store.api import StoreTimeoutError

from launcher_etcd.client import EtcdClient, EtcdError, LeaseNotFoundError, b64, unb64

__all__ = ["EtcdStore", "LeaseKeeper"]

log = logging.getLogger("launcher.rendezvous.etcd")

#: Marks a counter's stored form (see the module docstring); no JSON or decimal starts so.
_COUNTER = b"\x00launcher-counter:"
#: The stored form of a counter only ever incremented by 1: its count is the key's version.
_CANONICAL = _COUNTER + b"0:0"
#: etcd's default --max-txn-ops: larger multi-key operations are split into transactions of this size.
MAX_TXN_OPS = 128
_WATCH_BACKOFF_MAX = 0.5


def _put(key: bytes, value: bytes, lease: int | None = None, *, prev_kv: bool = False) -> dict[str, Any]:
    request: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease is not None:
        request["lease"] = str(lease)
    if prev_kv:
        request["prev_kv"] = True
    return {"request_put": request}


def _range(key: bytes, **options: Any) -> dict[str, Any]:
    return {"request_range": {"key": b64(key), **options}}


def _kvs(response: dict[str, Any]) -> list[dict[str, Any]]:
    return list((response.get("response_range") or {}).get("kvs") or [])


def _counter_raw(base: int, version0: int) -> bytes:
    return _COUNTER + f"{base}:{version0}".encode()


def _count(key: bytes, raw: bytes, version: int) -> int:
    """The integer a stored value stands for (a counter, or a decimal written by ``set``)."""
    if raw.startswith(_COUNTER):
        base, _, version0 = raw[len(_COUNTER) :].partition(b":")
        return int(base) + version - int(version0)
    try:
        return int(raw)
    except ValueError:
        raise EtcdError(
            f"cannot add to {key.decode(errors='replace')!r}: it holds {raw[:40]!r}, not an integer"
        ) from None


def _logical(key: bytes, kv: dict[str, Any]) -> bytes:
    """What ``get`` returns for a stored key-value: counters as decimal strings."""
    raw = unb64(kv.get("value", ""))
    if raw.startswith(_COUNTER):
        return str(_count(key, raw, int(kv.get("version", 1)))).encode()
    return raw


class LeaseKeeper:
    """One lease, granted on first use and kept alive by a daemon thread every TTL/3.

    When the lease is found expired (etcd was unreachable for longer than its TTL, or the
    cluster lost it), a new one is granted and ``on_new_lease`` re-attaches this node's keys.
    """

    def __init__(self, client: EtcdClient, ttl: int, on_new_lease: Callable[[int], None]) -> None:
        self._client = client
        self.ttl = ttl
        self._on_new_lease = on_new_lease
        self._lock = threading.Lock()
        self._id: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    @property
    def granted(self) -> int | None:
        """The current lease id, or None before the first use."""
        return self._id

    def current(self) -> int:
        """The lease to attach keys to (granted now if there is none yet)."""
        with self._lock:
            if self._id is None:
                self._id = self._client.grant_lease(self.ttl)
                if not self._stop.is_set():
                    self._thread = threading.Thread(target=self._run, name="launcher-etcd-lease", daemon=True)
                    self._thread.start()
            lease: int = self._id
            return lease

    def replace(self, stale: int) -> int:
        """A new lease in place of ``stale`` (once, whichever thread finds it gone first)."""
        with self._lock:
            lease = self._id
            fresh = lease is None or lease == stale
            if lease is None or lease == stale:
                lease = self._id = self._client.grant_lease(self.ttl)
        if fresh:
            self._on_new_lease(lease)
        return lease

    def _run(self) -> None:
        period = max(self.ttl / 3.0, 0.5)
        wait = period
        while not self._stop.wait(wait):
            lease = self._id
            if lease is None:
                continue
            try:
                ttl = self._client.keep_alive(lease)
                if ttl <= 0:
                    log.warning(
                        "etcd lease %x expired (etcd unreachable for more than lease_ttl=%d s?): "
                        "taking a new one and restoring this node's keys",
                        lease,
                        self.ttl,
                    )
                    self.replace(lease)
                if self._failing:
                    log.info("etcd lease keep-alive works again")
                    self._failing = False
                wait = period
            except EtcdError as exc:
                if self._stop.is_set():
                    return
                if not self._failing:
                    log.warning("etcd lease keep-alive failed: %s", exc)
                    self._failing = True
                wait = min(1.0, period)  # retry sooner: the lease runs out meanwhile

    def stop(self) -> None:
        """Stop renewing (the lease then expires after its TTL unless revoked)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)


class EtcdStore:
    """:class:`~launcher.store.api.KeyValueStore` over etcd, under ``prefix``.

    ``owned(key)`` says which keys belong to this node alone and must vanish when it dies:
    they are attached to this store's lease (``lease_ttl`` seconds, renewed every third of it).
    ``timeout`` bounds ``get``/``wait`` when they are given none.

    :meth:`close` stops renewing the lease without revoking it: the node's keys stay readable
    for up to ``lease_ttl`` seconds, long enough for the other nodes to read that it left on
    purpose rather than died. :meth:`close` with ``revoke=True`` deletes them at once.
    """

    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        *,
        lease_ttl: int,
        timeout: float = 60.0,
        owned: Callable[[str], bool] | None = None,
    ) -> None:
        self._client = client
        self.prefix = prefix
        self._prefix = prefix.encode()
        self._timeout = timeout
        self._owned = owned or (lambda key: False)
        self._lock = threading.Lock()
        # What this node last wrote to each of its owned keys: (is a counter, value as get returns it).
        self._owned_values: dict[bytes, tuple[bool, bytes]] = {}
        # Last stored form seen per counter key, so that adding 1 takes one round trip.
        self._raw: dict[bytes, dict[str, Any]] = {}
        self.lease = LeaseKeeper(client, lease_ttl, self._restore)
        self._marker = self._prefix + b".clients/" + uuid.uuid4().hex.encode()
        self._ops = itertools.count(1)
        self._closed = False
        #: The rendezvous parameters this store serves (set by the backend), for :meth:`death_notice`.
        self.parameters: Any = None

    def death_notice(self, run_id: str, r: int, node: str, rank: int) -> list[str] | None:
        """The command a dead agent's watchdog runs to report ``node`` gone from round ``r`` at
        once and revoke this store's lease (:mod:`launcher_etcd.death_notice`); ``None`` until
        the backend said which rendezvous this store serves (:attr:`parameters`)."""
        if self.parameters is None or self.parameters.run_id != run_id:
            return None
        from launcher_etcd.death_notice import notice_argv

        return notice_argv(self.parameters, r, node, rank, self.lease.granted)

    @property
    def client(self) -> EtcdClient:
        """The connection this store uses."""
        return self._client

    def _k(self, key: str) -> bytes:
        return self._prefix + key.encode()

    def _remember(self, key: bytes, counter: bool, value: bytes) -> None:
        with self._lock:
            self._owned_values[key] = (counter, value)

    def _leased(self, needed: bool, write: Callable[[int | None], dict[str, Any]]) -> dict[str, Any]:
        """Run ``write`` with the lease id (None when ``needed`` is false), renewing a lost lease."""
        if not needed:
            return write(None)
        for _ in range(3):
            lease = self.lease.current()
            try:
                return write(lease)
            except LeaseNotFoundError:
                self.lease.replace(lease)
        return write(self.lease.current())

    # -- KeyValueStore -----------------------------------------------------------------------

    def set(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value`` (attached to this node's lease when the key is owned)."""
        k = self._k(key)
        owned = self._owned(key)
        self._leased(owned, lambda lease: self._client.txn(success=[_put(k, value, lease)]))
        with self._lock:
            self._raw.pop(k, None)
        if owned:
            self._remember(k, False, value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting (by a watch) until it exists or ``timeout`` passes."""
        k = self._k(key)
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        while True:
            result = self._client.range(k)
            kvs = result.get("kvs") or []
            if kvs:
                return _logical(k, kvs[0])
            # The read's own revision starts the watch: no second read before watching.
            self._wait([k], deadline, read=([k], int(result.get("header", {}).get("revision", 0))))

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (missing: 0); the new value. Exactly once.

        ``add(key, 0)`` only reads: unlike TCPStore it does not create a missing key, so that
        reading a dead node's expired heartbeat does not bring the key back without a lease.
        """
        k = self._k(key)
        if amount == 0:
            kvs = self._client.range(k).get("kvs") or []
            return _count(k, unb64(kvs[0].get("value", "")), int(kvs[0].get("version", 1))) if kvs else 0
        owned = self._owned(key)
        op = str(next(self._ops)).encode()
        with self._lock:
            known = self._raw.get(k)
        while True:
            lease = self.lease.current()
            key_lease = lease if owned else None
            marker = _put(self._marker, op, lease)
            raw = unb64(known.get("value", "")) if known is not None else None
            version = int(known.get("version", 1)) if known is not None else 1
            missing = [{"key": b64(k), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}]
            failure = [_range(k)]
            if amount == 1 and raw in (None, _CANONICAL):
                # The common case, many nodes adding 1 to one key: the stored value never changes
                # and the count is the key's version. One round trip whether the key exists (the
                # outer comparison) or not (the nested transaction creates it).
                mode = "increment"
                stored = _CANONICAL
                compare = [{"key": b64(k), "target": "VALUE", "result": "EQUAL", "value": b64(stored)}]
                success = [_put(k, stored, key_lease, prev_kv=True), marker]
                failure = [{"request_txn": {"compare": missing, "success": [_put(k, stored, key_lease), marker],
                                            "failure": failure}}]  # fmt: skip
            elif raw is None:
                mode = "create"
                compare = missing
                stored = _counter_raw(amount, 1)
                success = [_put(k, stored, key_lease), marker]
            elif amount == 1 and raw.startswith(_COUNTER):
                # One more write of the same value: its version, and so the count, goes up by 1.
                mode = "increment"
                stored = raw
                compare = [{"key": b64(k), "target": "VALUE", "result": "EQUAL", "value": b64(raw)}]
                success = [_put(k, raw, key_lease, prev_kv=True), marker]
            else:
                mode = "rewrite"
                compare = [{"key": b64(k), "target": "MOD", "result": "EQUAL", "mod_revision": known["mod_revision"]}]  # type: ignore[index]
                stored = _counter_raw(_count(k, raw, version) + amount, version + 1)
                version += 1
                success = [_put(k, stored, key_lease), marker]
            try:
                result = self._client.txn(compare, success, failure, if_applied=lambda: self._applied(op, k))
            except LeaseNotFoundError:
                self.lease.replace(lease)
                continue
            if "applied_value" in result:  # found by _applied after an ambiguous failure
                if owned:
                    self._remember(k, True, str(result["applied_value"]).encode())
                return int(result["applied_value"])
            revision = str(result.get("header", {}).get("revision", "0"))
            first = (result.get("responses") or [{}])[0]
            nested = first.get("response_txn")
            if result.get("succeeded"):
                if mode == "increment":
                    prev = (first.get("response_put") or {}).get("prev_kv") or {}
                    version = int(prev.get("version", version)) + 1
            elif nested is not None and nested.get("succeeded"):
                version = 1  # created by the nested transaction
            else:
                kvs = _kvs((nested.get("responses") or [{}])[0]) if nested is not None else _kvs(first)
                known = kvs[0] if kvs else None
                with self._lock:
                    if known is None:
                        self._raw.pop(k, None)
                    else:
                        self._raw[k] = known
                continue
            value = _count(k, stored, version)
            with self._lock:
                self._raw[k] = {"value": b64(stored), "version": str(version), "mod_revision": revision}
            if owned:
                self._remember(k, True, str(value).encode())
            return value

    def _applied(self, op: bytes, k: bytes) -> dict[str, Any] | None:
        """After an ambiguous failure: the counter's value if add ``op`` took effect, else None."""
        marker = self._client.range(self._marker).get("kvs") or []
        if not marker or unb64(marker[0].get("value", "")) != op:
            return None
        revision = marker[0]["mod_revision"]
        try:
            kvs = self._client.range(k, revision=revision).get("kvs") or []
        except EtcdError:  # compacted meanwhile: the value now is the best answer left
            kvs = self._client.range(k).get("kvs") or []
        if not kvs:
            return None
        with self._lock:
            self._raw.pop(k, None)
        return {"applied_value": _count(k, unb64(kvs[0].get("value", "")), int(kvs[0].get("version", 1)))}

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is missing and ``expected`` is
        empty); the value stored afterwards. A missing key with a non-empty ``expected`` answers
        ``expected`` without storing anything, as torch's TCPStore does."""
        k = self._k(key)
        owned = self._owned(key)
        while True:
            if expected:
                compare = [{"key": b64(k), "target": "VALUE", "result": "EQUAL", "value": b64(expected)}]
            else:
                compare = [{"key": b64(k), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}]
            result = self._leased(owned, self._swap(k, desired, compare, [_range(k)]))
            if result.get("succeeded"):
                break
            kvs = _kvs(result["responses"][0]) if result.get("responses") else []
            if not kvs:
                if expected:
                    return expected
                continue  # deleted between the comparison and the read: try again
            current = _logical(k, kvs[0])
            if current != expected:
                return current
            # Equal as read but not as stored (a counter, or an empty value): swap on the revision.
            guard = [{"key": b64(k), "target": "MOD", "result": "EQUAL", "mod_revision": kvs[0]["mod_revision"]}]
            result = self._leased(owned, self._swap(k, desired, guard, []))
            if result.get("succeeded"):
                break
        with self._lock:
            self._raw.pop(k, None)
        if owned:
            self._remember(k, False, desired)
        return desired

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        """Values of ``keys``, read at one revision once all exist (waiting by watch)."""
        full = [self._k(key) for key in keys]
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        while True:
            self._wait(full, deadline)
            values: dict[bytes, bytes] = {}
            revision: str | None = None
            for chunk in _chunks(full):
                options = {"revision": revision} if revision else {}
                result = self._client.txn(success=[_range(k, **options) for k in chunk])
                revision = revision or str(result.get("header", {}).get("revision", "")) or None
                for response in result.get("responses") or []:
                    for kv in _kvs(response):
                        key = unb64(kv["key"])
                        values[key] = _logical(key, kv)
            if all(k in values for k in full):
                return [values[k] for k in full]
            # A key was deleted between the wait and the read: wait for it again.

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        """Set several keys; atomic up to 128 keys (etcd's default --max-txn-ops), else per 128."""
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys and {len(values)} values")
        latest = dict(zip(keys, values, strict=True))  # etcd refuses a key twice in one transaction
        items = [(self._k(key), value, self._owned(key)) for key, value in latest.items()]
        for start in range(0, len(items), MAX_TXN_OPS):
            chunk = items[start : start + MAX_TXN_OPS]
            needs = any(owned for _, _, owned in chunk)
            self._leased(needs, self._put_all(chunk))
            with self._lock:
                for k, value, owned in chunk:
                    self._raw.pop(k, None)
                    if owned:
                        self._owned_values[k] = (False, value)

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key exists (one read, no waiting)."""
        missing, _ = self._missing([self._k(key) for key in keys])
        return not missing

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key exists: a read, then a watch on the missing ones from that
        read's revision. :class:`~launcher.store.api.StoreTimeoutError` after ``timeout``."""
        self._wait([self._k(key) for key in keys], time.monotonic() + (self._timeout if timeout is None else timeout))

    def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        k = self._k(key)
        result = self._client.request("/kv/deleterange", {"key": b64(k)})
        with self._lock:
            self._raw.pop(k, None)
            self._owned_values.pop(k, None)
        return int(result.get("deleted", 0)) > 0

    def close(self, revoke: bool = False) -> None:
        """Stop the lease keeper and close the connection (``revoke``: delete owned keys now)."""
        if self._closed:
            return
        self._closed = True
        self.lease.stop()
        lease = self.lease.granted
        if revoke and lease is not None:
            try:
                self._client.revoke_lease(lease)
            except EtcdError as exc:
                log.warning("could not revoke etcd lease %x: %s", lease, exc)
        self._client.close()

    # -- helpers -----------------------------------------------------------------------------

    def _swap(
        self, k: bytes, desired: bytes, compare: list[dict[str, Any]], failure: list[dict[str, Any]]
    ) -> Callable[[int | None], dict[str, Any]]:
        def write(lease: int | None) -> dict[str, Any]:
            return self._client.txn(compare, [_put(k, desired, lease)], failure)

        return write

    def _put_all(self, items: Sequence[tuple[bytes, bytes, bool]]) -> Callable[[int | None], dict[str, Any]]:
        def write(lease: int | None) -> dict[str, Any]:
            return self._client.txn(success=[_put(k, v, lease if owned else None) for k, v, owned in items])

        return write

    def _missing(self, keys: Sequence[bytes]) -> tuple[list[bytes], int]:
        """The keys that do not exist, and the revision they were read at."""
        missing: list[bytes] = []
        revision: int | None = None
        for chunk in _chunks(keys):
            options: dict[str, Any] = {"count_only": True}
            if revision is not None:
                options["revision"] = str(revision)
            result = self._client.txn(success=[_range(k, **options) for k in chunk])
            if revision is None:
                revision = int(result.get("header", {}).get("revision", 0))
            for k, response in zip(chunk, result.get("responses") or [], strict=False):
                if int((response.get("response_range") or {}).get("count", 0)) == 0:
                    missing.append(k)
        return missing, revision or 0

    def _wait(self, keys: Sequence[bytes], deadline: float, read: tuple[list[bytes], int] | None = None) -> None:
        """Until every key exists; ``read``: the missing keys and revision of a read just made."""
        backoff = 0.02
        while True:
            missing, revision = read or self._missing(keys)
            read = None
            if not missing:
                return
            if time.monotonic() >= deadline:
                shown = ", ".join(k[len(self._prefix) :].decode(errors="replace") for k in missing[:4])
                more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
                raise StoreTimeoutError(f"etcd keys {shown}{more} did not appear in time")
            outcome = self._client.watch_puts(missing, revision + 1, deadline)
            if outcome == "seen":
                return  # each missing key was written (the others existed at the read)
            if outcome == "broken":
                # The watch could not start or broke: do not spin while a member recovers.
                time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                backoff = min(backoff * 2, _WATCH_BACKOFF_MAX)

    def _restore(self, lease: int) -> None:
        """Put back, under the new ``lease``, this node's keys that expired with the old one."""
        with self._lock:
            items = list(self._owned_values.items())
            for k, _ in items:
                self._raw.pop(k, None)
        restored = 0
        for k, (counter, value) in items:
            stored = _counter_raw(int(value), 1) if counter else value
            create = [{"key": b64(k), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}]
            try:
                result = self._client.txn(create, [_put(k, stored, lease)])
            except EtcdError as exc:
                log.warning("could not restore etcd key %s: %s", k.decode(errors="replace"), exc)
                return
            restored += bool(result.get("succeeded"))
        if restored:
            log.info("restored %d expired etcd keys of this node under a new lease", restored)


def _chunks(keys: Sequence[bytes]) -> list[Sequence[bytes]]:
    return [keys[i : i + MAX_TXN_OPS] for i in range(0, len(keys), MAX_TXN_OPS)] or [keys]
