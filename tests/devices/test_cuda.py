"""The cuda provider: counting through NVML, CUDA_VISIBLE_DEVICES, and the torch fallback."""

from __future__ import annotations

import pytest
from launcher.devices import DeviceUnavailableError, resolve_nproc_per_node
from launcher.devices.cuda import CudaDevices, NvmlGpu, normalise_pci_bus_id, select_visible
from launcher.errors import UsageError
from launcher.plugins.manager import LauncherPluginManager

from .conftest import FOUR_BUS_IDS, FOUR_GPUS, FakeNvml

GPU = [g["uuid"] for g in FOUR_GPUS]
MIG = FOUR_GPUS[3]["mig"]


def test_counts_every_gpu_without_cuda_visible_devices(fake_nvml: FakeNvml) -> None:
    devices = CudaDevices(environ={})
    assert devices.count() == 4
    assert devices.pci_bus_ids() == FOUR_BUS_IDS
    assert devices.source() == "nvml"


def test_asks_nvml_once_for_count_and_bus_ids(fake_nvml: FakeNvml) -> None:
    devices = CudaDevices(environ={})
    devices.count()
    devices.pci_bus_ids()
    assert fake_nvml.calls.count("nvmlInit") == 1
    # Every initialisation is paired with a shutdown.
    assert fake_nvml.calls.count("nvmlShutdown") == 1


def test_recounts_when_cuda_visible_devices_changes(fake_nvml: FakeNvml) -> None:
    environ: dict[str, str] = {}
    devices = CudaDevices(environ=environ)
    assert devices.count() == 4
    environ["CUDA_VISIBLE_DEVICES"] = "1"
    assert devices.count() == 1


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", []),  # set but empty: no device
        ("2,3", [2, 3]),
        ("3,1", [3, 1]),  # CUDA's order is the variable's order
        (" 2 , 3 ", [2, 3]),
        ("1gpu,2", [1, 2]),  # indices are read like strtoul
        ("1,7,2", [1]),  # 7 does not exist: the list ends there
        ("0,-1,2", [0]),  # a negative index ends the list
        ("-1", []),
        ("0,abc,1", [0]),
        ("0,0", []),  # a repeated device invalidates the whole list
        ("1,GPU-5e2a9c1b-1f0e-4c1a-9b7e-0a1b2c3d4e02", []),  # the same device by index and UUID
        (GPU[2], [2]),  # full UUID
        ("GPU-8f3d", [2]),  # unique UUID prefix
        ("GPU-C07E4B19", [3]),
        (f"{GPU[3]},GPU-8f3d", [3, 2]),
        ("GPU-5e2a", []),  # prefix shared by GPUs 0 and 1: ambiguous, ends the list
        ("GPU-8f3d,GPU-5e2a,0", [2]),
        ("GPU-ffff", []),
        ("0,GPU-c07e", [0, 3]),  # indices and UUIDs mixed
    ],
)
def test_cuda_visible_devices(fake_nvml: FakeNvml, spec: str, expected: list[int]) -> None:
    devices = CudaDevices(environ={"CUDA_VISIBLE_DEVICES": spec})
    assert devices.count() == len(expected)
    assert devices.pci_bus_ids() == [FOUR_BUS_IDS[i] for i in expected]


@pytest.mark.parametrize(
    ("spec", "count"),
    [
        (MIG[1], 1),
        ("MIG-9f8e", 1),  # MIG UUID prefix
        (f"{MIG[0]},{MIG[1]}", 2),
        ("MIG-GPU-c07e4b19-3c2d-4e3f-9daf-2b3c4d5e6f04/1/0", 1),  # older drivers' form
        ("MIG-0000", 0),
    ],
)
def test_mig_devices_carry_their_gpus_bus_id(fake_nvml: FakeNvml, spec: str, count: int) -> None:
    devices = CudaDevices(environ={"CUDA_VISIBLE_DEVICES": spec})
    assert devices.count() == count
    assert devices.pci_bus_ids() == [FOUR_BUS_IDS[3]] * count


def test_bus_ids_given_as_bytes(fake_nvml: FakeNvml) -> None:
    fake_nvml.configure(FOUR_GPUS, bytes_bus_ids=True)
    assert CudaDevices(environ={}).pci_bus_ids() == FOUR_BUS_IDS


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:1B:00.0", "0000:1b:00.0"),
        (b"00000001:AF:1F.3\x00", "0001:af:1f.3"),
        ("3b:00.0", "0000:3b:00.0"),
        ("", None),
        ("garbage", None),
        (None, None),
    ],
)
def test_normalise_pci_bus_id(raw: str | bytes | None, expected: str | None) -> None:
    assert normalise_pci_bus_id(raw) == expected


def test_select_visible_without_nvml_objects_order() -> None:
    gpus = [NvmlGpu(i, f"GPU-{i}{i}{i}", f"0000:0{i}:00.0") for i in range(3)]
    assert [d.gpu_index for d in select_visible(None, gpus)] == [0, 1, 2]
    assert [d.gpu_index for d in select_visible("2,0", gpus)] == [2, 0]


def test_zero_visible_devices_is_a_one_line_usage_error(
    fake_nvml: FakeNvml, manager: LauncherPluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(UsageError) as info:
        resolve_nproc_per_node("cuda", manager)
    message = str(info.value)
    assert "\n" not in message
    assert "no cuda devices" in message and "CUDA_VISIBLE_DEVICES=''" in message
    assert "--nproc-per-node 1" in message


def test_resolves_cuda_and_gpu_through_nvml(fake_nvml: FakeNvml, manager: LauncherPluginManager) -> None:
    for name in ("cuda", "gpu", "GPU"):
        count, provider = resolve_nproc_per_node(name, manager)
        assert count == 4
        assert provider is not None and provider.name == "cuda"
        assert provider.pci_bus_ids is not None and provider.pci_bus_ids() == FOUR_BUS_IDS


def test_nvml_failure_after_init_is_reported(fake_nvml: FakeNvml, manager: LauncherPluginManager) -> None:
    fake_nvml.configure(FOUR_GPUS, count_error=999)
    with pytest.raises(UsageError) as info:
        resolve_nproc_per_node("cuda", manager)
    assert str(info.value).startswith("--nproc-per-node cuda: cannot count cuda devices: Unknown Error;")
    assert "\n" not in str(info.value)


# -- without NVML -----------------------------------------------------------------------------


def test_without_nvml_a_cpu_only_torch_means_no_cuda(no_nvml: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.devices import torch_backends

    monkeypatch.setattr(
        torch_backends,
        "torch_build_flags",
        lambda: {"cuda": None, "hip": None, "xpu": None, "version": "2.13.0+cpu"},
    )
    with pytest.raises(
        DeviceUnavailableError, match="NVML is not installed .* torch 2.13.0\\+cpu was built without CUDA"
    ):
        CudaDevices(environ={}).count()


def test_without_nvml_torch_cuda_is_asked(no_nvml: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA (or ROCm) build of torch the fallback really calls torch.cuda.device_count()."""
    torch = pytest.importorskip("torch")
    from launcher.devices import torch_backends

    # This machine's torch is a CPU build; pretend it was built with CUDA so the path is taken.
    monkeypatch.setattr(
        torch_backends,
        "torch_build_flags",
        lambda: {"cuda": "12.8", "hip": None, "xpu": None, "version": "x"},
    )
    asked: list[bool] = []
    real = torch.cuda.device_count

    def counting() -> int:
        asked.append(True)
        return int(real())

    monkeypatch.setattr(torch.cuda, "device_count", counting)
    devices = CudaDevices(environ={})
    assert devices.count() == real()
    assert devices.source() == "torch"
    assert asked


def test_nvml_that_cannot_initialise_falls_back(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.devices import torch_backends

    fake_nvml.configure([], init_error=12)  # NVML_ERROR_LIBRARY_NOT_FOUND: no driver
    monkeypatch.setattr(
        torch_backends, "torch_build_flags", lambda: {"cuda": None, "hip": None, "xpu": None, "version": "v"}
    )
    with pytest.raises(
        DeviceUnavailableError, match="NVML did not initialise \\(NVML Shared Library Not Found\\)"
    ):
        CudaDevices(environ={}).count()


def test_without_nvml_or_torch(no_nvml: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.devices import torch_backends

    monkeypatch.setattr(torch_backends, "torch_installed", lambda: False)
    with pytest.raises(DeviceUnavailableError, match="torch is not installed"):
        CudaDevices(environ={}).count()
