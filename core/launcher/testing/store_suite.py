"""Conformance suite for :class:`~launcher.store.api.KeyValueStore` implementations.

The core's rendezvous relies on exactly these semantics: ``add`` hands out join order (so it
must be atomic across clients), ``compare_set`` decides races, blocking reads wait in short
slices on one connection (so a timed-out wait must leave the client usable), and the agent's
rank exchange uses ``multi_get`` and ``multi_set``.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import ClassVar

import pytest

from launcher.store.api import KeyValueStore, StoreError, StoreTimeoutError

__all__ = ["KeyValueStoreConformance", "StoreFactory"]

#: Makes a new client of the store under test; every client of one test reaches the same data.
StoreFactory = Callable[[], KeyValueStore]


def _run_threads(targets: list[Callable[[], None]], timeout: float) -> None:
    """Run each target on its own thread; re-raise the first failure; fail if one hangs."""
    errors: list[BaseException] = []

    def guard(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    threads = [threading.Thread(target=guard, args=(t,), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    end = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        pytest.fail(f"store calls on {len(targets)} threads did not finish within {timeout:g} s")
    if errors:
        raise errors[0]


class KeyValueStoreConformance:
    """Tests every :class:`~launcher.store.api.KeyValueStore` operation.

    Subclass it and provide the ``kv_store_factory`` fixture: a callable that returns a *new
    client* of one shared store each time it is called (tests use several clients to check
    that one sees what another wrote, and one client per thread, since a client serves one
    thread at a time). The suite closes every client it makes. Each test uses its own key
    prefix, so the store need not be emptied between tests.

    Class attributes tune the timing checks: ``short_timeout`` (seconds a wait is asked to
    last before it must time out) and ``timing_slack`` (extra seconds allowed for a timeout to
    be noticed, or a write to wake a waiter).
    """

    #: Seconds a test asks a blocking call to wait for a key that never comes.
    short_timeout: ClassVar[float] = 0.3
    #: Extra seconds allowed beyond a timeout, or for a write to wake a waiter.
    timing_slack: ClassVar[float] = 2.0
    #: Threads (each with its own client) in the concurrency tests.
    concurrency: ClassVar[int] = 4
    #: ``add`` calls per thread in the atomicity test.
    adds_per_thread: ClassVar[int] = 50

    @pytest.fixture
    def kv_store_factory(self) -> StoreFactory:
        """Override: return a callable making a new client of the store under test."""
        pytest.fail(f"{type(self).__name__} must provide the kv_store_factory fixture")

    @pytest.fixture
    def kv_clients(self, kv_store_factory: StoreFactory) -> Iterator[StoreFactory]:
        """Like ``kv_store_factory``, but the clients are closed after the test."""
        made: list[KeyValueStore] = []

        def make() -> KeyValueStore:
            client = kv_store_factory()
            made.append(client)
            return client

        yield make
        for client in made:
            with contextlib.suppress(Exception):  # a failing close must not hide the test's outcome
                client.close()

    @pytest.fixture
    def kv_store(self, kv_clients: StoreFactory) -> KeyValueStore:
        """One client of the store under test."""
        return kv_clients()

    @pytest.fixture
    def key(self) -> Callable[[str], str]:
        """``key(name)``: a key unique to this test, so tests never see each other's data."""
        prefix = f"conformance/{uuid.uuid4().hex}/"
        return lambda name: prefix + name

    # -- set, get --------------------------------------------------------------------------------

    def test_set_then_get(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        kv_store.set(key("a"), b"value")
        value = kv_store.get(key("a"), timeout=5)
        assert value == b"value"
        assert isinstance(value, bytes), f"get returned {type(value).__name__}, not bytes"

    def test_set_overwrites(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        kv_store.set(key("a"), b"first")
        kv_store.set(key("a"), b"second")
        assert kv_store.get(key("a"), timeout=5) == b"second"

    def test_values_are_opaque_bytes(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        binary = bytes(range(256)) * 4
        large = b"x" * (64 * 1024)
        kv_store.set(key("binary"), binary)
        kv_store.set(key("empty"), b"")
        kv_store.set(key("large"), large)
        assert kv_store.get(key("binary"), timeout=5) == binary
        assert kv_store.get(key("empty"), timeout=5) == b""
        assert kv_store.get(key("large"), timeout=5) == large

    def test_keys_are_distinct_strings(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        # Prefix-related keys must not alias (the rendezvous nests keys under run ids and rounds).
        names = ["run", "run/1", "run/10", "run-1", "Run", "run/1/x"]
        for index, name in enumerate(names):
            kv_store.set(key(name), str(index).encode())
        assert [kv_store.get(key(name), timeout=5) for name in names] == [
            str(i).encode() for i in range(len(names))
        ]

    def test_other_clients_see_writes(self, kv_clients: StoreFactory, key: Callable[[str], str]) -> None:
        writer, reader = kv_clients(), kv_clients()
        writer.set(key("shared"), b"hello")
        assert reader.get(key("shared"), timeout=5) == b"hello"

    def test_get_waits_for_the_key(self, kv_clients: StoreFactory, key: Callable[[str], str]) -> None:
        reader, writer = kv_clients(), kv_clients()
        got: list[bytes] = []
        delay = 0.3
        started = time.monotonic()
        thread = threading.Thread(target=lambda: got.append(reader.get(key("late"), timeout=30)), daemon=True)
        thread.start()
        time.sleep(delay)
        writer.set(key("late"), b"now")
        thread.join(30)
        assert got == [b"now"], "get did not return the value written while it waited"
        elapsed = time.monotonic() - started
        assert elapsed < delay + self.timing_slack, f"get woke {elapsed - delay:.2f} s after the write"

    def test_get_times_out(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        started = time.monotonic()
        with pytest.raises(StoreTimeoutError):
            kv_store.get(key("never"), timeout=self.short_timeout)
        elapsed = time.monotonic() - started
        assert elapsed >= self.short_timeout * 0.9, f"get gave up after {elapsed:.2f} s"
        assert elapsed < self.short_timeout + self.timing_slack, f"get timed out after {elapsed:.2f} s"

    def test_timeout_is_a_store_error_and_a_timeout_error(
        self, kv_store: KeyValueStore, key: Callable[[str], str]
    ) -> None:
        with pytest.raises(StoreError) as caught:
            kv_store.get(key("never"), timeout=self.short_timeout)
        assert isinstance(caught.value, TimeoutError)

    def test_client_is_usable_after_a_timeout(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        # The rendezvous waits in short slices on one connection: a timeout must not break it.
        for _ in range(3):
            with pytest.raises(StoreTimeoutError):
                kv_store.wait([key("never")], timeout=self.short_timeout / 3)
        kv_store.set(key("after"), b"ok")
        assert kv_store.get(key("after"), timeout=5) == b"ok"
        assert kv_store.add(key("n"), 2) == 2

    # -- wait, check -----------------------------------------------------------------------------

    def test_wait_returns_once_every_key_exists(self, kv_clients: StoreFactory, key: Callable[[str], str]) -> None:
        waiter, writer = kv_clients(), kv_clients()
        done = threading.Event()
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                waiter.wait([key("a"), key("b")], timeout=30)
                done.set()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        writer.set(key("a"), b"1")
        time.sleep(0.3)
        assert not done.is_set() and not errors, "wait returned while one of its keys was missing"
        writer.set(key("b"), b"2")
        thread.join(self.timing_slack + 1)
        assert not errors, f"wait failed: {errors[0]!r}" if errors else ""
        assert done.is_set(), "wait did not return after every key was written"

    def test_wait_on_existing_keys_returns_at_once(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        kv_store.set(key("a"), b"1")
        started = time.monotonic()
        kv_store.wait([key("a")], timeout=30)
        assert time.monotonic() - started < self.timing_slack

    def test_wait_times_out(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        kv_store.set(key("a"), b"1")
        started = time.monotonic()
        with pytest.raises(StoreTimeoutError):
            kv_store.wait([key("a"), key("never")], timeout=self.short_timeout)
        assert time.monotonic() - started < self.short_timeout + self.timing_slack

    def test_check(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        assert kv_store.check([key("a")]) is False
        kv_store.set(key("a"), b"")
        assert kv_store.check([key("a")]) is True
        assert kv_store.check([key("a"), key("b")]) is False, "check must need every key"
        kv_store.set(key("b"), b"x")
        assert kv_store.check([key("a"), key("b")]) is True

    # -- add -------------------------------------------------------------------------------------

    def test_add(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        assert kv_store.add(key("n"), 1) == 1, "a missing key counts as 0"
        assert kv_store.add(key("n"), 5) == 6
        assert kv_store.add(key("n"), -2) == 4
        assert kv_store.add(key("n"), 0) == 4, "add(key, 0) reads the counter"
        assert kv_store.add(key("big"), 1 << 41) == 1 << 41, "counters hold 64-bit values"

    def test_add_is_atomic_across_clients(self, kv_clients: StoreFactory, key: Callable[[str], str]) -> None:
        clients = [kv_clients() for _ in range(self.concurrency)]
        results: list[list[int]] = [[] for _ in clients]

        def adder(index: int) -> Callable[[], None]:
            def run() -> None:
                for _ in range(self.adds_per_thread):
                    results[index].append(clients[index].add(key("counter"), 1))

            return run

        _run_threads([adder(i) for i in range(len(clients))], timeout=120)
        total = self.concurrency * self.adds_per_thread
        seen = sorted(value for values in results for value in values)
        # Every add returned a distinct value: the rendezvous uses them as join order.
        assert seen == list(range(1, total + 1)), "concurrent adds lost updates or returned duplicates"
        assert clients[0].add(key("counter"), 0) == total

    # -- compare_set -----------------------------------------------------------------------------

    def test_compare_set_creates_a_missing_key(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        assert kv_store.compare_set(key("k"), b"", b"new") == b"new"
        assert kv_store.get(key("k"), timeout=5) == b"new"

    def test_compare_set_replaces_the_expected_value(
        self, kv_store: KeyValueStore, key: Callable[[str], str]
    ) -> None:
        kv_store.set(key("k"), b"old")
        assert kv_store.compare_set(key("k"), b"old", b"new") == b"new"
        assert kv_store.get(key("k"), timeout=5) == b"new"

    def test_compare_set_keeps_another_value(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        kv_store.set(key("k"), b"current")
        assert kv_store.compare_set(key("k"), b"other", b"new") == b"current", (
            "a failed compare_set must return the value now stored"
        )
        assert kv_store.compare_set(key("k"), b"", b"new") == b"current", "b'' only matches a missing key"
        assert kv_store.get(key("k"), timeout=5) == b"current"

    def test_compare_set_on_a_missing_key_with_an_expected_value(
        self, kv_store: KeyValueStore, key: Callable[[str], str]
    ) -> None:
        # torch's server answers `expected` here although nothing is stored; callers test success
        # with `result == desired`, so either answer is accepted, as long as nothing is written.
        result = kv_store.compare_set(key("k"), b"something", b"new")
        assert result != b"new"
        assert kv_store.check([key("k")]) is False

    def test_compare_set_race_has_one_winner(self, kv_clients: StoreFactory, key: Callable[[str], str]) -> None:
        clients = [kv_clients() for _ in range(self.concurrency)]
        answers: dict[int, bytes] = {}

        def racer(index: int) -> Callable[[], None]:
            def run() -> None:
                answers[index] = clients[index].compare_set(key("race"), b"", f"node-{index}".encode())

            return run

        _run_threads([racer(i) for i in range(len(clients))], timeout=60)
        winners = [i for i, answer in answers.items() if answer == f"node-{i}".encode()]
        assert len(winners) == 1, f"compare_set race: {len(winners)} clients think they won ({answers})"
        stored = clients[0].get(key("race"), timeout=5)
        assert set(answers.values()) == {stored}, "every racer must be told the winning value"

    # -- multi_get, multi_set, delete ------------------------------------------------------------

    def test_multi_set_and_multi_get(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        names = [key(f"m{i}") for i in range(5)]
        kv_store.multi_set(names, [f"v{i}".encode() for i in range(5)])
        assert kv_store.multi_get(list(reversed(names)), timeout=5) == [f"v{i}".encode() for i in reversed(range(5))]
        assert kv_store.multi_get([], timeout=5) == []

    def test_multi_get_waits_for_every_key(self, kv_clients: StoreFactory, key: Callable[[str], str]) -> None:
        reader, writer = kv_clients(), kv_clients()
        writer.set(key("a"), b"1")
        got: list[list[bytes]] = []
        thread = threading.Thread(
            target=lambda: got.append(reader.multi_get([key("a"), key("b")], timeout=30)), daemon=True
        )
        thread.start()
        time.sleep(0.3)
        assert not got, "multi_get returned while one of its keys was missing"
        writer.set(key("b"), b"2")
        thread.join(self.timing_slack + 1)
        assert got == [[b"1", b"2"]]

    def test_multi_get_times_out(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        kv_store.set(key("a"), b"1")
        with pytest.raises(StoreTimeoutError):
            kv_store.multi_get([key("a"), key("never")], timeout=self.short_timeout)

    def test_delete(self, kv_store: KeyValueStore, key: Callable[[str], str]) -> None:
        kv_store.set(key("a"), b"1")
        assert kv_store.delete(key("a")) is True
        assert kv_store.check([key("a")]) is False
        assert kv_store.delete(key("a")) is False, "deleting a missing key returns False"
        with pytest.raises(StoreTimeoutError):
            kv_store.get(key("a"), timeout=self.short_timeout)
        assert kv_store.add(key("a"), 1) == 1, "a deleted counter starts again from 0"

    def test_closing_a_client_leaves_the_others_working(
        self, kv_clients: StoreFactory, key: Callable[[str], str]
    ) -> None:
        first, second = kv_clients(), kv_clients()
        first.set(key("a"), b"1")
        first.close()
        assert second.get(key("a"), timeout=5) == b"1"
        second.set(key("b"), b"2")
        assert kv_clients().get(key("b"), timeout=5) == b"2"
