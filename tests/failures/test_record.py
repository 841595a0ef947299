"""launcher.failures.record: same error file as torch's @record, without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from launcher.failures import record
from launcher.failures.record import ERROR_FILE_ENV

from .conftest import RunWorker

OURS = """
from launcher.failures import record

def load(step):
    raise ValueError(f"bad batch at step {step}")

@record
def main():
    load(7)

if __name__ == "__main__":
    main()
"""

TORCHS = """
from torch.distributed.elastic.multiprocessing.errors import record

def load(step):
    raise ValueError(f"bad batch at step {step}")

@record
def main():
    load(7)

if __name__ == "__main__":
    main()
"""


def _shape(value: object) -> object:
    """The JSON's structure: keys and value types, not values."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    return type(value).__name__


def test_ours_writes_the_exception_and_reraises(run_worker: RunWorker) -> None:
    worker = run_worker(OURS)
    assert worker.returncode == 1
    assert "ValueError: bad batch at step 7" in worker.stderr  # re-raised: Python printed it
    data = json.loads(Path(worker.error_file).read_text())
    message = data["message"]
    assert message["message"] == "ValueError: bad batch at step 7"
    callstack = message["extraInfo"]["py_callstack"]
    assert callstack.startswith("Traceback (most recent call last):")
    assert "in load" in callstack and callstack.rstrip().endswith("ValueError: bad batch at step 7")
    assert "record.py" not in callstack  # the decorator's own frame is left out
    assert message["extraInfo"]["timestamp"].isdigit()
    assert not list(Path(worker.error_file).parent.glob("*.tmp"))  # written through a rename


def test_same_format_as_torchs_record(run_worker: RunWorker) -> None:
    ours = json.loads(Path(run_worker(OURS).error_file).read_text())
    torchs = json.loads(Path(run_worker(TORCHS).error_file).read_text())
    assert _shape(ours) == _shape(torchs)
    assert ours["message"]["message"] == torchs["message"]["message"]

    # Same user frames, in the same order (each wrapper adds its own frame).
    def user_frames(data: dict) -> list[str]:
        return [
            line for line in data["message"]["extraInfo"]["py_callstack"].splitlines() if "worker" in line
        ]

    assert [f.split(",", 1)[1] for f in user_frames(ours)] == [
        f.split(",", 1)[1] for f in user_frames(torchs)
    ]


def test_noop_without_the_variable(run_worker: RunWorker) -> None:
    worker = run_worker(OURS, error_file=False)
    assert worker.returncode == 1
    assert not Path(worker.error_file).exists()


def test_import_does_not_load_torch() -> None:
    code = (
        "import sys, launcher.failures; from launcher.failures import record; print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_in_process_behaviour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "error.json"
    monkeypatch.setenv(ERROR_FILE_ENV, str(path))

    @record
    def ok(x: int, *, y: int) -> int:
        return x + y

    assert ok(1, y=2) == 3
    assert ok.__name__ == "ok"
    assert not path.exists()

    @record()
    def clean_exit() -> None:
        raise SystemExit(0)

    assert clean_exit() is None  # as torch's: a clean exit is a normal return

    @record
    def failing_exit() -> None:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        failing_exit()
    assert not path.exists()  # exit statuses speak for themselves

    @record
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert not path.exists()

    @record
    def broken() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        broken()
    assert json.loads(path.read_text())["message"]["message"] == "RuntimeError: boom"


def test_unwritable_error_file_keeps_the_original_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ERROR_FILE_ENV, str(tmp_path / "missing-dir" / "error.json"))

    @record
    def broken() -> None:
        raise RuntimeError("the real problem")

    with pytest.raises(RuntimeError, match="the real problem"):
        broken()
    assert "could not write error file" in capsys.readouterr().err
