"""The ``cuda`` device provider: NVIDIA GPUs counted through NVML.

NVML (``pynvml``, from the ``nvidia-ml-py`` distribution) answers in milliseconds and creates no
CUDA context, where ``torch.cuda.device_count()`` costs a torch import. NVML knows nothing of
``CUDA_VISIBLE_DEVICES``, so this module applies the variable the way the CUDA runtime does:

* unset: every GPU; set but empty: none;
* entries are indices (parsed like ``strtoul``: ``1abc`` is 1), GPU UUIDs (``GPU-8a3f...``) or MIG
  device UUIDs (``MIG-...``, or the older ``MIG-GPU-<uuid>/<gi>/<ci>``), each UUID possibly
  shortened to any prefix that names one device;
* the first entry that names no device (out of range, negative, unknown or ambiguous UUID,
  anything else) ends the list; the devices before it stay visible;
* a device named twice makes the whole list invalid: nothing is visible.

When NVML is absent (module not installed, or no NVIDIA driver library), torch is asked instead,
which also covers ROCm builds of torch (AMD GPUs appear as ``torch.cuda``).

NVML numbers GPUs in PCI bus order. The CUDA runtime does too for identical GPUs; on a host with
mixed GPU models set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that index N means the same GPU to both.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.devices import torch_backends
from launcher.devices.errors import DeviceUnavailableError

log = logging.getLogger("launcher.devices")

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"

# pynvml's value for "MIG mode is on" (NVML_DEVICE_MIG_ENABLE), used when the module lacks it.
_MIG_ENABLED = 1


@dataclass(frozen=True)
class NvmlGpu:
    """One physical GPU as NVML lists it."""

    index: int
    uuid: str
    pci_bus_id: str | None
    #: UUIDs of its MIG devices, in NVML order; only read when CUDA_VISIBLE_DEVICES names one.
    mig_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class VisibleDevice:
    """A device the CUDA runtime will show to a worker, in CUDA's visible order."""

    uuid: str
    pci_bus_id: str | None
    #: NVML index of the physical GPU (the MIG device's parent for MIG devices).
    gpu_index: int


def normalise_pci_bus_id(value: str | bytes | None) -> str | None:
    """Convert NVML's ``00000000:1B:00.0`` to sysfs's ``0000:1b:00.0``; ``None`` if not a bus id."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    text = value.strip().strip("\x00").lower()
    parts = text.split(":")
    if len(parts) == 2:  # no domain: the first PCI segment
        parts = ["0", *parts]
    if len(parts) != 3 or "." not in parts[2]:
        return None
    domain, bus, devfn = parts
    device, _, function = devfn.partition(".")
    try:
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"
    except ValueError:
        return None


def _leading_index(entry: str) -> int | None:
    """The index an entry names when read like C's ``strtoul`` (CUDA's parser), else ``None``."""
    text = entry[1:] if entry.startswith("+") else entry
    digits = ""
    for char in text:
        if not char.isdigit():
            break
        digits += char
    return int(digits) if digits else None


def _match_prefix(prefix: str, candidates: Sequence[str]) -> int | None:
    """Index of the one candidate starting with ``prefix``; ``None`` if none or several do."""
    prefix = prefix.lower()
    hits = [i for i, uuid in enumerate(candidates) if uuid.lower().startswith(prefix)]
    return hits[0] if len(hits) == 1 else None


def select_visible(spec: str | None, gpus: Sequence[NvmlGpu]) -> list[VisibleDevice]:
    """Apply a ``CUDA_VISIBLE_DEVICES`` value to NVML's GPUs, as the CUDA runtime would."""
    if spec is None:
        return [VisibleDevice(g.uuid, g.pci_bus_id, g.index) for g in gpus]
    if not spec.strip():
        return []
    gpu_uuids = [g.uuid for g in gpus]
    migs = [(uuid, g) for g in gpus for uuid in g.mig_uuids]
    mig_uuids = [uuid for uuid, _ in migs]
    chosen: list[VisibleDevice] = []
    for raw in spec.split(","):
        entry = raw.strip()
        device: VisibleDevice | None = None
        upper = entry.upper()
        if upper.startswith("MIG-GPU-"):
            # Older drivers' form MIG-GPU-<uuid>/<gi>/<ci>: one MIG device on that GPU.
            gpu_part, _, instance = entry[4:].partition("/")
            hit = _match_prefix(gpu_part, gpu_uuids)
            if hit is not None and instance:
                device = VisibleDevice(entry, gpus[hit].pci_bus_id, gpus[hit].index)
        elif upper.startswith("MIG-"):
            hit = _match_prefix(entry, mig_uuids)
            if hit is not None:
                uuid, parent = migs[hit]
                device = VisibleDevice(uuid, parent.pci_bus_id, parent.index)
        elif upper.startswith("GPU-"):
            hit = _match_prefix(entry, gpu_uuids)
            if hit is not None:
                device = VisibleDevice(gpus[hit].uuid, gpus[hit].pci_bus_id, gpus[hit].index)
        else:
            index = _leading_index(entry)
            if index is not None and index < len(gpus):
                device = VisibleDevice(gpus[index].uuid, gpus[index].pci_bus_id, gpus[index].index)
        if device is None:
            break  # CUDA stops at the first entry it cannot resolve
        if any(seen.uuid == device.uuid for seen in chosen):
            return []  # CUDA rejects the whole list when a device repeats
        chosen.append(device)
    return chosen


def _wants_mig(spec: str | None) -> bool:
    return spec is not None and any(e.strip().upper().startswith("MIG-") for e in spec.split(","))


def _import_pynvml() -> Any | None:
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return pynvml


class NvmlUnavailableError(DeviceUnavailableError):
    """NVML cannot be used here: the module is missing or the library does not initialise."""


def query_nvml(*, with_mig: bool = False) -> list[NvmlGpu]:
    """Every GPU NVML lists.

    Raises :class:`NvmlUnavailableError` when the module is absent or NVML fails to initialise (no
    NVIDIA driver library, driver not loaded); callers then fall back to torch. Errors after a
    successful initialisation are real failures and propagate as they are.
    """
    pynvml = _import_pynvml()
    if pynvml is None:
        raise NvmlUnavailableError("NVML is not installed (pip install nvidia-ml-py)")
    nvml_error: type[BaseException] = getattr(pynvml, "NVMLError", Exception)
    try:
        pynvml.nvmlInit()
    except nvml_error as exc:
        raise NvmlUnavailableError(f"NVML did not initialise ({exc})") from exc
    try:
        gpus: list[NvmlGpu] = []
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            bus_id = normalise_pci_bus_id(getattr(pynvml.nvmlDeviceGetPciInfo(handle), "busId", None))
            mig = _mig_uuids(pynvml, handle, nvml_error) if with_mig else ()
            gpus.append(NvmlGpu(index=index, uuid=uuid, pci_bus_id=bus_id, mig_uuids=mig))
        return gpus
    finally:
        with contextlib.suppress(nvml_error):  # shutting down cannot change the answer
            pynvml.nvmlShutdown()


def _mig_uuids(pynvml: Any, handle: Any, nvml_error: type[BaseException]) -> tuple[str, ...]:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except nvml_error:  # GPUs without MIG support answer "not supported"
        return ()
    if current != getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", _MIG_ENABLED):
        return ()
    uuids: list[str] = []
    for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml_error:  # an empty slot: no MIG device was created there
            continue
        uuids.append(_text(pynvml.nvmlDeviceGetUUID(mig)))
    return tuple(uuids)


def _text(value: str | bytes) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


@dataclass
class _Snapshot:
    source: str  # "nvml" or "torch"
    count: int
    bus_ids: list[str | None] | None = None


@dataclass
class CudaDevices:
    """Counts and locates the CUDA devices a worker would see.

    One instance backs the ``cuda`` registration of a plugin manager. It remembers its answer for
    the ``CUDA_VISIBLE_DEVICES`` value it was computed under, because the agent asks twice (count,
    then PCI bus ids for NUMA binding) and ``nvmlInit`` takes tens of milliseconds on big hosts.
    """

    environ: Mapping[str, str] | None = None
    _cache: dict[str | None, _Snapshot] = field(default_factory=dict, init=False, repr=False)

    def _spec(self) -> str | None:
        env = os.environ if self.environ is None else self.environ
        return env.get(VISIBLE_DEVICES_ENV)

    def _snapshot(self) -> _Snapshot:
        spec = self._spec()
        if spec in self._cache:
            return self._cache[spec]
        try:
            gpus = query_nvml(with_mig=_wants_mig(spec))
        except NvmlUnavailableError as exc:
            log.debug("%s; asking torch.cuda", exc)
            # torch applies CUDA_VISIBLE_DEVICES itself (through the CUDA runtime).
            snap = _Snapshot("torch", torch_backends.cuda_count_with_torch(str(exc)))
        else:
            visible = select_visible(spec, gpus)
            snap = _Snapshot("nvml", len(visible), [d.pci_bus_id for d in visible])
        self._cache[spec] = snap
        return snap

    def count(self) -> int:
        """How many CUDA devices a worker started now would see."""
        return self._snapshot().count

    def pci_bus_ids(self) -> list[str | None]:
        """PCI bus ids of those devices, in CUDA's visible order."""
        snap = self._snapshot()
        if snap.bus_ids is None:
            snap.bus_ids = torch_backends.cuda_pci_bus_ids_with_torch() if snap.count else []
        return list(snap.bus_ids)

    def source(self) -> str:
        """Which library answered: ``nvml`` or ``torch``."""
        return self._snapshot().source
