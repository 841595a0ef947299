"""GPU utilisation and memory of each rank, through NVML (:mod:`launcher.health.nvml`).

NVML answers from the kernel driver, without a CUDA context: no device memory, nothing a worker
contends with. A rank's GPU is the device whose compute processes include its worker's pid
(or a process of its that the worker started, such as a CUDA MPS client's child: any pid of
the rank's process tree); its memory is what NVML reports for those processes, its utilisation
the device's (NVML's per-process utilisation needs accounting mode, off by default).

NVML is opened once, on the publisher's thread, the first time a sample is asked for: a node
without the library or the driver pays one failed ``dlopen`` and never asks again. Inside a
container with its own pid namespace NVML reports the host's pids, which match no worker: the
columns then show ``-``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

log = logging.getLogger("launcher.status")


class RankGpu(NamedTuple):
    """What NVML says about one rank's GPU."""

    #: NVML's device index (of all the node's devices, not CUDA_VISIBLE_DEVICES').
    device: int
    #: The device's utilisation, percent of the last sample period with a kernel running.
    utilization: int | None
    #: GPU memory the rank's processes hold, bytes (``None`` when the driver cannot say).
    memory: int | None


class GpuSampler:
    """Samples :class:`RankGpu` of worker pids; ``load`` gives the NVML library (default: the
    real one). Unavailable NVML makes every sample empty, at no further cost."""

    def __init__(self, load: Callable[[], Any] | None = None) -> None:
        self._load = load
        self._nvml: Any = None
        self._failed = False
        self._handles: list[tuple[int, Any]] = []

    def _open(self) -> Any:
        from launcher.health.nvml import NVML_SUCCESS, NvmlUnavailable, error_name

        try:
            if self._load is not None:
                nvml = self._load()
            else:
                from launcher.health.nvml import CtypesNvml

                nvml = CtypesNvml()
        except NvmlUnavailable as exc:
            log.debug("no GPU columns in the status: %s", exc)
            return None
        code = nvml.init()
        if code != NVML_SUCCESS:
            log.debug("no GPU columns in the status: NVML says %s", error_name(code))
            return None
        code, count = nvml.device_count()
        for index in range(count if code == NVML_SUCCESS else 0):
            hcode, handle = nvml.handle(index)
            if hcode == NVML_SUCCESS:
                self._handles.append((index, handle))
        return nvml

    @property
    def usable(self) -> bool:
        """Whether a sample may find anything (``False`` once NVML failed to open, or was closed):
        the caller then need not even list the workers' processes."""
        return not self._failed

    @property
    def available(self) -> bool:
        """Whether NVML answered (after the first :meth:`sample`)."""
        return self._nvml is not None

    def sample(self, trees: dict[int, Iterable[int]]) -> dict[int, RankGpu]:
        """``worker pid -> RankGpu`` for the workers of ``trees`` (worker pid -> every pid of its
        process tree, itself included) that NVML lists on a device; the others are left out."""
        if self._failed:
            return {}
        if self._nvml is None:
            self._nvml = self._open()
            if self._nvml is None:
                self._failed = True
                return {}
        from launcher.health.nvml import NVML_SUCCESS

        owner = {pid: worker for worker, pids in trees.items() for pid in pids}
        found: dict[int, RankGpu] = {}
        for index, handle in self._handles:
            code, processes = self._nvml.processes(handle)
            if code != NVML_SUCCESS:
                continue
            memory: dict[int, int | None] = {}
            for pid, used in processes:
                worker = owner.get(pid)
                if worker is None:
                    continue
                before = memory.get(worker, 0)
                memory[worker] = None if used is None or before is None else before + used
            if not memory:
                continue
            ucode, (busy, _bandwidth) = self._nvml.utilization(handle)
            for worker, used in memory.items():
                if worker not in found:  # a rank on several devices: the first listed names it
                    found[worker] = RankGpu(index, busy if ucode == NVML_SUCCESS else None, used)
        return found

    def close(self) -> None:
        """Let NVML go (once opened)."""
        if self._nvml is not None:
            self._nvml.shutdown()
            self._nvml = None
            self._failed = True
