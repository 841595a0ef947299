"""The ``gpu`` check: the GPUs the workers will use are there, and none reports a fault.

Through NVML (:mod:`launcher.health.nvml`), never a CUDA context. Sick when (thresholds, also in
docs/health.md):

- fewer GPUs are visible than the node should have: the ``CUDA_VISIBLE_DEVICES`` entries of the
  workers' environment (each index must exist, each ``GPU-`` UUID must be found), else
  ``--nproc-per-node`` when it counted GPUs (``gpu``, ``cuda``, ``auto`` on a GPU node);
- a device is lost from the bus (NVML answers "GPU is lost" for it);
- a device has one or more uncorrectable ECC errors since the driver loaded (NVML's volatile
  counter: the memory gave wrong data, and the driver wants the GPU reset or drained);
- a device has retired pages pending (a reset is needed before they are retired), or row
  remapping failed or is pending (Ampere and later; the same).

Faults count on the GPUs the workers use only: every GPU, unless ``CUDA_VISIBLE_DEVICES`` names
some (a bad GPU another job's workers use is not this job's problem).

Skipped when the node has no NVIDIA driver (:func:`nvidia_driver_present`: then NVML is not even
loaded), when NVML cannot be loaded or initialised, or when NVML sees no GPU and none is expected.
Calls a GPU does not support (ECC on consumer GPUs, row remapping before Ampere) are not faults.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.health.api import CheckContext, CheckResult, healthy, sick, skipped

if TYPE_CHECKING:  # pragma: no cover
    from launcher.health.nvml import NvmlLibrary

__all__ = ["DRIVER_PATHS", "GPU_DEVICE_KINDS", "check_gpus", "gpu_check", "nvidia_driver_present"]

#: What an NVIDIA driver leaves on a node: the kernel module's ``/proc`` directory and control
#: device (also inside a container the NVIDIA runtime set up), or WSL's GPU device. NVML cannot
#: answer without one of them, so where none exists the check skips without loading NVML (ctypes
#: and the binding cost milliseconds of every launch on a CPU node).
DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")

#: Device providers whose count is a count of NVIDIA GPUs.
GPU_DEVICE_KINDS = frozenset({"gpu", "cuda"})
#: Uncorrectable ECC errors a device may have (volatile counter) and still be healthy.
MAX_UNCORRECTABLE_ECC = 0


def gpu_check(load: Callable[[], NvmlLibrary] | None = None) -> Callable[[CheckContext], CheckResult]:
    """The check, reading NVML through what ``load`` returns (default: the real library)."""

    def check(context: CheckContext) -> CheckResult:
        if load is None and not nvidia_driver_present():
            return skipped(f"no NVIDIA driver on this node (none of {', '.join(DRIVER_PATHS)} exists)")
        from launcher.health.nvml import NvmlUnavailable

        try:
            if load is not None:
                nvml = load()
            else:
                from launcher.health.nvml import CtypesNvml

                nvml = CtypesNvml()
        except NvmlUnavailable as exc:
            return skipped(str(exc))
        return check_gpus(nvml, context)

    return check


def nvidia_driver_present() -> bool:
    """Whether any of :data:`DRIVER_PATHS` exists (a few ``stat`` calls, nothing loaded)."""
    return any(os.path.exists(path) for path in DRIVER_PATHS)


def _expected(context: CheckContext) -> tuple[list[str] | None, int | None]:
    """The ``CUDA_VISIBLE_DEVICES`` entries (``None`` when unset), and how many GPUs are expected."""
    visible = context.env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        return entries, len(entries)
    if context.device_kind in GPU_DEVICE_KINDS:
        return None, context.nproc_per_node
    return None, None


def check_gpus(nvml: NvmlLibrary, context: CheckContext) -> CheckResult:
    """The answer for the devices ``nvml`` reports (see the module docstring)."""
    from launcher.health.nvml import NVML_SUCCESS, error_name

    code = nvml.init()
    entries, expected = _expected(context)
    if code != NVML_SUCCESS:
        return skipped(f"NVML cannot start here ({error_name(code)})")
    try:
        code, count = nvml.device_count()
        if code != NVML_SUCCESS:
            return sick(f"NVML cannot count the GPUs ({error_name(code)})")
        if count == 0 and not expected:
            return skipped("NVML sees no GPU on this node, and none is expected")
        uuids: dict[str, int] = {}
        faults: dict[int, str] = {}
        for index in range(count):
            problem, uuid = _device_problem(nvml, index)
            if uuid:
                uuids[uuid] = index
            if problem:
                faults[index] = problem
        used = _used_devices(entries, uuids) if entries is not None else None
        # A fault on a GPU the workers do not use (CUDA_VISIBLE_DEVICES leaves it out) is not this job's.
        problems = [problem for index, problem in faults.items() if used is None or index in used]
        if entries is not None:
            problems += _missing_entries(entries, count, uuids)
        if expected is not None and count < expected:
            problems.insert(0, f"{count} GPU(s) visible to NVML, {expected} expected")
        if problems:
            return sick("; ".join(problems))
        return healthy()
    finally:
        nvml.shutdown()


def _device_problem(nvml: NvmlLibrary, index: int) -> tuple[str | None, str]:
    """What is wrong with GPU ``index`` (``None``: nothing), and its UUID ("" when unknown)."""
    from launcher.health.nvml import NVML_ERROR_GPU_IS_LOST, NVML_SUCCESS, error_name

    code, device = nvml.handle(index)
    if code == NVML_ERROR_GPU_IS_LOST:
        return f"GPU {index} is lost from the bus", ""
    if code != NVML_SUCCESS:
        return f"GPU {index} cannot be opened ({error_name(code)})", ""
    code, uuid = nvml.uuid(device)
    uuid = uuid if code == NVML_SUCCESS else ""
    name = f"GPU {index}" + (f" ({uuid})" if uuid else "")
    faults = []
    code, errors = nvml.uncorrectable_ecc_errors(device)
    lost = code == NVML_ERROR_GPU_IS_LOST
    if code == NVML_SUCCESS and errors > MAX_UNCORRECTABLE_ECC:
        faults.append(f"{errors} uncorrectable ECC error(s) since the driver loaded")
    code, pending = nvml.retired_pages_pending(device)
    lost = lost or code == NVML_ERROR_GPU_IS_LOST
    if code == NVML_SUCCESS and pending:
        faults.append("retired pages pending (needs a GPU reset)")
    code, (remap_pending, remap_failed) = nvml.remapped_rows(device)
    lost = lost or code == NVML_ERROR_GPU_IS_LOST
    if code == NVML_SUCCESS and remap_failed:
        faults.append("row remapping failed")
    elif code == NVML_SUCCESS and remap_pending:
        faults.append("row remapping pending (needs a GPU reset)")
    if lost:  # the device answered its handle, then fell off the bus
        return f"{name} is lost from the bus", uuid
    return (f"{name}: {', '.join(faults)}" if faults else None), uuid


def _used_devices(entries: list[str], uuids: dict[str, int]) -> set[int] | None:
    """NVML indices of the devices ``CUDA_VISIBLE_DEVICES`` names; ``None`` (all of them) when an
    entry has a form the check does not read (MIG instances)."""
    used: set[int] = set()
    for entry in entries:
        if entry.isdigit():
            used.add(int(entry))
        elif entry.startswith("GPU-"):
            used |= {index for uuid, index in uuids.items() if uuid.startswith(entry)}
        else:
            return None
    return used


def _missing_entries(entries: list[str], count: int, uuids: dict[str, int]) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` entries naming no device NVML sees (MIG and other forms unchecked)."""
    missing = []
    for entry in entries:
        unknown_uuid = entry.startswith("GPU-") and not any(u.startswith(entry) for u in uuids)
        if (entry.isdigit() and int(entry) >= count) or unknown_uuid:
            missing.append(entry)
    if not missing:
        return []
    return [f"CUDA_VISIBLE_DEVICES names {','.join(missing)}, which NVML does not see ({count} GPU(s))"]
