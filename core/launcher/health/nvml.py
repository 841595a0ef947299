"""NVML for the ``gpu`` check: a small ctypes binding to ``libnvidia-ml.so.1``, and its seam.

NVML is the driver's management library: it answers from the kernel driver without creating a
CUDA context (no device memory, no seconds-long CUDA initialisation, nothing a worker then
contends with). The check uses only the calls of :class:`NvmlLibrary`, each answering
``(return code, value)`` as NVML does; :class:`CtypesNvml` is the real binding and
:class:`RecordedNvml` replays answers recorded on a machine (tests, and the conformance suite),
so the check's reading of NVML is the same code for both.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = [
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_GPU_FABRIC_STATE_COMPLETED",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_SUCCESS",
    "CtypesNvml",
    "NvmlLibrary",
    "NvmlUnavailable",
    "RecordedNvml",
    "record_nvml",
]

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
#: nvmlMemoryErrorType_t and nvmlEccCounterType_t values the check uses.
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0

_NAMES = {
    0: "success", 1: "not initialised", 2: "invalid argument", 3: "not supported", 4: "no permission",
    9: "driver not loaded", 12: "library not found", 13: "function not found", 15: "GPU is lost",
    17: "operating system call failed", 18: "driver/library version mismatch", 999: "unknown error",
}


def error_name(code: int) -> str:
    """NVML's name for a return code (``GPU is lost``)."""
    return _NAMES.get(code, f"NVML error {code}")


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node (no library, no driver): the check is skipped."""


class NvmlLibrary(Protocol):
    """The NVML calls the ``gpu`` check makes; each returns NVML's return code and the value.

    ``device`` values are opaque handles from :meth:`handle`.
    """

    def init(self) -> int: ...
    def shutdown(self) -> int: ...
    def device_count(self) -> tuple[int, int]: ...
    def handle(self, index: int) -> tuple[int, Any]: ...
    def uuid(self, device: Any) -> tuple[int, str]: ...
    def uncorrectable_ecc_errors(self, device: Any) -> tuple[int, int]:
        """Volatile (since the driver loaded) uncorrected ECC errors, all memory locations."""
        ...
    def retired_pages_pending(self, device: Any) -> tuple[int, bool]: ...
    def remapped_rows(self, device: Any) -> tuple[int, tuple[bool, bool]]:
        """``(pending, failure occurred)`` of row remapping (Ampere and later)."""
        ...
    def utilization(self, device: Any) -> tuple[int, tuple[int, int]]:
        """``(GPU %, memory bandwidth %)`` over the driver's last sample period (``launcher status``)."""
        ...
    def processes(self, device: Any) -> tuple[int, list[tuple[int, int | None]]]:
        """``(pid, GPU memory bytes or None)`` of each compute process on the device (``launcher status``)."""
        ...
    def fabric_info(self, device: Any) -> tuple[int, tuple[str, int, int, int]]:
        """``(cluster UUID, clique id, state, status)`` of the device's NVLink fabric
        (nvmlDeviceGetGpuFabricInfo; ``--topology nvml``). ``state`` is
        :data:`NVML_GPU_FABRIC_STATE_COMPLETED` once the fabric manager registered the GPU;
        ``status`` is that registration's NVML return code."""
        ...


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


#: NVML_GPU_FABRIC_UUID_LEN, and nvmlGpuFabricState_t's "registered with the fabric manager".
_FABRIC_UUID_LEN = 16
NVML_GPU_FABRIC_STATE_COMPLETED = 3


class _FabricInfo(ctypes.Structure):
    # nvmlGpuFabricInfo_t (nvml.h, R535 and later): the NVLink domain a GPU belongs to.
    _fields_ = [("clusterUuid", ctypes.c_ubyte * _FABRIC_UUID_LEN), ("status", ctypes.c_int),
                ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte)]


def format_fabric_uuid(raw: bytes) -> str:
    """NVML's 16 bytes of cluster UUID in the usual 8-4-4-4-12 form."""
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:32]}"


class _ProcessInfo(ctypes.Structure):
    # nvmlProcessInfo_t of the _v2 and _v3 calls (nvml.h): pid, used memory, MIG instance ids.
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


#: NVML_ERROR_INSUFFICIENT_SIZE: the process list grew between asking its length and reading it.
NVML_ERROR_INSUFFICIENT_SIZE = 7
#: usedGpuMemory when the driver cannot say (NVML_VALUE_NOT_AVAILABLE, e.g. Windows WDDM).
_VALUE_NOT_AVAILABLE = (1 << 64) - 1


class CtypesNvml:
    """:class:`NvmlLibrary` over ``libnvidia-ml.so.1`` through ctypes (no new dependency).

    Raises :class:`NvmlUnavailable` when the library cannot be loaded.
    """

    def __init__(self, path: str = "libnvidia-ml.so.1") -> None:
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as exc:
            raise NvmlUnavailable(f"no NVIDIA driver here ({path} cannot be loaded: {exc})") from None

    def _call(self, name: str, *args: Any) -> int:
        try:
            function = getattr(self._lib, name)
        except AttributeError:
            return 13  # function not found: an older driver
        return int(function(*args))

    def init(self) -> int:
        return self._call("nvmlInit_v2")

    def shutdown(self) -> int:
        return self._call("nvmlShutdown")

    def device_count(self) -> tuple[int, int]:
        count = ctypes.c_uint(0)
        return self._call("nvmlDeviceGetCount_v2", ctypes.byref(count)), count.value

    def handle(self, index: int) -> tuple[int, Any]:
        device = ctypes.c_void_p()
        return self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(device)), device

    def uuid(self, device: Any) -> tuple[int, str]:
        buffer = ctypes.create_string_buffer(96)
        code = self._call("nvmlDeviceGetUUID", device, buffer, ctypes.c_uint(len(buffer)))
        return code, buffer.value.decode(errors="replace")

    def uncorrectable_ecc_errors(self, device: Any) -> tuple[int, int]:
        count = ctypes.c_ulonglong(0)
        code = self._call("nvmlDeviceGetTotalEccErrors", device, ctypes.c_int(NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
                          ctypes.c_int(NVML_VOLATILE_ECC), ctypes.byref(count))
        return code, count.value

    def retired_pages_pending(self, device: Any) -> tuple[int, bool]:
        state = ctypes.c_int(0)
        return self._call("nvmlDeviceGetRetiredPagesPendingStatus", device, ctypes.byref(state)), bool(state.value)

    def remapped_rows(self, device: Any) -> tuple[int, tuple[bool, bool]]:
        corrected, uncorrected, pending, failed = (ctypes.c_uint(0) for _ in range(4))
        code = self._call("nvmlDeviceGetRemappedRows", device, ctypes.byref(corrected), ctypes.byref(uncorrected),
                          ctypes.byref(pending), ctypes.byref(failed))
        return code, (bool(pending.value), bool(failed.value))

    def utilization(self, device: Any) -> tuple[int, tuple[int, int]]:
        rates = _Utilization()
        code = self._call("nvmlDeviceGetUtilizationRates", device, ctypes.byref(rates))
        return code, (int(rates.gpu), int(rates.memory))

    def processes(self, device: Any) -> tuple[int, list[tuple[int, int | None]]]:
        code = NVML_ERROR_INSUFFICIENT_SIZE
        for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
            if not hasattr(self._lib, name):
                continue
            size = 64
            for _ in range(3):  # more processes than room (or started meanwhile): ask with more
                count = ctypes.c_uint(size)
                infos = (_ProcessInfo * size)()
                code = self._call(name, device, ctypes.byref(count), infos)
                if code != NVML_ERROR_INSUFFICIENT_SIZE:
                    break
                size = max(size, int(count.value)) * 2
            if code != NVML_SUCCESS:
                return code, []
            return code, [(int(info.pid), None if info.usedGpuMemory == _VALUE_NOT_AVAILABLE
                           else int(info.usedGpuMemory)) for info in infos[: count.value]]
        return 13, []  # function not found: a driver older than R450

    def fabric_info(self, device: Any) -> tuple[int, tuple[str, int, int, int]]:
        info = _FabricInfo()
        code = self._call("nvmlDeviceGetGpuFabricInfo", device, ctypes.byref(info))
        return code, (format_fabric_uuid(bytes(info.clusterUuid)), int(info.cliqueId), int(info.state),
                      int(info.status))


class RecordedNvml:
    """:class:`NvmlLibrary` replaying recorded answers (what ``record_nvml`` wrote on a machine).

    ``answers`` holds ``init`` (a return code), ``devices`` (a list, one mapping per device
    index, of call name to ``[code, value]``: ``handle``, ``uuid``, ``uncorrectable_ecc_errors``,
    ``retired_pages_pending``, ``remapped_rows``, and for ``launcher status`` ``utilization``
    (``[gpu %, memory %]``) and ``processes`` (``[[pid, bytes], ...]``), and for ``--topology nvml``
    ``fabric_info`` (``[uuid, clique id, state, status]``)) and optionally ``device_count`` (``[code,
    value]``; default: the number of devices listed). A call missing from a device's mapping
    answers "not supported".
    """

    def __init__(self, answers: Mapping[str, Any]) -> None:
        self._answers = answers
        self._devices: list[Mapping[str, Any]] = list(answers.get("devices", []))
        self.calls: list[str] = []

    def _device_answer(self, device: Any, call: str, default: Any) -> tuple[int, Any]:
        self.calls.append(call)
        found = self._devices[int(device)].get(call)
        if found is None:
            return NVML_ERROR_NOT_SUPPORTED, default
        code, value = found
        return int(code), value

    def init(self) -> int:
        self.calls.append("init")
        return int(self._answers.get("init", NVML_SUCCESS))

    def shutdown(self) -> int:
        self.calls.append("shutdown")
        return NVML_SUCCESS

    def device_count(self) -> tuple[int, int]:
        self.calls.append("device_count")
        code, value = self._answers.get("device_count", [NVML_SUCCESS, len(self._devices)])
        return int(code), int(value)

    def handle(self, index: int) -> tuple[int, Any]:
        self.calls.append("handle")
        if index >= len(self._devices):
            return 2, None
        code = self._devices[index].get("handle", [NVML_SUCCESS, index])[0]
        return int(code), index

    def uuid(self, device: Any) -> tuple[int, str]:
        code, value = self._device_answer(device, "uuid", "")
        return code, str(value)

    def uncorrectable_ecc_errors(self, device: Any) -> tuple[int, int]:
        code, value = self._device_answer(device, "uncorrectable_ecc_errors", 0)
        return code, int(value)

    def retired_pages_pending(self, device: Any) -> tuple[int, bool]:
        code, value = self._device_answer(device, "retired_pages_pending", False)
        return code, bool(value)

    def remapped_rows(self, device: Any) -> tuple[int, tuple[bool, bool]]:
        code, value = self._device_answer(device, "remapped_rows", [False, False])
        pending, failed = value
        return code, (bool(pending), bool(failed))

    def utilization(self, device: Any) -> tuple[int, tuple[int, int]]:
        code, value = self._device_answer(device, "utilization", [0, 0])
        return code, (int(value[0]), int(value[1]))

    def processes(self, device: Any) -> tuple[int, list[tuple[int, int | None]]]:
        code, value = self._device_answer(device, "processes", [])
        return code, [(int(pid), None if used is None else int(used)) for pid, used in value]

    def fabric_info(self, device: Any) -> tuple[int, tuple[str, int, int, int]]:
        code, value = self._device_answer(device, "fabric_info", ["", 0, 0, 0])
        uuid, clique, state, status = value
        return code, (str(uuid), int(clique), int(state), int(status))


def record_nvml(nvml: NvmlLibrary) -> dict[str, Any]:
    """Every answer the ``gpu`` check and ``--topology nvml`` would read from ``nvml``, in :class:`RecordedNvml`'s form
    (``python -c 'import json; from launcher.health.nvml import *; print(json.dumps(record_nvml(CtypesNvml())))'``)."""
    record: dict[str, Any] = {"init": nvml.init(), "devices": []}
    if record["init"] != NVML_SUCCESS:
        return record
    try:
        code, count = nvml.device_count()
        record["device_count"] = [code, count]
        for index in range(count if code == NVML_SUCCESS else 0):
            hcode, device = nvml.handle(index)
            entry: dict[str, Any] = {"handle": [hcode, index]}
            if hcode == NVML_SUCCESS:
                for call in ("uuid", "uncorrectable_ecc_errors", "retired_pages_pending", "remapped_rows",
                             "utilization", "processes", "fabric_info"):
                    entry[call] = list(getattr(nvml, call)(device))
            record["devices"].append(entry)
    finally:
        nvml.shutdown()
    return record
