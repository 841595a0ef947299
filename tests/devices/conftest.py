"""Fixtures for the device-provider tests.

There is no NVIDIA GPU on the machines these tests run on, so NVML is the one thing mocked: a
stand-in ``pynvml`` module, written to a temporary directory and put first on ``sys.path``, offers
the same functions the real ``nvidia-ml-py`` module does (and raises its ``NVMLError`` the same
way). Everything above it (visibility rules, fallback, registration, resolution) is the real code.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from launcher.plugins.manager import LauncherPluginManager, get_plugin_manager

#: Four GPUs as NVML lists them (PCI bus order). GPUs 0 and 1 share a long UUID prefix on purpose.
FOUR_GPUS: list[dict[str, Any]] = [
    {"uuid": "GPU-5e2a9c1b-1f0e-4c1a-9b7e-0a1b2c3d4e01", "bus_id": "00000000:18:00.0"},
    {"uuid": "GPU-5e2a9c1b-1f0e-4c1a-9b7e-0a1b2c3d4e02", "bus_id": "00000000:3B:00.0"},
    {"uuid": "GPU-8f3d7a60-2b1c-4d2e-8c9f-1a2b3c4d5e03", "bus_id": "00000000:86:00.0"},
    {
        "uuid": "GPU-c07e4b19-3c2d-4e3f-9daf-2b3c4d5e6f04",
        "bus_id": "00000000:AF:00.0",
        "mig": ["MIG-1a2b3c4d-5e6f-5a7b-8c9d-0e1f2a3b4c01", "MIG-9f8e7d6c-5b4a-5c3d-2e1f-0a9b8c7d6e02"],
    },
]

#: Those bus ids as sysfs spells them.
FOUR_BUS_IDS = ["0000:18:00.0", "0000:3b:00.0", "0000:86:00.0", "0000:af:00.0"]

FAKE_PYNVML = textwrap.dedent(
    '''
    """Stand-in for nvidia-ml-py's pynvml: the same functions, answering from fake_nvml.json."""
    import json
    import os

    NVML_SUCCESS = 0
    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_UNKNOWN = 999
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1

    _MESSAGES = {
        1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 6: "Not Found",
        9: "Driver Not Loaded", 12: "NVML Shared Library Not Found", 999: "Unknown Error",
    }
    _CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_nvml.json")

    calls = []
    _state = {"refcount": 0, "config": None}


    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(value)
            self.value = value

        def __str__(self):
            return _MESSAGES.get(self.value, "NVML Error with code %d" % self.value)


    class _Handle:
        def __init__(self, gpu, mig=None):
            self.gpu = gpu
            self.mig = mig


    class _PciInfo:
        def __init__(self, bus_id):
            self.busId = bus_id
            self.busIdLegacy = bus_id[-12:]


    def _config():
        if not _state["refcount"]:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return _state["config"]


    def nvmlInit():
        calls.append("nvmlInit")
        with open(_CONFIG) as handle:
            config = json.load(handle)
        if config.get("init_error") is not None:
            raise NVMLError(config["init_error"])
        _state["config"] = config
        _state["refcount"] += 1


    def nvmlShutdown():
        calls.append("nvmlShutdown")
        _config()
        _state["refcount"] -= 1


    def nvmlDeviceGetCount():
        calls.append("nvmlDeviceGetCount")
        config = _config()
        if config.get("count_error") is not None:
            raise NVMLError(config["count_error"])
        return len(config["gpus"])


    def nvmlDeviceGetHandleByIndex(index):
        gpus = _config()["gpus"]
        if not 0 <= index < len(gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(gpus[index])


    def nvmlDeviceGetUUID(handle):
        _config()
        return handle.mig if handle.mig is not None else handle.gpu["uuid"]


    def nvmlDeviceGetPciInfo(handle):
        _config()
        bus_id = handle.gpu["bus_id"]
        return _PciInfo(bus_id.encode() if _state["config"].get("bytes_bus_ids") else bus_id)


    def nvmlDeviceGetMigMode(handle):
        _config()
        if "mig" not in handle.gpu:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if handle.gpu["mig"] else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]


    def nvmlDeviceGetMaxMigDeviceCount(handle):
        _config()
        return 7


    def nvmlDeviceGetMigDeviceHandleByIndex(handle, index):
        _config()
        migs = handle.gpu.get("mig") or []
        if index >= len(migs):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, migs[index])
    '''
)


class FakeNvml:
    """Controls the stand-in ``pynvml`` for one test."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        (directory / "pynvml.py").write_text(FAKE_PYNVML)
        self.configure(FOUR_GPUS)

    def configure(self, gpus: list[dict[str, Any]], **options: Any) -> None:
        """Set the GPUs NVML reports; options: ``init_error``, ``count_error``, ``bytes_bus_ids``."""
        (self.directory / "fake_nvml.json").write_text(json.dumps({"gpus": gpus, **options}))

    @property
    def module(self) -> Any:
        return sys.modules["pynvml"]

    @property
    def calls(self) -> list[str]:
        import pynvml

        return pynvml.calls


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    """A stand-in ``pynvml`` on ``sys.path`` reporting :data:`FOUR_GPUS`."""
    directory = tmp_path / "fake_nvml"
    directory.mkdir()
    fake = FakeNvml(directory)
    monkeypatch.syspath_prepend(str(directory))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield fake
    sys.modules.pop("pynvml", None)


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import pynvml`` fail, as on a host without nvidia-ml-py."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def manager() -> LauncherPluginManager:
    """A fresh plugin manager with the installed plugins (the built-ins among them)."""
    return get_plugin_manager(environ={})


@pytest.fixture
def run_python() -> Callable[..., str]:
    """Run a Python snippet in a fresh interpreter and return its stdout (fails on non-zero exit)."""
    import os
    import subprocess

    def _run(code: str, *, pythonpath: list[str] | None = None, env: dict[str, str] | None = None) -> str:
        environment = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        if pythonpath:
            environment["PYTHONPATH"] = os.pathsep.join([*pythonpath, environment.get("PYTHONPATH", "")])
        environment.update(env or {})
        done = subprocess.run(
            [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    return _run
