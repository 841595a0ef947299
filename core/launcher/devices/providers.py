"""The built-in device providers and the ``auto`` choice.

Building these registrations imports neither torch nor pynvml: every count happens inside the
callables, when ``--nproc-per-node NAME`` asks for it.

``auto`` tries every provider marked ``accelerator`` in ascending ``priority`` (name breaks ties)
and takes the first that counts at least one device; when none does, it takes ``cpu``. The built-in
order is ``cuda`` (10), ``xpu`` (20), ``privateuse1`` (30); a third-party provider's default
priority, 100, puts it after them.
"""

from __future__ import annotations

import logging

from launcher.devices import torch_backends
from launcher.devices.cpu import count_cpus
from launcher.devices.cuda import VISIBLE_DEVICES_ENV, CudaDevices
from launcher.devices.errors import DeviceUnavailableError
from launcher.plugins.types import DeviceProvider

log = logging.getLogger("launcher.devices")

#: The provider ``auto`` falls back to when no accelerator has a device.
AUTO_FALLBACK = "cpu"

CUDA_PRIORITY = 10
XPU_PRIORITY = 20
PRIVATEUSE1_PRIORITY = 30


def choose_auto(providers: list[DeviceProvider]) -> DeviceProvider:
    """The provider ``--nproc-per-node auto`` stands for, among ``providers``.

    A provider whose count fails is skipped with a warning: ``auto`` means "whatever this host
    has", so one broken accelerator stack must not stop a job that can run on another.
    """
    candidates = sorted(
        (p for p in providers if p.accelerator and p.choose is None),
        key=lambda p: (p.priority, p.name),
    )
    for provider in candidates:
        try:
            count = provider.count_devices()
        except DeviceUnavailableError as exc:  # the usual answer on most hosts
            log.debug("auto: no %s devices: %s", provider.name, exc)
            continue
        except Exception as exc:
            log.warning("auto: skipped device provider %r, whose count failed: %s", provider.name, exc)
            continue
        if count > 0:
            return provider
    for provider in providers:
        if provider.name == AUTO_FALLBACK:
            return provider
    raise LookupError(f"no accelerator has a device and no {AUTO_FALLBACK!r} device provider is registered")


def builtin_providers() -> list[DeviceProvider]:
    """Fresh registrations of the built-in providers (each with its own CUDA cache)."""
    cuda = CudaDevices()
    cpu = DeviceProvider(
        name="cpu",
        description="CPUs this process may run on (its affinity mask)",
        count_devices=count_cpus,
        accelerator=False,
    )
    cuda_provider = DeviceProvider(
        name="cuda",
        aliases=("gpu",),
        description="NVIDIA GPUs through NVML, honouring CUDA_VISIBLE_DEVICES; torch.cuda without NVML",
        count_devices=cuda.count,
        pci_bus_ids=cuda.pci_bus_ids,
        visible_devices_env=VISIBLE_DEVICES_ENV,
        priority=CUDA_PRIORITY,
    )
    xpu = DeviceProvider(
        name="xpu",
        description="Intel GPUs through torch.xpu",
        count_devices=torch_backends.xpu_count,
        # Level Zero's device mask, which torch.xpu honours.
        visible_devices_env="ZE_AFFINITY_MASK",
        priority=XPU_PRIORITY,
    )
    privateuse1 = DeviceProvider(
        name="privateuse1",
        description="torch's privateuse1 backend (also answers to the backend's own name, e.g. npu)",
        count_devices=torch_backends.privateuse1_count,
        answers_to=torch_backends.privateuse1_answers_to,
        priority=PRIVATEUSE1_PRIORITY,
    )
    standalone = [cuda_provider, xpu, privateuse1, cpu]
    auto = DeviceProvider(
        name="auto",
        description="The first accelerator with devices (cuda, xpu, privateuse1, then plugins), else cpu",
        # Without a plugin manager at hand, auto chooses among the built-ins.
        count_devices=lambda: choose_auto(standalone).count_devices(),
        choose=choose_auto,
        accelerator=False,
    )
    return [auto, cpu, cuda_provider, xpu, privateuse1]
