"""The ``gpu`` health check against the real driver, and a capture of the real driver's answers.

``record_nvml(CtypesNvml())`` is what the hand-written answers of ``tests/health/nvml_answers.py``
stand in for: the lane writes it to ``$LAUNCHER_LANE_OUT/nvml_capture.json`` (the lane script's
results folder) to be kept beside them, and checks here that replaying it gives the real verdict.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from launcher.health.api import HEALTHY, CheckContext
from launcher.health.gpu import check_gpus, gpu_check
from launcher.health.nvml import CtypesNvml, RecordedNvml, record_nvml

from tests.conftest import LAUNCHER, launcher_env
from tests.gpu import lane

pytestmark = pytest.mark.gpu


@pytest.fixture
def nvml_capture():
    """The real driver's answers, in RecordedNvml's form (kept with the lane's results)."""
    capture = record_nvml(CtypesNvml())
    out = os.environ.get("LAUNCHER_LANE_OUT")
    if out:
        with open(os.path.join(out, "nvml_capture.json"), "w") as handle:
            json.dump(capture, handle, indent=1, sort_keys=True)
    return capture


def test_the_real_driver_is_healthy_and_a_replay_of_it_says_the_same(nvml_capture):
    context = CheckContext(node="lane", nproc_per_node=lane.cuda_devices(), device_kind="gpu")
    real = gpu_check()(context)
    assert real.status == HEALTHY, real
    assert nvml_capture["device_count"] == [0, lane.cuda_devices()], nvml_capture
    assert check_gpus(RecordedNvml(nvml_capture), context) == real


@pytest.mark.timeout(120)
def test_a_gpu_more_than_the_node_has_is_one_clear_line_and_exit_69(write_script):
    script = write_script("never.py", "raise SystemExit('the worker must not start')\n")
    count = lane.cuda_devices()
    visible = ",".join(str(i) for i in range(count + 1))
    ok = subprocess.run([*LAUNCHER, "--standalone", "--nproc-per-node", "gpu", "--health-checks", "gpu",
                         write_script("ok.py", "print('started')\n")], env=launcher_env(), capture_output=True,
                        text=True, timeout=110)
    assert ok.returncode == 0 and "started" in ok.stdout, ok.stderr[-2000:]
    sick = subprocess.run([*LAUNCHER, "--standalone", "--nproc-per-node", str(count + 1), "--health-checks", "gpu",
                           script], env=launcher_env({"CUDA_VISIBLE_DEVICES": visible}), capture_output=True,
                          text=True, timeout=110)
    assert sick.returncode == 69, sick.stderr
    assert f"{count} GPU(s) visible to NVML, {count + 1} expected" in sick.stderr, sick.stderr
    assert "Traceback" not in sick.stderr and "must not start" not in sick.stderr, sick.stderr
