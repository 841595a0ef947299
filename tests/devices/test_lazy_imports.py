"""Listing and resolving providers stays cheap: no torch, and pynvml only when counting CUDA.

Each check runs in a fresh interpreter, since this test process may have imported torch already.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .conftest import FOUR_BUS_IDS, FakeNvml

LIST_ALL = """
import json, sys
from launcher.plugins.listing import registration_rows
from launcher.plugins.manager import get_plugin_manager
manager = get_plugin_manager(environ={})
rows = registration_rows(manager)
print(json.dumps({
    "names": sorted(r.name for r in rows if r.kind in ("device provider", "numa strategy")),
    "torch": "torch" in sys.modules,
    "pynvml": "pynvml" in sys.modules,
}))
"""

RESOLVE = """
import json, sys
from launcher.plugins.manager import get_plugin_manager
from launcher.devices import resolve_nproc_per_node
manager = get_plugin_manager(environ={})
count, provider = resolve_nproc_per_node(sys.argv[1] if len(sys.argv) > 1 else "auto", manager)
print(json.dumps({
    "count": count,
    "provider": provider.name,
    "bus_ids": provider.pci_bus_ids() if provider.pci_bus_ids else None,
    "torch": "torch" in sys.modules,
    "pynvml": "pynvml" in sys.modules,
}))
"""


def test_collecting_registrations_imports_neither_torch_nor_pynvml(
    fake_nvml: FakeNvml, run_python: Callable[..., str]
) -> None:
    result = json.loads(run_python(LIST_ALL, pythonpath=[str(fake_nvml.directory)]))
    assert {"auto", "cpu", "cuda", "xpu", "privateuse1"} <= set(result["names"])
    assert {"node", "socket", "exclusive", "core-complex"} <= set(result["names"])
    assert result["torch"] is False
    assert result["pynvml"] is False


def test_auto_with_nvml_never_imports_torch(fake_nvml: FakeNvml, run_python: Callable[..., str]) -> None:
    result = json.loads(run_python(RESOLVE, pythonpath=[str(fake_nvml.directory)]))
    assert result == {"count": 4, "provider": "cuda", "bus_ids": FOUR_BUS_IDS, "torch": False, "pynvml": True}


def test_auto_without_nvml_on_a_cpu_only_torch_never_imports_torch(
    no_nvml: None, run_python: Callable[..., str], tmp_path: object
) -> None:
    import importlib.util

    from launcher.devices import torch_backends

    flags = torch_backends.torch_build_flags()
    # Hide any pynvml the machine may have, the way a missing install would.
    blocker = "import sys; sys.modules['pynvml'] = None\n"
    result = json.loads(run_python(blocker + RESOLVE))
    if flags is not None and flags["cuda"] is None and flags["hip"] is None and flags["xpu"] is None:
        assert result["provider"] == "cpu"
        assert result["torch"] is False
    else:  # a torch with accelerator support is asked, as it must be
        assert importlib.util.find_spec("torch") is not None
