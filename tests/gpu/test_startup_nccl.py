"""Start-up to the first NCCL ``all_reduce`` on every GPU, launcher beside torchrun (figures; both must work)."""

from __future__ import annotations

import pytest

from tests.gpu import lane

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(150)
@pytest.mark.parametrize("tool", ["launcher", "torchrun"])
def test_start_to_the_first_nccl_all_reduce(tmp_path, tool):
    found = lane.measure_start(tool, tmp_path)
    assert found["ranks"] == lane.cuda_devices(), found
    print(f"{tool}: start to the first NCCL all_reduce {found['seconds']:.3f} s")
    lane.record_figure(lane.START.format(tool), found["seconds"], ranks=found["ranks"])
