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


def test_unknown_backend_lists_choices_and_hints_install(marker_script):
    script, _ = marker_script
    result = run_launcher(["--rdzv-backend", "redis", script])
    assert result.returncode == 2
    assert "choose one of" in result.stderr and "c10d" in result.stderr and "static" in result.stderr
    assert "pip install launcher-redis" in result.stderr


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
