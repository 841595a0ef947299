"""Every test folder's (tests/, plugins/*/tests/): one marker per need, see tests/needs.py."""

from __future__ import annotations

import pytest

from tests import needs


def pytest_configure(config: pytest.Config) -> None:
    needs.register(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    needs.mark(items)
