"""The ``gpu`` check against recorded NVML answers, through the seam the real binding uses."""

from __future__ import annotations

import pytest
from launcher.health.api import HEALTHY, SICK, SKIPPED, CheckContext
from launcher.health.gpu import gpu_check
from launcher.health.nvml import CtypesNvml, NvmlUnavailable, RecordedNvml

from tests.health import nvml_answers


def _check(answers, **context):
    nvml = RecordedNvml(answers)
    result = gpu_check(lambda: nvml)(CheckContext(node="n", **context))
    return result, nvml


def test_healthy_machine():
    result, nvml = _check(nvml_answers.HEALTHY, env={"CUDA_VISIBLE_DEVICES": "0,1"}, device_kind="cuda",
                          nproc_per_node=2)
    assert result.status == HEALTHY, result.reason
    assert nvml.calls[0] == "init" and nvml.calls[-1] == "shutdown"


def test_ecc_fault_names_the_gpu_and_the_count():
    result, nvml = _check(nvml_answers.ECC_FAULT)
    assert result.status == SICK
    assert "GPU 1" in result.reason and "2 uncorrectable ECC error(s)" in result.reason
    assert "GPU 0" not in result.reason
    assert nvml.calls[-1] == "shutdown"


def test_fault_on_a_gpu_the_workers_do_not_use_is_not_theirs():
    result, _ = _check(nvml_answers.ECC_FAULT, env={"CUDA_VISIBLE_DEVICES": "0"})
    assert result.status == HEALTHY, result.reason
    result, _ = _check(nvml_answers.ECC_FAULT, env={"CUDA_VISIBLE_DEVICES": "GPU-1f0b6c7e"})
    assert result.status == SICK and "GPU 1" in result.reason


def test_missing_device_against_nproc():
    result, _ = _check(nvml_answers.MISSING, device_kind="gpu", nproc_per_node=2)
    assert result.status == SICK
    assert "1 GPU(s) visible to NVML, 2 expected" in result.reason


def test_missing_device_against_cuda_visible_devices():
    result, _ = _check(nvml_answers.MISSING, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert result.status == SICK
    assert "CUDA_VISIBLE_DEVICES names 1" in result.reason


def test_missing_uuid_in_cuda_visible_devices():
    result, _ = _check(nvml_answers.HEALTHY, env={"CUDA_VISIBLE_DEVICES": "GPU-8c3a2a54,GPU-deadbeef"})
    assert result.status == SICK
    assert "GPU-deadbeef" in result.reason and "GPU-8c3a2a54" not in result.reason


def test_nproc_given_as_a_number_expects_nothing():
    result, _ = _check(nvml_answers.MISSING, nproc_per_node=8)
    assert result.status == HEALTHY, result.reason


def test_device_lost_from_the_bus():
    result, _ = _check(nvml_answers.LOST)
    assert result.status == SICK
    assert "GPU 1 is lost from the bus" in result.reason


@pytest.mark.parametrize(("answers", "words"), [
    ({"retired_pages_pending": [0, True]}, "retired pages pending"),
    ({"remapped_rows": [0, [False, True]]}, "row remapping failed"),
    ({"remapped_rows": [0, [True, False]]}, "row remapping pending"),
    ({"remapped_rows": [15, [False, False]]}, "lost from the bus"),
])
def test_other_faults(answers, words):
    result, _ = _check(nvml_answers.with_device(0, **answers))
    assert result.status == SICK
    assert words in result.reason and result.reason.startswith("GPU 0")


def test_unsupported_calls_are_not_faults():
    result, _ = _check(nvml_answers.NO_ECC)
    assert result.status == HEALTHY, result.reason


def test_no_driver_is_skipped():
    result, nvml = _check(nvml_answers.NO_DRIVER)
    assert result.status == SKIPPED
    assert "driver not loaded" in result.reason
    assert "device_count" not in nvml.calls


def test_no_gpu_and_none_expected_is_skipped():
    result, _ = _check({"init": 0, "devices": []})
    assert result.status == SKIPPED


def test_no_library_is_skipped():
    def load():
        return CtypesNvml("libnvidia-ml-that-does-not-exist.so.1")

    result = gpu_check(load)(CheckContext(node="n"))
    assert result.status == SKIPPED
    assert "cannot be loaded" in result.reason


def test_real_library_when_present():
    """On a machine with NVIDIA's driver: the real answer (printed); elsewhere: skipped."""
    try:
        CtypesNvml()
    except NvmlUnavailable:
        pytest.skip("no libnvidia-ml.so.1 here")
    result = gpu_check()(CheckContext(node="n"))
    assert result.status in (HEALTHY, SICK, SKIPPED)
    print(result)


@pytest.mark.parametrize("name", ["h100-notes", *nvml_answers.captured()])
def test_a_healthy_real_machine_s_answers_are_healthy(name):
    """Real machines' answers (captured by the GPU lane, or transcribed) replayed: healthy, every
    device counted, nothing a GPU does not support taken for a fault."""
    answers = nvml_answers.H100_NOTES if name == "h100-notes" else nvml_answers.captured()[name]
    count = len(answers["devices"])
    result, nvml = _check(answers, device_kind="gpu", nproc_per_node=count)
    assert result.status == HEALTHY, (name, result.reason)
    result, _ = _check(answers, device_kind="gpu", nproc_per_node=count + 1)
    assert result.status == SICK and f"{count} GPU(s) visible to NVML, {count + 1} expected" in result.reason


def test_record_nvml_docstring_command_names_exported_functions():
    # The docstring's one-liner star-imports the module: everything it calls must come with it.
    import re

    from launcher.health import nvml

    command = re.search(r"python -c '(.*?)'", nvml.record_nvml.__doc__ or "")
    assert command is not None, nvml.record_nvml.__doc__
    namespace: dict[str, object] = {}
    exec("from launcher.health.nvml import *", namespace)
    called = set(re.findall(r"([A-Za-z_]\w*)\(", command.group(1))) - {"print"}
    assert {"record_nvml", "CtypesNvml"} <= called, called
    assert all(name in namespace for name in called - {"dumps"}), sorted(called - {"dumps"} - set(namespace))
    # And what it writes replays: a recording of a recording is the same answers.
    record = namespace["record_nvml"](RecordedNvml(nvml_answers.HEALTHY))  # type: ignore[operator]
    assert namespace["record_nvml"](RecordedNvml(record)) == record  # type: ignore[operator]
