"""virtual_local_rank_env: one device per worker, seen as LOCAL_RANK 0."""

from __future__ import annotations

import pytest
from launcher.devices import virtual_local_rank_env
from launcher.devices.providers import builtin_providers
from launcher.errors import UsageError
from launcher.plugins.types import DeviceProvider

PROVIDERS = {p.name: p for p in builtin_providers()}


@pytest.mark.parametrize("rank", [0, 1, 5])
def test_without_an_inherited_list_rank_n_sees_device_n(rank: int) -> None:
    env = virtual_local_rank_env(PROVIDERS["cuda"], rank, {})
    assert env == {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": str(rank)}


@pytest.mark.parametrize(
    ("inherited", "rank", "expected"),
    [
        ("2,3", 0, "2"),
        ("2,3", 1, "3"),
        (" 6 , 7 ", 1, "7"),
        ("GPU-8f3d,GPU-c07e", 1, "GPU-c07e"),
        ("MIG-9f8e,MIG-1a2b", 0, "MIG-9f8e"),
    ],
)
def test_an_inherited_list_is_respected(inherited: str, rank: int, expected: str) -> None:
    environ = {"CUDA_VISIBLE_DEVICES": inherited}
    env = virtual_local_rank_env(PROVIDERS["cuda"], rank, environ)
    assert env == {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": expected}
    assert environ == {"CUDA_VISIBLE_DEVICES": inherited}  # the agent's own environment is untouched


@pytest.mark.parametrize(("inherited", "rank"), [("2,3", 2), ("", 0), ("4,-1,5", 1), ("abc", 0)])
def test_a_rank_beyond_the_visible_devices_is_a_one_line_error(inherited: str, rank: int) -> None:
    with pytest.raises(UsageError) as info:
        virtual_local_rank_env(PROVIDERS["cuda"], rank, {"CUDA_VISIBLE_DEVICES": inherited})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"--virtual-local-rank: local rank {rank} has no device of its own")


def test_a_numeric_nproc_uses_cuda_visible_devices_like_torchrun() -> None:
    assert virtual_local_rank_env(None, 1, {"CUDA_VISIBLE_DEVICES": "4,5"}) == {
        "LOCAL_RANK": "0",
        "CUDA_VISIBLE_DEVICES": "5",
    }


def test_cpu_has_no_visibility_variable() -> None:
    assert virtual_local_rank_env(PROVIDERS["cpu"], 3, {"CUDA_VISIBLE_DEVICES": "0"}) == {"LOCAL_RANK": "0"}


def test_each_provider_uses_its_own_variable() -> None:
    assert virtual_local_rank_env(PROVIDERS["xpu"], 1, {"ZE_AFFINITY_MASK": "0.0,0.1"}) == {
        "LOCAL_RANK": "0",
        "ZE_AFFINITY_MASK": "0.1",
    }
    npu = DeviceProvider(name="npu", count_devices=lambda: 8, visible_devices_env="ASCEND_RT_VISIBLE_DEVICES")
    assert virtual_local_rank_env(npu, 2, {}) == {"LOCAL_RANK": "0", "ASCEND_RT_VISIBLE_DEVICES": "2"}


def test_negative_rank_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        virtual_local_rank_env(None, -1, {})
