"""A hang on the GPU, reported: a rank stuck in a CUDA call, and a rank that never enters its collective.

The stack evidence (``synchronize`` frames) is launcher's today. The flight recorder's evidence
(issue 38 §4: "did not enter collective #N", the rank it blames as the root cause) is the flight
recorder work's: the parts that check it run only where the installed launcher sets
``TORCH_FR_BUFFER_SIZE`` for its workers under ``--hang-timeout`` (how that work turns the
recorder on), and are skipped, saying so, where it does not.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_launcher, unwrapped
from tests.gpu import lane

pytestmark = pytest.mark.gpu

FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def flight_recorder_on(stderr: str) -> bool:
    """Whether this launcher turned torch's flight recorder on for the job (its report says it used it)."""
    return "flight recorder" in stderr.lower() or "collective #" in stderr


@pytest.mark.timeout(150)
def test_a_rank_stuck_in_a_cuda_call_is_named_with_its_frame(tmp_path):
    stamps = tmp_path / "stamps.jsonl"
    # An NCCL all_reduce queued behind a kernel that never ends, then torch.cuda.synchronize().
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--hang-timeout", "5", lane.JOB, "--mode", "hang",
                           "--hang-collective"], env=lane.job_env(stamps), timeout=140)
    rows = lane.stamps(stamps)
    assert lane.first(rows, "stuck") is not None, (rows, result.stderr[-3000:])
    assert result.returncode != 0, result.stderr[-3000:]
    assert re.search(r"^launcher: hang detected by \S+: rank 0 \(local rank 0\)", result.stderr, re.M), result.stderr
    assert re.search(r"synchronize \(__init__\.py:\d+\)", result.stderr), result.stderr[-4000:]
    if not flight_recorder_on(result.stderr):
        pytest.skip("this launcher reports no flight-recorder evidence yet (issue 38 §4, the flight recorder work)")
    # The rank is inside the collective it queued (one rank: nobody else to wait for).
    assert re.search(r"all_reduce|allreduce", unwrapped(result.stderr)), result.stderr[-4000:]


@pytest.mark.timeout(150)
def test_a_rank_that_never_enters_its_collective_is_the_root_cause(tmp_path):
    stamps = tmp_path / "stamps.jsonl"
    # Two ranks on the one GPU, gloo on CUDA tensors: rank 1 sleeps while rank 0 waits in its sixth all_reduce.
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "5", lane.JOB, "--mode", "hang",
                           "--backend", "gloo", "--stall-rank", "1"], env=lane.job_env(stamps), timeout=140)
    rows = lane.stamps(stamps)
    assert lane.first(rows, "stalling") is not None, (rows, result.stderr[-3000:])
    assert result.returncode != 0, result.stderr[-3000:]
    assert re.search(r"^  rank 1: mode_hang \(gpu_job\.py:\d+\)", result.stderr, re.M), result.stderr[-4000:]
    if not flight_recorder_on(result.stderr):
        pytest.skip("this launcher reports no flight-recorder evidence yet (issue 38 §4, the flight recorder work)")
    text = unwrapped(result.stderr)
    blamed = r"rank 1\b[^\n]*did not enter collective|did not enter collective[^\n]*rank 1\b"
    assert re.search(blamed, text), text[-4000:]
    root = re.search(r"Root cause \(first failure\):(.{0,400})", text)
    assert root and re.search(r"\brank\s*:?\s*1\b", root.group(1)), text[-4000:]
