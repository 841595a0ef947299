"""Restarts of the local group and the exit status of failed jobs."""

from __future__ import annotations

import json

from tests.conftest import run_launcher

FAIL_ONCE = """
import os, sys
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {os.environ['RANK']} attempt {attempt}", flush=True)
if attempt == 0 and os.environ["LOCAL_RANK"] == "1":
    sys.exit(5)
"""


def test_worker_fails_once_then_succeeds(write_script):
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "2",
                           write_script("f.py", FAIL_ONCE)])
    assert result.returncode == 0, result.stderr
    assert "rank 1 attempt 0" in result.stdout
    assert "rank 0 attempt 1" in result.stdout and "rank 1 attempt 1" in result.stdout
    assert "rank 0 attempt 2" not in result.stdout
    assert "exited with code 5" in result.stderr


def test_failure_without_restarts_exits_nonzero_with_report(write_script):
    result = run_launcher(["--standalone", "--nproc-per-node", "2", write_script("f.py", FAIL_ONCE)])
    assert result.returncode == 1
    assert "<N/A>" not in result.stderr
    assert "Root cause" in result.stderr
    assert "exit code 5" in result.stderr
    assert "rank       : 1" in result.stderr


def test_restarts_exhausted(write_script):
    script = write_script("always.py", "import sys; print('try', flush=True); sys.exit(9)\n")
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "2", script])
    assert result.returncode == 1
    assert result.stdout.count("try") == 3


def test_restart_count_is_exported(write_script, tmp_path):
    log = tmp_path / "attempts.jsonl"
    script = write_script(
        "count.py",
        f"""
        import json, os, sys
        with open({str(log)!r}, "a") as f:
            counts = [os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["TORCHELASTIC_MAX_RESTARTS"]]
            f.write(json.dumps(counts) + "\\n")
        sys.exit(0 if os.environ["TORCHELASTIC_RESTART_COUNT"] == "2" else 1)
        """,
    )
    result = run_launcher(["--standalone", "--max-restarts", "3", script])
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in log.read_text().splitlines()] == [["0", "3"], ["1", "3"], ["2", "3"]]


def test_root_cause_written_to_the_launchers_own_error_file(write_script, tmp_path):
    """As torchrun does, so a parent (TorchX's local scheduler, another agent) can report it."""
    error_file = tmp_path / "agent_error.json"
    result = run_launcher(["--standalone", "--nproc-per-node", "2", write_script("f.py", FAIL_ONCE)],
                          env={"TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert result.returncode == 1
    content = json.loads(error_file.read_text())
    assert "rank 1" in content["message"]["message"] and "exit code 5" in content["message"]["message"]
    assert int(content["message"]["extraInfo"]["timestamp"]) > 0
