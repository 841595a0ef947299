"""Every test folder's (tests/, plugins/*/tests/): one marker per need (tests/needs.py), the
fast lane's option that gives each xdist worker a network namespace of its own (tests/lanes.py),
and ``--share K/N`` (or ``LAUNCHER_TEST_SHARE=K/N``): every N-th test from the K-th, for CI's
fast lanes on the other Pythons, which share the fast lane's tests between them."""

from __future__ import annotations

import os

import pytest

from tests import needs


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--worker-netns", action="store_true",
        help="with -n 2 --dist loadgroup: each worker in a network namespace of its own where that can be made "
             "(root), so any module may run beside any other",
    )
    parser.addoption(
        "--share", default=os.environ.get("LAUNCHER_TEST_SHARE", ""), metavar="K/N",
        help="run only every N-th test, from the K-th (0-based) of the collection (default: all; the "
             "environment's LAUNCHER_TEST_SHARE)",
    )


def pytest_configure(config: pytest.Config) -> None:
    needs.register(config)
    # Read (as the option's default) where tests run, then dropped: a pytest that a test starts
    # runs all of its own tests. An xdist controller keeps it for the workers it starts.
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        os.environ.pop("LAUNCHER_TEST_SHARE", None)
    if config.getoption("worker_netns") and hasattr(config, "workerinput"):  # an xdist worker
        from tests.lanes import enter_private_network, private_networks_possible

        if private_networks_possible():
            enter_private_network()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needs.mark(items)
    share = config.getoption("share")
    if share:
        kept, left = _share(items, share)
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = kept
    if config.getoption("worker_netns"):  # modules spread over workers: the slowest first
        from tests.lanes import slowest_modules_first

        slowest_modules_first(items)


def _share(items: list[pytest.Item], share: str) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """``K/N``: the items kept (every N-th, from the K-th) and those left out.

    Every N-th test rather than every N-th module: each share then imports nearly every test
    module (and through them the code), and the shares take about the same time."""
    try:
        k, n = (int(part) for part in share.split("/"))
        if not 0 <= k < n:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"--share {share!r}: expected K/N with 0 <= K < N, like 0/2") from None
    kept = [item for i, item in enumerate(items) if i % n == k]
    left = [item for i, item in enumerate(items) if i % n != k]
    return kept, left
