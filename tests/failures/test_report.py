"""FailureReport against real worker deaths: exceptions, signals, no error file."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from launcher.failures import FailureReport, WorkerFailure
from launcher.failures.report import REPORT_SCHEMA, ErrorFileContent, failure_time

from ..conftest import unwrapped
from .conftest import WAITING_WORKER, RunWorker

RAISING = """
from {module} import record

def step(n):
    raise ValueError(f"loss is NaN at step {{n}}")

@record
def main():
    step(12)

main()
"""


class FakeOomWatch:
    """Stands in for OomWatch: evidence for the pids it was told about."""

    def __init__(self, victims: dict[int, str]) -> None:
        self.victims = victims
        self.asked: list[int] = []

    def evidence(self, pid: int) -> str | None:
        self.asked.append(pid)
        return self.victims.get(pid)


@pytest.mark.parametrize(
    "module", ["launcher.failures", "torch.distributed.elastic.multiprocessing.errors"], ids=["ours", "torch"]
)
def test_root_cause_with_traceback(run_worker: RunWorker, module: str) -> None:
    worker = run_worker(RAISING.format(module=module))
    report = FailureReport.from_failures([worker.failure(rank=5, local_rank=1, node="gpu-node-7")])
    text = unwrapped(report.render())
    for expected in (
        "gpu-node-7",
        "rank       : 5 (local rank 1, role trainer)",
        f"pid        : {worker.pid}",
        "exit code 1",
        "Traceback (most recent call last):",
        "in step",
        "ValueError: loss is NaN at step 12",
        worker.error_file,
    ):
        assert expected in text, expected
    assert "<N/A>" not in text
    assert report.root_cause.error is not None
    assert report.root_cause.error.message == "ValueError: loss is NaN at step 12"


def test_no_error_file_shows_stderr_tail(run_worker: RunWorker) -> None:
    worker = run_worker(
        """
        import sys
        for i in range(30):
            print(f"log line {i}", file=sys.stderr)
        print("CUDA error: an illegal memory access was encountered", file=sys.stderr)
        sys.exit(3)
        """
    )
    text = unwrapped(FailureReport.from_failures([worker.failure()]).render())
    assert "exit code 3" in text
    assert "CUDA error: an illegal memory access was encountered" in text
    assert "log line 29" in text and "log line 0\n" not in text  # only the tail
    assert "@launcher.failures.record" in text  # says how to get a traceback
    assert "<N/A>" not in text


def test_sigkill_named_and_marked_oom_when_the_kernel_says_so(run_worker: RunWorker) -> None:
    worker = run_worker(WAITING_WORKER, send=signal.SIGKILL)
    assert worker.returncode == -signal.SIGKILL
    plain = FailureReport.from_failures([worker.failure()], oom_watch=FakeOomWatch({}))
    plain_text = unwrapped(plain.render())
    assert "signal SIGKILL (9)" in plain_text
    assert "likely out of memory" not in plain_text
    assert "some progress" in plain_text  # stderr tail

    watch = FakeOomWatch({worker.pid: "kernel log: Out of memory: Killed process"})
    report = FailureReport.from_failures([worker.failure()], oom_watch=watch)
    text = unwrapped(report.render())
    assert "signal SIGKILL (9), likely out of memory" in text
    assert "out-of-memory killer" in text
    assert "Killed process" in text  # the evidence
    assert report.to_dict()["root_cause"]["likely_oom"] is True


def test_sighup_is_explained(run_worker: RunWorker) -> None:
    worker = run_worker(WAITING_WORKER, send=signal.SIGHUP)
    assert worker.returncode == -signal.SIGHUP
    text = unwrapped(FailureReport.from_failures([worker.failure()]).render())
    assert "signal SIGHUP (1)" in text
    assert "hang-up" in text and "setsid" in text and "nohup" in text


def test_sigsegv_with_faulthandler_stack(run_worker: RunWorker) -> None:
    worker = run_worker(
        """
        import ctypes
        from launcher.failures import record

        @record
        def main():
            ctypes.string_at(0)

        main()
        """
    )
    assert worker.returncode == -signal.SIGSEGV
    report = FailureReport.from_failures([worker.failure()])
    text = unwrapped(report.render())
    assert "signal SIGSEGV (11)" in text
    assert "segmentation fault" in text
    assert "Fatal Python error: Segmentation fault" in text  # faulthandler, enabled by record
    assert "<N/A>" not in text
    assert not Path(worker.error_file).exists()


def test_others_in_a_table_root_cause_is_earliest(run_worker: RunWorker) -> None:
    failed = run_worker(RAISING.format(module="launcher.failures"))
    killed = run_worker(WAITING_WORKER, send=signal.SIGTERM)
    # The agent saw the SIGTERM first, but the exception's error file is older: it is the cause.
    early = failed.failure(rank=1, local_rank=1)
    early.timestamp = time.time() + 100
    late = killed.failure(rank=0, local_rank=0)
    late.timestamp = time.time() + 50
    report = FailureReport.from_failures([late, early])
    assert report.root_cause.failure.rank == 1
    text = report.render()
    root, others = text.split("Other failures (1):")
    assert "ValueError" in root
    header, row = others.strip().splitlines()[:2]
    assert header.split()[:7] == ["time", "node", "rank", "local", "pid", "exit", "error"]
    assert str(killed.pid) in row and "signal SIGTERM (15)" in row


def test_json_round_trip(run_worker: RunWorker, tmp_path: Path) -> None:
    failed = run_worker(RAISING.format(module="launcher.failures"))
    killed = run_worker(WAITING_WORKER, send=signal.SIGKILL)
    report = FailureReport.from_failures(
        [failed.failure(rank=0), killed.failure(rank=1, local_rank=1)],
        oom_watch=FakeOomWatch({killed.pid: "cgroup: oom_kill rose from 0 to 1"}),
    )
    path = tmp_path / "failure_report.json"
    report.write_json(path)
    data = json.loads(path.read_text())
    assert data["schema"] == REPORT_SCHEMA and data["schema_version"] == FailureReport.schema_version
    assert data["root_cause"]["pid"] == failed.pid
    assert data["root_cause"]["error"]["traceback"].startswith("Traceback")
    assert data["other_failures"][0]["signal_name"] == "SIGKILL"
    assert data["other_failures"][0]["likely_oom"] is True
    again = FailureReport.from_dict(data)
    assert again.to_dict() == data
    assert again.render() == report.render()

    data["schema_version"] = FailureReport.schema_version + 1
    with pytest.raises(ValueError, match="newer"):
        FailureReport.from_dict(data)


def test_unreadable_error_file_falls_back_to_stderr(tmp_path: Path) -> None:
    bad = tmp_path / "error.json"
    bad.write_text("")  # killed while writing with a non-atomic writer
    failure = WorkerFailure(
        "n", 0, 0, "r", 10, 1, None, time.time(), str(bad), ["Traceback ...", "OSError: disk"]
    )
    text = unwrapped(FailureReport.from_failures([failure]).render())
    assert "is empty" in text and "OSError: disk" in text


def test_plain_message_error_file_format(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": "custom failure", "timestamp": 1700000000}))
    content = ErrorFileContent.read(str(path))
    assert content == ErrorFileContent(message="custom failure", timestamp=1700000000.0)


def test_signal_from_negative_exitcode_and_shell_status() -> None:
    now = time.time()
    via_subprocess = WorkerFailure("n", 0, 0, "r", 1, -9, None, now)
    assert via_subprocess.signal == 9 and via_subprocess.signal_name == "SIGKILL"
    shell = WorkerFailure("n", 1, 1, "r", 2, 137, None, now + 1)
    watch = FakeOomWatch({2: "cgroup"})
    report = FailureReport.from_failures([via_subprocess, shell], oom_watch=watch)
    assert watch.asked == [1, 2]  # both are SIGKILL deaths
    assert "128+SIGKILL" in unwrapped(report.render())
    assert report.others[0].likely_oom


def test_failure_time_prefers_the_error_file() -> None:
    assert failure_time(100.5, None) == 100.5
    assert failure_time(100.5, 100.0) == 100.5  # same second: the finer observation
    assert failure_time(130.0, 100.0) == 100.0  # recorded long before the exit
    assert failure_time(130.0, 100.25) == 100.25


def test_empty_report_is_an_error() -> None:
    with pytest.raises(ValueError):
        FailureReport.from_failures([])


def test_multinode_report_names_the_node_and_lists_its_ranks() -> None:
    from launcher.failures.report import RankState

    now = time.time()
    remote = WorkerFailure("box", 3, 1, "r", 42, 7, None, now, None, ["boom"], group_rank=1, node_addr="10.0.0.2")
    report = FailureReport.from_failures([remote], title="the job failed on " + remote.node_label)
    report.node_ranks = [
        RankState(0, 0, 40, "killed by the agent", -15),
        RankState(1, 1, 41, "failed", 1),
    ]
    report.this_node = "box (node 0, 10.0.0.1)"
    report.notes = ["the rendezvous store on 10.0.0.1:29400 (node 0) is gone: Connection refused"]
    text = report.render()
    assert "launcher: the job failed on box (node 1, 10.0.0.2)" in text
    assert "node       : box (node 1, 10.0.0.2)" in text
    assert "  the rendezvous store on 10.0.0.1:29400 (node 0) is gone: Connection refused" in text
    assert "Ranks on this node (box (node 0, 10.0.0.1)):" in text
    rows = [line.split(None, 3) for line in text.splitlines() if line.startswith("  0 ") or line.startswith("  1 ")]
    assert [row[3] for row in rows] == ["killed by the agent  signal SIGTERM", "failed               exit code 1"]
    again = FailureReport.from_dict(report.to_dict())
    assert again.render() == text
