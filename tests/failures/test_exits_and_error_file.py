"""One description of a process's end, and one writer of the error-file format."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from launcher.failures import FailureReport, WorkerFailure, describe_exit
from launcher.failures.errorfile import ErrorFileContent
from launcher.failures.exits import exit_status
from launcher.failures.record import error_file_content


@pytest.mark.parametrize(
    ("exitcode", "signum", "phrase", "status"),
    [
        (5, None, "exited with code 5", "exit code 5"),
        (None, signal.SIGKILL, "was killed by SIGKILL", "signal SIGKILL (9)"),
        (None, 99, "was killed by signal 99", "signal 99"),
        (None, None, "exited with code None", "unknown exit status"),
    ],
)
def test_describe_exit_and_exit_status(exitcode: int | None, signum: int | None, phrase: str, status: str) -> None:
    assert describe_exit(exitcode, signum) == phrase
    assert exit_status(exitcode, signum, with_number=True) == status


def test_rank_table_and_report_use_the_same_words() -> None:
    from launcher.failures.report import RankState

    assert RankState(0, 0, 10, "failed", -signal.SIGKILL).exit_text() == exit_status(None, signal.SIGKILL)
    assert RankState(0, 0, 10, "failed", 3).exit_text() == "exit code 3"
    assert RankState(0, 0, None, "running").exit_text() == "-"


def test_record_content_round_trips_through_the_reader(tmp_path: Path) -> None:
    try:
        raise ValueError("bad batch")
    except ValueError as exc:
        content = error_file_content(exc, when=1700000000.7)
    path = tmp_path / "error.json"
    content.write(path)
    data = json.loads(path.read_text())
    # torch's @record layout, timestamp as a string of whole seconds.
    assert data["message"]["message"] == "ValueError: bad batch"
    assert data["message"]["extraInfo"]["timestamp"] == "1700000000"
    assert "Traceback (most recent call last)" in data["message"]["extraInfo"]["py_callstack"]
    assert ErrorFileContent.read(str(path)) == ErrorFileContent(
        message="ValueError: bad batch", traceback=content.traceback, timestamp=1700000000.0
    )
    assert not list(tmp_path.glob("*.tmp")), "the temporary file must be renamed into place"


def test_report_writes_its_root_cause_in_the_same_format(tmp_path: Path) -> None:
    failure = WorkerFailure(
        node="node-a", rank=3, local_rank=1, role="trainer", pid=42, exitcode=None, signal=signal.SIGSEGV,
        timestamp=1700000000.25, stderr_tail=["Fatal Python error: Segmentation fault"],
    )
    report = FailureReport.from_failures([failure], now=1700000001.0)
    path = tmp_path / "launcher-error.json"
    report.write_error_file(path)
    read = ErrorFileContent.read(str(path))
    assert read.message == "rank 3 on node-a: Fatal Python error: Segmentation fault"
    assert read.traceback == "Fatal Python error: Segmentation fault"
    assert read.timestamp == 1700000000.0


def test_an_error_file_needs_a_timestamp() -> None:
    with pytest.raises(ValueError, match="timestamp"):
        ErrorFileContent(message="x").to_error_file()
