"""The core's built-in plugins against launcher.testing's suites for their kinds.

The built-ins register through the same entry-point group as a third party's plugins, so they
are held to the same contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from launcher.testing import (
    DeviceProviderConformance,
    EventHandlerConformance,
    LogsSpecsConformance,
    NumaStrategyConformance,
)


class TestDefaultLogsSpecs(LogsSpecsConformance):
    logs_specs_name = "default"


class TestNullEventHandler(EventHandlerConformance):
    event_handler_name = "null"


class TestConsoleEventHandler(EventHandlerConformance):
    event_handler_name = "console"


class TestJsonlEventHandler(EventHandlerConformance):
    event_handler_name = "jsonl"

    @pytest.fixture
    def sink_environ(self, tmp_path: Path) -> Mapping[str, str]:
        return {"LAUNCHER_EVENTS_FILE": str(tmp_path / "events" / "{run_id}-{node}.jsonl")}


class TestNodeStrategy(NumaStrategyConformance):
    numa_strategy_name = "node"


class TestSocketStrategy(NumaStrategyConformance):
    numa_strategy_name = "socket"


class TestExclusiveStrategy(NumaStrategyConformance):
    numa_strategy_name = "exclusive"


class TestCoreComplexStrategy(NumaStrategyConformance):
    numa_strategy_name = "core-complex"


class TestCpuDevices(DeviceProviderConformance):
    device_provider_name = "cpu"


class TestCudaDevices(DeviceProviderConformance):
    device_provider_name = "cuda"


class TestXpuDevices(DeviceProviderConformance):
    device_provider_name = "xpu"


class TestAutoDevices(DeviceProviderConformance):
    device_provider_name = "auto"


class TestPrivateuse1Devices(DeviceProviderConformance):
    device_provider_name = "privateuse1"
