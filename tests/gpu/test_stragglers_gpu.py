"""Straggler detection timed on the GPU's timeline (CUDA events), on one GPU.

What one GPU can show (docs/stragglers.md, "On GPUs"): over NCCL a job has one rank (NCCL refuses
two ranks on one GPU), so these prove that a DDP job's all-reduce over NCCL is timed from CUDA
events into the slot the agent reads; the verdict between ranks is shown with two ranks on the one
GPU whose collectives are gloo's on CUDA tensors, timed by the same CUDA-event code.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_launcher
from tests.gpu import lane

pytestmark = pytest.mark.gpu

NAMED = re.compile(r"^launcher: straggler: rank (\d+) \(node \S+, local rank (\d+)\) is ([\d.]+)x slower", re.M)


@pytest.mark.timeout(120)
def test_ddp_over_nccl_fills_the_slot_from_cuda_events(tmp_path):
    stamps = tmp_path / "stamps.jsonl"
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--straggler-detection", "--straggler-interval",
                           "1", lane.JOB, "--mode", "ddp", "--seconds", "6"], env=lane.job_env(stamps), timeout=110)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cannot time" not in result.stderr and "stopped timing" not in result.stderr, result.stderr[-3000:]
    done = lane.first(lane.stamps(stamps), "ddp")
    assert done is not None, result.stderr[-3000:]
    slot = done["slot"]
    # DDP's last bucket, once a backward pass: every step timed on the GPU, read without waiting.
    assert slot["gpu_collectives"] >= done["steps"] * 10 - 10, (done, result.stderr[-2000:])
    assert slot["collectives"] >= slot["gpu_collectives"] > 0 and slot["entered"] == 0.0, done
    assert 0.0 < slot["wait"] < done["seconds"], done
    lane.record_figure("ddp over nccl: share of time inside the all-reduce (cuda events)",
                       slot["wait"] / done["seconds"], unit="fraction", collectives=slot["gpu_collectives"])


@pytest.mark.timeout(150)
def test_two_ranks_on_one_gpu_gloo_on_cuda_tensors_the_slow_one_is_named(tmp_path):
    stamps = tmp_path / "stamps.jsonl"
    # Rank 1 sleeps 30 ms a step before its all-reduce: rank 0 waits for it inside its own, on the GPU's timeline.
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--straggler-detection", "--straggler-interval",
                           "1", lane.JOB, "--mode", "loop", "--backend", "gloo", "--width", "1024", "--seconds", "12",
                           "--slow-rank", "1", "--slow", "0.03"], env=lane.job_env(stamps), timeout=140)
    assert result.returncode == 0, result.stderr[-3000:]
    named = NAMED.findall(result.stderr)
    assert [(r, lr) for r, lr, _ in named][:1] == [("1", "1")], result.stderr[-3000:]
    rows = {row["rank"]: row for row in lane.stamps(stamps) if row["event"] == "loop"}
    assert sorted(rows) == [0, 1], rows
    for row in rows.values():
        assert row["slot"]["gpu_collectives"] > 0, rows  # timed from CUDA events, not the host's clock
    assert rows[0]["slot"]["wait"] > rows[1]["slot"]["wait"], rows
    lane.record_figure("gloo on cuda, 2 ranks 1 gpu: slow rank's ratio", float(named[0][2]), unit="x")
