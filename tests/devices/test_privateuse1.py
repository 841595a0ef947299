"""The privateuse1 provider: found under the backend's own name, counted through torch."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable

import pytest
from launcher.devices import resolve_nproc_per_node, torch_backends
from launcher.errors import UsageError
from launcher.plugins.manager import LauncherPluginManager, PluginNotFoundError

# A backend registers the way out-of-tree devices do (torch_npu, for instance): rename privateuse1
# and attach a device module to torch. The module here answers like a host with three devices.
REGISTER_BACKEND = """
import json, sys, types
sys.modules["pynvml"] = None  # no NVIDIA stack on this host
import torch
torch.utils.rename_privateuse1_backend("fakeacc")
module = types.ModuleType("torch_fakeacc")
module.is_available = lambda: True
module.device_count = lambda: 3
torch._register_device_module("fakeacc", module)

from launcher.plugins.manager import get_plugin_manager
from launcher.devices import resolve_nproc_per_node
manager = get_plugin_manager(environ={})
results = {}
for name in ("fakeacc", "FakeAcc", "privateuse1", "auto"):
    count, provider = resolve_nproc_per_node(name, manager)
    results[name] = [count, provider.name]
print(json.dumps(results))
"""


def _need_torch() -> None:
    # find_spec, not importorskip: this process must not import torch for the later checks.
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")


def test_backend_name_resolves_after_registration(run_python: Callable[..., str]) -> None:
    _need_torch()
    results = json.loads(run_python(REGISTER_BACKEND, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}))
    assert results == {
        "fakeacc": [3, "privateuse1"],
        "FakeAcc": [3, "privateuse1"],
        "privateuse1": [3, "privateuse1"],
        "auto": [3, "privateuse1"],
    }


def test_without_a_backend_only_torchs_placeholder_name_is_claimed(
    manager: LauncherPluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch_backends, "_backend_may_be_registered", lambda: False)
    assert torch_backends.privateuse1_answers_to("privateuseone")
    assert not torch_backends.privateuse1_answers_to("npu")
    with pytest.raises(PluginNotFoundError):
        resolve_nproc_per_node("npu", manager)
    with pytest.raises(UsageError) as info:
        resolve_nproc_per_node("privateuseone", manager)
    assert "\n" not in str(info.value)
    assert "no privateuse1 backend is installed" in str(info.value)


def test_backend_check_reads_torchs_autoload_switch(run_python: Callable[..., str]) -> None:
    code = "from launcher.devices.torch_backends import _backend_may_be_registered as f; print(f())"
    assert run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}).strip() == "False"


def test_build_flags_read_without_import(run_python: Callable[..., str]) -> None:
    _need_torch()
    code = (
        "import json, sys\n"
        "from launcher.devices.torch_backends import torch_build_flags\n"
        "flags = torch_build_flags()\n"
        "print(json.dumps({'flags': flags, 'torch': 'torch' in sys.modules}))\n"
    )
    unimported = json.loads(run_python(code))
    assert unimported["torch"] is False
    import torch

    assert unimported["flags"] == {
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "xpu": getattr(torch.version, "xpu", None),
        "version": torch.__version__,
    }
