"""Getting back to work over NCCL on one GPU: recovery in place, and a restart with ``--preload torch``.

Each prints the seconds from the failure to the first NCCL ``all_reduce`` after it (a figure, no
threshold: issue 38 §2's goal, 0.25 s in place, is the recovery work's; the lane shows where it is).
"""

from __future__ import annotations

import pytest

from tests.gpu import lane

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(150)
def test_recovery_in_place_over_nccl_keeps_the_process_and_its_cuda_tensor(tmp_path):
    found = lane.measure_in_place(tmp_path)
    # In place: the same process, its CUDA tensor made outside the function intact at the same address.
    assert found["same_pid"] and found["same_address"] and found["intact"], found
    assert found["call"] == 2 and found["calls"] == 2, found
    print(f"recovery in place over NCCL: raise to the next call's first all_reduce {found['seconds']:.3f} s")
    lane.record_figure(lane.IN_PLACE, found["seconds"])


@pytest.mark.timeout(150)
def test_a_preload_torch_restart_reaches_the_first_nccl_all_reduce(tmp_path):
    found = lane.measure_restart("launcher --preload torch", tmp_path)
    assert found["replaced"] and found["preloaded"] and found["value"] == 1.0, found  # forked from the template
    print(f"--preload torch: failure to the replacement's first NCCL all_reduce {found['seconds']:.3f} s")
    lane.record_figure(lane.RESTART.format("launcher --preload torch"), found["seconds"])
