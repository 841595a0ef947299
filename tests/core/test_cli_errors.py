"""Bad input: one line on stderr, exit status 2, no traceback, and no worker started."""

from __future__ import annotations

import os

import pytest

from tests.conftest import run_launcher


@pytest.fixture
def marker_script(write_script, tmp_path):
    marker = tmp_path / "started"
    return write_script("marker.py", f"open({str(marker)!r}, 'a').write('x')\n"), marker


BAD = [
    (["--nnodes", "0"], "--nnodes"),
    (["--nnodes", "3:2"], "--nnodes"),
    (["--nnodes", "a:b"], "--nnodes"),
    (["--nnodes", "1:2:3"], "--nnodes"),
    (["--nproc-per-node", "0"], "--nproc-per-node"),
    (["--nproc-per-node", "-2"], "--nproc-per-node"),
    (["--nproc-per-node", "lots"], "device provider"),
    (["--rdzv-conf", "join_timeout"], "--rdzv-conf"),
    (["--standalone", "--rdzv-conf", "no_such_key=1"], "no_such_key"),
    (["--redirects", "7"], "--redirects"),
    (["--tee", "0:9"], "--tee"),
    (["--redirects", "x:1"], "--redirects"),
    (["--rdzv-backend", "nosuch"], "rendezvous backend"),
    (["--logs-specs", "nosuch"], "logs specs"),
    (["--event-log-handler", "nosuch"], "event handler"),
    (["--numa-binding", "nosuch"], "numa strategy"),
    (["--local-ranks-filter", "a,b"], "--local-ranks-filter"),
    (["--signals-to-handle", "SIGNOPE"], "--signals-to-handle"),
    (["--signals-to-handle", "SIGKILL"], "--signals-to-handle"),
    (["--max-restarts", "many"], "--max-restarts"),
    (["--max-restarts", "-1"], "--max-restarts"),
    (["--monitor-interval", "0"], "--monitor-interval"),
    (["--start-method", "teleport"], "--start-method"),
    (["--node-rank", "5"], "--node-rank"),
    (["--nnodes", "1:2"], "static"),
    (["--no-python", "-m"], "--no-python"),
    (["--shutdown-timeout", "soon"], "--shutdown-timeout"),
    (["--master-port", "70000"], "--master-port"),
    (["--no-such-flag"], "unrecognized"),
]


@pytest.mark.parametrize(("flags", "mentions"), BAD, ids=[" ".join(f) for f, _ in BAD])
def test_bad_flag_is_one_line_exit_2(flags, mentions, marker_script):
    script, marker = marker_script
    result = run_launcher([*flags, script], timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("launcher: error:")
    assert mentions in lines[0]
    assert "Traceback" not in result.stderr
    assert not marker.exists(), "a worker started despite the error"


def test_missing_script():
    result = run_launcher(["--standalone", "/nonexistent/train.py"])
    assert result.returncode == 2
    assert result.stderr.strip() == "launcher: error: script '/nonexistent/train.py' not found"


def test_missing_program_with_no_python():
    result = run_launcher(["--no-python", "no-such-program-xyz"])
    assert result.returncode == 2
    assert "not found on PATH" in result.stderr


def test_unknown_backend_lists_choices_and_makes_up_no_package(marker_script):
    script, _ = marker_script
    result = run_launcher(["--rdzv-backend", "redis", script])
    assert result.returncode == 2
    assert "choose one of" in result.stderr and "c10d" in result.stderr and "static" in result.stderr
    assert "pip install" not in result.stderr


def test_known_plugin_name_names_its_distribution(marker_script):
    script, marker = marker_script
    result = run_launcher(["--rdzv-backend", "etcd-v2", script], env={"LAUNCHER_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert result.returncode == 2, result.stderr
    assert "pip install ./plugins/launcher-etcd from a launcher checkout" in result.stderr
    assert "pip install launcher" not in result.stderr  # not on PyPI: no made-up package name
    assert not marker.exists()


def test_no_arguments_prints_the_usage_line():
    result = run_launcher([])
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "usage: launcher [options] SCRIPT" in result.stderr


def test_bad_pet_switch_value(marker_script):
    script, marker = marker_script
    result = run_launcher([script], env={"PET_STANDALONE": "maybe"})
    assert result.returncode == 2
    assert "PET_STANDALONE" in result.stderr
    assert not marker.exists()


def test_help_exits_zero():
    result = run_launcher(["--help"])
    assert result.returncode == 0
    for flag in ("--nproc-per-node", "--rdzv-backend", "--standalone", "--logs-specs", "--numa-binding"):
        assert flag in result.stdout


def test_version_prints_the_version_and_exits_zero(marker_script):
    import launcher

    script, marker = marker_script
    for args in (["--version"], ["--standalone", "--version", script]):
        result = run_launcher(args)
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"launcher {launcher.__version__}\n"
        assert result.stderr == ""
    assert not marker.exists(), "--version must start no worker"


def test_version_after_the_script_is_the_scripts(tmp_path):
    script = tmp_path / "args.py"
    script.write_text("import sys\nprint('script got', sys.argv[1:])\n")
    result = run_launcher(["--standalone", str(script), "--version"])
    assert result.returncode == 0, result.stderr
    assert "script got ['--version']" in result.stdout


def test_static_port_in_use_is_a_clear_error(marker_script):
    import socket

    script, marker = marker_script
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_launcher(["--master-port", str(port), script])
    assert result.returncode == 1
    assert f"port {port} is already in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists()
    assert os.path.exists(script)


def test_too_few_file_descriptors_is_one_line_before_anything_starts(marker_script):
    import subprocess
    import sys

    from tests.conftest import launcher_env

    script, marker = marker_script
    result = subprocess.run(
        ["sh", "-c", 'ulimit -n 100 && exec "$@"', "sh", sys.executable, "-m", "launcher", "--nproc-per-node", "64",
         script],
        env=launcher_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "launcher: error: --nproc-per-node 64 needs at least 208 open files in the launcher, but the limit "
        "(ulimit -n) is 100: raise it, or start fewer workers"
    ]
    assert not marker.exists()


def test_emfile_while_starting_workers_is_one_line_and_leaves_none(tmp_path):
    """Past the up-front minimum, log files use more descriptors: EMFILE at spawn ends in one line."""
    import subprocess
    import sys

    from tests.conftest import launcher_env

    command = [sys.executable, "-m", "launcher", "--standalone", "--nproc-per-node", "50", "--tee", "3",
               "--log-dir", str(tmp_path / "logs"), "--duplicate-stdout-filters", "x",
               "--duplicate-stderr-filters", "y", "--no-python", "sleep", "30"]  # fmt: skip
    result = subprocess.run(["sh", "-c", 'ulimit -n 200 && exec "$@"', "sh", *command],
                            env=launcher_env({"OMP_NUM_THREADS": "1"}), capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "worker logs kept" not in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].endswith(
        "cannot start 50 workers: too many open files in the launcher (ulimit -n) [EMFILE]; "
        "raise the limit, or start fewer workers"
    )
