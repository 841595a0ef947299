"""Each rank's GPU through NVML: recorded answers (no GPU here) through the same calls a real
driver answers (:class:`launcher.health.nvml.RecordedNvml`), and "-" where NVML is missing."""

from __future__ import annotations

import copy
import os

from launcher.health.nvml import NvmlUnavailable, RecordedNvml
from launcher.status.gpus import GpuSampler, RankGpu
from launcher.status.procfs import children

from tests.health.nvml_answers import HEALTHY, NO_DRIVER

GIB = 1 << 30


def answers(**per_device: dict) -> dict:
    """HEALTHY's two devices with ``utilization`` and ``processes`` answers (device index -> answers)."""
    record = copy.deepcopy(HEALTHY)
    for index, extra in per_device.items():
        record["devices"][int(index[1:])].update(extra)
    return record


def test_each_rank_gets_its_device_its_memory_and_the_device_utilisation():
    # Rank pids 101 (device 0, plus a child process 111 of its own) and 102 (device 1); 999 is
    # another user's process on device 1, no rank's.
    nvml = RecordedNvml(answers(
        d0={"utilization": [0, [87, 40]], "processes": [0, [[101, 10 * GIB], [111, GIB]]]},
        d1={"utilization": [0, [12, 5]], "processes": [0, [[102, 3 * GIB], [999, 7 * GIB]]]},
    ))
    sampler = GpuSampler(lambda: nvml)
    found = sampler.sample({101: [101, 111], 102: [102], 103: [103]})
    assert found == {101: RankGpu(0, 87, 11 * GIB), 102: RankGpu(1, 12, 3 * GIB)}
    assert sampler.available
    # NVML is opened once: the second sample makes only the per-device calls.
    opened = nvml.calls.count("init")
    sampler.sample({101: [101]})
    assert nvml.calls.count("init") == opened == 1 and nvml.calls.count("device_count") == 1
    sampler.close()
    assert nvml.calls[-1] == "shutdown"


def test_unknown_memory_and_failed_calls_give_none_not_a_made_up_number():
    nvml = RecordedNvml(answers(
        d0={"utilization": [3, [0, 0]], "processes": [0, [[101, None]]]},  # utilisation "not supported"
        d1={"utilization": [0, [50, 0]], "processes": [15, []]},  # device lost: no processes read
    ))
    assert GpuSampler(lambda: nvml).sample({101: [101], 102: [102]}) == {101: RankGpu(0, None, None)}


def test_without_nvml_every_sample_is_empty_and_nvml_is_not_asked_again():
    loads = []

    def missing():
        loads.append(1)
        raise NvmlUnavailable("no NVIDIA driver here")

    sampler = GpuSampler(missing)
    assert sampler.sample({1: [1]}) == {} and sampler.sample({1: [1]}) == {}
    assert loads == [1] and not sampler.available and not sampler.usable
    no_driver = RecordedNvml(NO_DRIVER)
    sampler = GpuSampler(lambda: no_driver)
    assert sampler.sample({1: [1]}) == {} and sampler.sample({1: [1]}) == {}
    assert no_driver.calls == ["init"]
    # This machine's real NVML (none in CI; on a GPU machine this process holds no GPU): empty, no error.
    assert GpuSampler().sample({os.getpid(): [os.getpid()]}) == {}


def test_a_process_tree_includes_the_children_of_every_thread():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in children(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert children(2**22 + 12345) == []  # no such process
