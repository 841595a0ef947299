"""How workers end: ``--run-path`` (function) workers wait for their agent; a gloo group left alive
is torn down after the script's exit handlers; an abort at interpreter exit is reported as one."""

from __future__ import annotations

import pytest

from tests.conftest import run_launcher

pytest.importorskip("torch")

#: Call libstdc++'s own std::terminate: what a C++ thread unwinding at interpreter exit ends in.
TERMINATE = "import ctypes; ctypes.CDLL('libstdc++.so.6')['_ZSt9terminatev']()"


def test_a_run_path_worker_stays_until_every_local_worker_has_finished(write_script, tmp_path):
    """Rank 0 returns at once; rank 1 finishes later and finds rank 0 still there (not even a zombie)."""
    pid_file = tmp_path / "rank0.pid"
    script = write_script("peers.py", f"""
        import os, time
        pid_file = {str(pid_file)!r}
        if os.environ["RANK"] == "0":
            with open(pid_file + ".tmp", "w") as handle:
                handle.write(str(os.getpid()))
            os.replace(pid_file + ".tmp", pid_file)
        else:
            while not os.path.exists(pid_file):
                time.sleep(0.01)
            time.sleep(0.5)  # rank 0 has long returned from its code
            pid = open(pid_file).read()
            try:
                state = open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                state = "gone"
            print("rank 0 is", "waiting" if state not in ("Z", "X", "gone") else "gone", flush=True)
    """)
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--run-path", script], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "rank 0 is waiting" in result.stdout, result.stdout


def test_a_waiting_run_path_worker_does_not_hold_up_a_failure(write_script):
    """Rank 0 returned and waits; rank 1 raises: the job fails at once with rank 1 as the root cause."""
    script = write_script("fails.py", """
        import os
        if os.environ["RANK"] == "1":
            raise RuntimeError("rank 1 broke")
    """)
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--run-path", script], timeout=120)
    assert result.returncode == 1
    root = result.stderr.split("Root cause", 1)[1]
    assert "rank       : 1" in root and "rank 1 broke" in root, result.stderr


GLOO_LEFT_ALIVE = """
    import atexit
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(value)
    print(f"rank {dist.get_rank()} sum {value.item():g}", flush=True)

    original = dist.destroy_process_group
    def destroy(*args, **kwargs):  # to see who destroys the group, and when
        print(f"rank {dist.get_rank()} group destroyed", flush=True)
        return original(*args, **kwargs)
    dist.destroy_process_group = destroy

    atexit.register(lambda: print(f"script's exit handler: initialized={dist.is_initialized()}", flush=True))
"""


@pytest.mark.parametrize("mode", [["--run-path"], ["--preload", "torch"]], ids=["run-path", "preload"])
def test_a_gloo_group_left_alive_is_destroyed_after_the_scripts_own_exit_handlers(write_script, mode):
    """Where launcher's code runs the script (--run-path, or the --preload template), a gloo group
    the script left alive is torn down after the script's own exit handlers."""
    script = write_script("leave.py", GLOO_LEFT_ALIVE)
    result = run_launcher(["--standalone", "--nproc-per-node", "2", *mode, script], timeout=180)
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        lines = [line.split(":", 1)[1] for line in result.stdout.splitlines()
                 if line.startswith(f"[default{rank}]:")]
        # The script's own handler still sees its group; the teardown comes after it.
        assert lines == [f"rank {rank} sum 1", "script's exit handler: initialized=True",
                         f"rank {rank} group destroyed"], result.stdout


def test_plain_script_workers_run_no_launcher_code(write_script):
    """Without --run-path or --preload the worker is the user's script alone: nothing is torn down."""
    script = write_script("leave.py", GLOO_LEFT_ALIVE)
    result = run_launcher(["--standalone", "--nproc-per-node", "2", script], timeout=180)
    assert "group destroyed" not in result.stdout, result.stdout


def test_a_script_that_destroys_its_group_itself_is_left_alone(write_script):
    script = write_script("tidy.py", GLOO_LEFT_ALIVE + "    dist.destroy_process_group()\n")
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--run-path", script], timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("group destroyed") == 2, result.stdout  # once per rank: its own call
    assert "initialized=False" in result.stdout


def _why(stderr: str) -> str:
    """The report's ``why`` field, unwrapped."""
    text = stderr.split("why        :", 1)[1]
    lines = [text.splitlines()[0]]
    for line in text.splitlines()[1:]:
        if not line.startswith("               "):
            break
        lines.append(line)
    return " ".join(part.strip() for part in lines)


def test_an_abort_after_the_last_output_is_reported_as_an_exit_time_abort(write_script):
    """Script mode: launcher cannot know the script had finished, and says what it can."""
    script = write_script("aborts.py", f"""
        print("result 42", flush=True)
        {TERMINATE}
    """)
    result = run_launcher(["--standalone", "--nproc-per-node", "1", script], timeout=120)
    assert result.returncode == 1
    assert "result 42" in result.stdout
    assert "signal SIGABRT (6)" in result.stderr
    why = _why(result.stderr)
    assert "aborted after its last output, most likely during interpreter shutdown" in why, result.stderr
    assert "torch.distributed.destroy_process_group()" in why


def test_an_abort_of_a_run_path_worker_after_its_result_is_known_to_be_at_exit(write_script):
    """--run-path: the agent had the result, so the abort was the interpreter's exit, for certain."""
    script = write_script("aborts_at_exit.py", f"""
        import atexit
        print("result 42", flush=True)
        import ctypes
        atexit.register(lambda: ({TERMINATE.split('; ')[1]}))
    """)
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--run-path", script], timeout=120)
    assert result.returncode == 1
    why = _why(result.stderr)
    assert "aborted during interpreter shutdown, after its code had finished and the launcher had its result" in why
    assert "torch.distributed.destroy_process_group()" in why


def test_another_sigabrt_keeps_its_general_explanation(write_script):
    script = write_script("abort.py", "import os\nprint('x', flush=True)\nos.abort()\n")
    result = run_launcher(["--standalone", "--nproc-per-node", "1", script], timeout=120)
    assert result.returncode == 1
    assert "aborted by native code" in _why(result.stderr)
