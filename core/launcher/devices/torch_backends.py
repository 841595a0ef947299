"""Device counts that go through torch: XPU, the privateuse1 backend, and CUDA without NVML.

``import torch`` costs over a second and, for some backends, initialises a driver. Each function
here first decides from what is on disk whether torch could have such devices at all, and imports
torch only when it could:

* torch's build flags (``torch.version.cuda``, ``hip``, ``xpu``) are read from ``torch/version.py``
  as text. A CPU-only build has no CUDA, ROCm or XPU devices, whatever the hardware.
* A privateuse1 backend (Ascend's ``npu``, for instance) only exists in this process once its
  extension is loaded, which torch does at import through the ``torch.backends`` entry-point group.
  The launcher never imports user code, so without such an entry point the backend is torch's
  unrenamed placeholder ``privateuseone``, which has no devices.

When torch is already imported (a plugin or an embedding program did it), torch itself is asked.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from importlib import metadata
from types import ModuleType
from typing import Any

from launcher.devices.errors import DeviceUnavailableError

#: torch's name for the privateuse1 backend until an extension renames it.
DEFAULT_PRIVATEUSE1_NAME = "privateuseone"


def torch_installed() -> bool:
    """Whether ``import torch`` would find a package, without importing it."""
    if "torch" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


_FLAGS = ("cuda", "hip", "xpu")


def torch_build_flags() -> dict[str, str | None] | None:
    """torch's ``version.cuda``, ``hip``, ``xpu`` and ``__version__`` (as ``version``), unimported.

    Returns ``None`` when they cannot be known this way (torch missing, an unusual layout, or a
    torch too old to record a flag); callers then import torch and ask it.
    """
    loaded = sys.modules.get("torch")
    if loaded is not None:
        version = getattr(loaded, "version", None)
        if version is None:
            return None
        flags = {key: getattr(version, key, None) for key in _FLAGS}
        flags["version"] = getattr(version, "__version__", None)
        return flags
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = os.path.join(location, "version.py")
        try:
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read(), path)
        except (OSError, SyntaxError, ValueError):
            continue
        flags = _constant_assignments(tree, (*_FLAGS, "__version__"))
        # A flag missing from the file means an older torch that did not record it: unknown.
        if not all(key in flags for key in _FLAGS):
            return None
        flags["version"] = flags.pop("__version__", None)
        return flags
    return None


def _torch_label(flags: dict[str, str | None]) -> str:
    return f"torch {flags['version']}" if flags.get("version") else "torch"


def _constant_assignments(tree: ast.Module, names: tuple[str, ...]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for node in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if not isinstance(target, ast.Name) or target.id not in names or not isinstance(value, ast.Constant):
            continue
        if value.value is None or isinstance(value.value, str):
            found[target.id] = value.value
    return found


def _import_torch(purpose: str) -> ModuleType:
    try:
        import torch
    except ImportError as exc:
        raise DeviceUnavailableError(f"{purpose} needs torch, which is not installed") from exc
    return torch


# -- CUDA (and ROCm, which torch exposes as torch.cuda) without NVML ------------------------------


def cuda_count_with_torch(nvml_problem: str = "NVML is not installed (pip install nvidia-ml-py)") -> int:
    """``torch.cuda.device_count()``, for when NVML cannot answer (``nvml_problem`` says why).

    Raises :class:`DeviceUnavailableError` without importing torch when torch is missing or its
    build has neither CUDA nor ROCm.
    """
    if not torch_installed():
        raise DeviceUnavailableError(f"{nvml_problem} and torch is not installed")
    flags = torch_build_flags()
    if flags is not None and flags.get("cuda") is None and flags.get("hip") is None:
        raise DeviceUnavailableError(f"{nvml_problem} and {_torch_label(flags)} was built without CUDA")
    torch = _import_torch("counting CUDA devices")
    # device_count() asks the driver without creating a context on any device.
    return int(torch.cuda.device_count())


def cuda_pci_bus_ids_with_torch() -> list[str | None]:
    """PCI bus ids of the devices ``torch.cuda`` sees, ``None`` where torch does not say."""
    torch = _import_torch("locating CUDA devices")
    ids: list[str | None] = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        ids.append(_bus_id_from_properties(props))
    return ids


def _bus_id_from_properties(props: Any) -> str | None:
    domain = getattr(props, "pci_domain_id", None)
    bus = getattr(props, "pci_bus_id", None)
    device = getattr(props, "pci_device_id", None)
    if not all(isinstance(part, int) for part in (domain, bus, device)):
        return None
    # sysfs spells function 0 of the device; GPUs expose their compute function there.
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


# -- XPU ------------------------------------------------------------------------------------------


def xpu_count() -> int:
    """``torch.xpu.device_count()`` when torch has XPU support and a device is available."""
    if not torch_installed():
        raise DeviceUnavailableError("XPU devices are counted through torch, which is not installed")
    flags = torch_build_flags()
    if flags is not None and flags.get("xpu") is None:
        raise DeviceUnavailableError(f"{_torch_label(flags)} was built without XPU support")
    torch = _import_torch("counting XPU devices")
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return 0
    return int(xpu.device_count())


# -- privateuse1 ----------------------------------------------------------------------------------


def _backend_may_be_registered() -> bool:
    """Whether importing torch could register a privateuse1 backend in this process."""
    if "torch" in sys.modules:
        return True
    # torch honours this switch before loading its backend extensions.
    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "1":
        return False
    try:
        return any(True for _ in metadata.entry_points(group="torch.backends"))
    except Exception:  # a broken distribution's metadata must not hide a backend: assume one
        return True


def privateuse1_name() -> str:
    """The privateuse1 backend's name (``npu``, ``hpu``...), importing torch only if it may differ."""
    if not torch_installed() or not _backend_may_be_registered():
        return DEFAULT_PRIVATEUSE1_NAME
    torch = _import_torch("naming the privateuse1 backend")
    return str(torch._C._get_privateuse1_backend_name())


def privateuse1_answers_to(name: str) -> bool:
    """Whether ``name`` is the privateuse1 backend's name (``--nproc-per-node npu``)."""
    try:
        return name.strip().lower() == privateuse1_name().lower()
    except Exception:  # torch failing to import means the name is not this backend's
        return False


def privateuse1_count() -> int:
    """Devices of the privateuse1 backend, through the module it registers on torch."""
    if not torch_installed():
        raise DeviceUnavailableError("privateuse1 devices are counted through torch, which is not installed")
    if not _backend_may_be_registered():
        raise DeviceUnavailableError(
            "no privateuse1 backend is installed (torch loads them through the torch.backends entry points)"
        )
    torch = _import_torch("counting privateuse1 devices")
    name = torch._C._get_privateuse1_backend_name()
    module = getattr(torch, name, None)
    is_available = getattr(module, "is_available", None)
    device_count = getattr(module, "device_count", None)
    if not callable(is_available) or not callable(device_count):
        raise DeviceUnavailableError(f"the privateuse1 backend {name!r} registers no device module on torch")
    return int(device_count()) if is_available() else 0
