"""The default LogsSpecs against torchrun's behaviour: layout, modes, redirects, tee, filters."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.logs.conftest import launch, lines, mode, run_dir

WORKER = """
import os, sys
rank = os.environ["LOCAL_RANK"]
print(f"out {rank} run_id={os.environ['TORCHELASTIC_RUN_ID']}")
print(f"out {rank} error_file={os.environ['TORCHELASTIC_ERROR_FILE']}")
print(f"err {rank} hello", file=sys.stderr)
print(f"out {rank} KEEP this one")
print(f"err {rank} ERRKEEP that one", file=sys.stderr)
"""


def test_log_dir_layout_files_and_modes(tmp_path, write_script):
    script = write_script("w.py", WORKER)
    log_dir = tmp_path / "logs"
    result = launch(["--standalone", "--nproc-per-node", "2", "--log-dir", str(log_dir), "-r", "3", script])
    assert result.returncode == 0, result.stderr
    assert lines(result.stdout) == []  # redirected: nothing on the console
    job = run_dir(log_dir)
    attempt = job / "attempt_0"
    assert sorted(p.name for p in attempt.iterdir()) == ["0", "1"]
    for rank in (0, 1):
        rank_dir = attempt / str(rank)
        assert sorted(p.name for p in rank_dir.iterdir()) == ["stderr.log", "stdout.log"]
        out = (rank_dir / "stdout.log").read_text().splitlines()
        assert out[0].startswith(f"out {rank} run_id=")
        run_id = out[0].split("=", 1)[1]
        assert job.name.startswith(f"{run_id}_")
        assert out[1] == f"out {rank} error_file={rank_dir / 'error.json'}"
        assert (rank_dir / "stderr.log").read_text() == f"err {rank} hello\nerr {rank} ERRKEEP that one\n"
        for path in (rank_dir / "stdout.log", rank_dir / "stderr.log"):
            assert mode(path) == 0o600, path
        assert mode(rank_dir) == 0o700
    assert mode(job) == 0o700 and mode(attempt) == 0o700


def test_per_rank_redirects_and_tee(tmp_path, write_script):
    script = write_script("w.py", WORKER)
    log_dir = tmp_path / "logs"
    # rank 0: stdout to its file only; rank 1: stderr tee'd (file and console).
    result = launch(["--standalone", "--nproc-per-node", "2", "--log-dir", str(log_dir),
                     "-r", "0:1", "-t", "1:2", script])
    assert result.returncode == 0, result.stderr
    out, err = lines(result.stdout), lines(result.stderr)
    assert not [line for line in out if line.startswith("[default0]")]
    assert "[default1]:out 1 KEEP this one" in out
    assert "[default0]:err 0 hello" in err and "[default1]:err 1 hello" in err
    attempt = run_dir(log_dir) / "attempt_0"
    assert sorted(p.name for p in (attempt / "0").iterdir()) == ["stdout.log"]
    assert sorted(p.name for p in (attempt / "1").iterdir()) == ["stderr.log"]
    assert "out 0 KEEP this one\n" in (attempt / "0" / "stdout.log").read_text()
    assert (attempt / "1" / "stderr.log").read_text() == "err 1 hello\nerr 1 ERRKEEP that one\n"


def test_local_ranks_filter_limits_the_console_only(tmp_path, write_script):
    script = write_script("w.py", WORKER)
    log_dir = tmp_path / "logs"
    result = launch(["--standalone", "--nproc-per-node", "3", "--log-dir", str(log_dir), "--tee", "3",
                     "--local-ranks-filter", "1", script])
    assert result.returncode == 0, result.stderr
    shown = lines(result.stdout) + lines(result.stderr)
    assert shown and all(line.startswith("[default1]:") for line in shown), shown
    attempt = run_dir(log_dir) / "attempt_0"
    for rank in (0, 1, 2):
        assert f"out {rank} KEEP" in (attempt / str(rank) / "stdout.log").read_text()
        assert f"err {rank} hello" in (attempt / str(rank) / "stderr.log").read_text()


def test_local_ranks_filter_without_log_dir(write_script):
    script = write_script("w.py", WORKER)
    result = launch(["--standalone", "--nproc-per-node", "2", "--local-ranks-filter", "0", script])
    assert result.returncode == 0, result.stderr
    shown = lines(result.stdout) + lines(result.stderr)
    assert len(shown) == 5 and all(line.startswith("[default0]:") for line in shown), shown


def test_prefix_template(write_script):
    script = write_script("w.py", WORKER)
    template = "<${role_name}|${rank}|${local_rank}> "
    result = launch(["--standalone", "--nproc-per-node", "2", "--role", "trainer", script],
                    env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": template})
    assert result.returncode == 0, result.stderr
    out = lines(result.stdout)
    assert "<trainer|0|0> out 0 KEEP this one" in out
    assert "<trainer|1|1> out 1 KEEP this one" in out
    assert "<trainer|1|1> err 1 hello" in lines(result.stderr)


def test_duplicate_filters(tmp_path, write_script):
    script = write_script("w.py", WORKER)
    log_dir = tmp_path / "logs"
    result = launch(["--standalone", "--nproc-per-node", "2", "--log-dir", str(log_dir), "--tee", "3",
                     "--duplicate-stdout-filters", "KEEP,nothing-matches",
                     "--duplicate-stderr-filters", "ERRKEEP", script])
    assert result.returncode == 0, result.stderr
    attempt = run_dir(log_dir) / "attempt_0"
    filtered_out = (attempt / "filtered_stdout.log").read_text().splitlines()
    filtered_err = (attempt / "filtered_stderr.log").read_text().splitlines()
    assert sorted(filtered_out) == ["[default0]:out 0 KEEP this one", "[default1]:out 1 KEEP this one"]
    assert sorted(filtered_err) == ["[default0]:err 0 ERRKEEP that one", "[default1]:err 1 ERRKEEP that one"]
    assert mode(attempt / "filtered_stdout.log") == 0o600


def test_nothing_left_in_tmpdir_after_success(write_script, tmpdir_env):
    tmp, env = tmpdir_env
    script = write_script("w.py", WORKER)
    for extra in ([], ["--tee", "3"], ["--duplicate-stdout-filters", "KEEP"]):
        result = launch(["--standalone", "--nproc-per-node", "2", *extra, script], env=env)
        assert result.returncode == 0, result.stderr
        assert list(tmp.iterdir()) == [], extra


def test_redirected_output_without_log_dir_is_kept(write_script, tmpdir_env):
    tmp, env = tmpdir_env
    script = write_script("w.py", WORKER)
    result = launch(["--standalone", "--nproc-per-node", "1", "-r", "1", script], env=env)
    assert result.returncode == 0, result.stderr
    # That output exists nowhere else, so it stays, and the agent says where.
    (kept,) = tmp.iterdir()
    (stdout_log,) = kept.glob("*/attempt_0/0/stdout.log")
    assert "out 0 KEEP this one" in stdout_log.read_text()
    assert f"worker logs kept in {stdout_log.parent.parent.parent}" in result.stderr.decode()


def test_failed_run_keeps_error_files(write_script, tmpdir_env):
    tmp, env = tmpdir_env
    script = write_script("fail.py", """
        import json, os
        with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
            json.dump({"message": "boom"}, f)
        raise SystemExit(3)
    """)
    result = launch(["--standalone", "--nproc-per-node", "1", script], env=env)
    assert result.returncode != 0
    (error_file,) = tmp.glob("launcher_*/*/attempt_0/0/error.json")
    assert json.loads(error_file.read_text()) == {"message": "boom"}


def test_attempt_directories_per_restart(tmp_path, write_script):
    script = write_script("flaky.py", """
        import os, sys
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        print(f"attempt {attempt}")
        sys.exit(1 if attempt == 0 else 0)
    """)
    log_dir = tmp_path / "logs"
    result = launch(["--standalone", "--nproc-per-node", "1", "--max-restarts", "1", "--log-dir", str(log_dir),
                     "-r", "1", script])
    assert result.returncode == 0, result.stderr
    job = run_dir(log_dir)
    assert (job / "attempt_0" / "0" / "stdout.log").read_text() == "attempt 0\n"
    assert (job / "attempt_1" / "0" / "stdout.log").read_text() == "attempt 1\n"


def test_log_dir_devnull_keeps_the_console_and_writes_nothing(write_script, tmp_path):
    script = write_script("w.py", WORKER)
    result = launch(["--standalone", "--nproc-per-node", "1", "--log-dir", os.devnull, "--tee", "3", script],
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "out 0 KEEP this one" in "\n".join(lines(result.stdout))
    assert "out 0 error_file=" in lines(result.stdout)
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["w.py"]


def test_log_dir_that_is_a_file_is_an_error(tmp_path, write_script):
    script = write_script("w.py", WORKER)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    result = launch(["--standalone", "--nproc-per-node", "1", "--log-dir", str(not_a_dir), script])
    assert result.returncode != 0
    assert "is a file" in result.stderr.decode()
