"""The GPU lane's CPU side, in the normal suite: its job script, stamps and measurements run here over
gloo on CPU tensors (the same code paths the GPU run takes, NCCL and CUDA aside), and the lane skips
rather than fails where torch sees no GPU.
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.conftest import run_launcher
from tests.gpu import lane

torch = pytest.importorskip("torch")
CPU = {"backend": "gloo", "device": "cpu"}


def test_no_torch_or_no_device_means_no_gpu_lane(monkeypatch):
    lane.cuda_devices.cache_clear()
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    try:
        assert lane.cuda_devices() == 0 and lane.skip_reason() == "no torch here"
    finally:
        lane.cuda_devices.cache_clear()


def test_stamps_skip_a_line_being_written_and_first_looks_after_a_time(tmp_path):
    path = tmp_path / "stamps.jsonl"
    assert lane.stamps(path) == []
    path.write_text('{"event": "a", "t": 1.0}\n{"event": "b", "t": 2.0}\n{"event": "a", "t": 3.0}\n{"event": "a", "t"')
    rows = lane.stamps(path)
    assert [row["event"] for row in rows] == ["a", "b", "a"]
    assert lane.first(rows, "a")["t"] == 1.0 and lane.first(rows, "a", after=1.0)["t"] == 3.0
    assert lane.first(rows, "c") is None


def test_figures_go_to_the_lane_file(tmp_path, monkeypatch):
    path = tmp_path / "figures.jsonl"
    monkeypatch.setenv(lane.FIGURES_ENV, str(path))
    monkeypatch.setattr(lane, "RECORDED", [])
    lane.record_figure(lane.START.format("launcher"), 1.23456, ranks=1)
    assert path.read_text() == '{"figure": "start -> first all_reduce (launcher)", "ranks": 1, "seconds": 1.235}\n'


@pytest.mark.timeout(200)
def test_the_measurements_run_over_gloo_on_cpu(tmp_path):
    start = lane.measure_start("launcher", tmp_path / "start", **CPU)
    assert start["ranks"] == 1 and start["seconds"] > 0, start
    restart = lane.measure_restart("launcher --preload torch", tmp_path / "restart", **CPU)
    assert restart["replaced"] and restart["preloaded"] and restart["value"] == 1.0, restart
    in_place = lane.measure_in_place(tmp_path / "in_place", **CPU)
    assert in_place["same_pid"] and in_place["same_address"] and in_place["intact"], in_place
    assert in_place["call"] == 2 and in_place["calls"] == 2, in_place


@pytest.mark.timeout(150)
def test_the_ddp_mode_reads_its_straggler_slot(tmp_path):
    stamps = tmp_path / "stamps.jsonl"
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--straggler-detection", lane.JOB, "--mode", "ddp",
                           "--seconds", "2", "--width", "64", "--backend", "gloo", "--device", "cpu"],
                          env=lane.job_env(stamps), timeout=140)
    assert result.returncode == 0, result.stderr[-3000:]
    done = lane.first(lane.stamps(stamps), "ddp")
    slot = done["slot"]
    # On CPU tensors: the host's clock, nothing on the GPU's.
    assert slot["collectives"] >= done["steps"] * 10 > 0 and slot["gpu_collectives"] == slot["gpu_pending"] == 0, done
    assert 0.0 < slot["wait"] < done["seconds"], done


@pytest.mark.timeout(150)
def test_the_stalled_rank_mode_is_reported_as_the_gpu_test_expects(tmp_path):
    stamps = tmp_path / "stamps.jsonl"
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "3", lane.JOB, "--mode", "hang",
                           "--backend", "gloo", "--device", "cpu", "--stall-rank", "1"],
                          env=lane.job_env(stamps), timeout=140)
    assert lane.first(lane.stamps(stamps), "stalling") is not None, result.stderr[-3000:]
    assert result.returncode != 0
    assert re.search(r"^  rank 1: mode_hang \(gpu_job\.py:\d+\)", result.stderr, re.M), result.stderr[-4000:]
