"""NVML answers in :class:`launcher.health.nvml.RecordedNvml`'s form, for the ``gpu`` check's tests.

Written by hand to NVML's documented shapes and return codes (nvml.h), not captured from a machine:
no GPU was at hand. ``HEALTHY`` stands for two A100-like devices; the others are the same devices
with one fault each. On a GPU machine, ``record_nvml(CtypesNvml())`` gives a real capture to put
beside them: the GPU lane (``benchmarks/gpu_lane.py``) writes one to ``nvml_capture.json`` in its
results, and every ``captures/*.json`` here is replayed by ``test_gpu_check.py`` (:func:`captured`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

_A100 = {
    "handle": [0, 0],
    "uuid": [0, "GPU-8c3a2a54-5a3e-2b61-6f35-0f2c1d9e7a10"],
    "uncorrectable_ecc_errors": [0, 0],
    "retired_pages_pending": [0, False],
    "remapped_rows": [0, [False, False]],
}

HEALTHY: dict[str, Any] = {
    "init": 0,
    "device_count": [0, 2],
    "devices": [
        _A100,
        {**_A100, "handle": [0, 1], "uuid": [0, "GPU-1f0b6c7e-77a2-9d3c-0c4e-5b8a2f6d3e21"]},
    ],
}


def with_device(index: int, **answers: Any) -> dict[str, Any]:
    """``HEALTHY`` with device ``index``'s answers changed."""
    record = copy.deepcopy(HEALTHY)
    record["devices"][index].update(answers)
    return record


#: GPU 1 reports 2 volatile uncorrectable ECC errors.
ECC_FAULT = with_device(1, uncorrectable_ecc_errors=[0, 2])
#: GPU 1 fell off the bus: its handle answers NVML_ERROR_GPU_IS_LOST (15).
LOST = with_device(1, handle=[15, None])
#: One GPU of two missing: NVML counts one.
MISSING = {"init": 0, "device_count": [0, 1], "devices": [copy.deepcopy(_A100)]}
#: A consumer GPU: ECC, page retirement and row remapping are not supported (3).
NO_ECC = {
    "init": 0,
    "devices": [{"handle": [0, 0], "uuid": [0, "GPU-00000000-1111-2222-3333-444444444444"],
                 "uncorrectable_ecc_errors": [3, 0], "retired_pages_pending": [3, False],
                 "remapped_rows": [3, [False, False]]}],
}
#: The library loads, but no driver is loaded (NVML_ERROR_DRIVER_NOT_LOADED, 9).
NO_DRIVER = {"init": 9, "devices": []}
#: One H100 80GB as the notes of a session on such a machine describe its answers (transcribed,
#: not captured): ECC 0, retired pages not supported (3: an H100 remaps rows instead), no row
#: remapping pending or failed.
H100_NOTES = {
    "init": 0,
    "devices": [{"handle": [0, 0], "uuid": [0, "GPU-00000000-0000-0000-0000-00000000h100"],
                 "uncorrectable_ecc_errors": [0, 0], "retired_pages_pending": [3, False],
                 "remapped_rows": [0, [False, False]]}],
}
#: Real machines' answers, as the GPU lane captured them (``record_nvml(CtypesNvml())``).
CAPTURES = Path(__file__).resolve().parent / "captures"


def captured() -> dict[str, dict[str, Any]]:
    """Every capture kept in :data:`CAPTURES`, by file name (without ``.json``)."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(CAPTURES.glob("*.json"))}
