"""Every test folder's (tests/, plugins/*/tests/): one marker per need (tests/needs.py), and the
fast lane's option that gives each xdist worker a network namespace of its own (tests/lanes.py)."""

from __future__ import annotations

import pytest

from tests import needs


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--worker-netns", action="store_true",
        help="with -n 2 --dist loadgroup: each worker in a network namespace of its own where that can be made "
             "(root), so any module may run beside any other",
    )


def pytest_configure(config: pytest.Config) -> None:
    needs.register(config)
    if config.getoption("worker_netns") and hasattr(config, "workerinput"):  # an xdist worker
        from tests.lanes import enter_private_network, private_networks_possible

        if private_networks_possible():
            enter_private_network()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needs.mark(items)
    if config.getoption("worker_netns"):  # modules spread over workers: the slowest first
        from tests.lanes import slowest_modules_first

        slowest_modules_first(items)
