"""``--preload``: workers forked from a template that imported the modules once (real processes).

A preloaded worker must be indistinguishable from a normally started one (environment, argv,
working directory, session, ``__main__``, stdio, exit status), be restarted from the template,
and nothing of the job (the template included) may outlive it. Where preloading cannot apply
or would not be safe, workers start normally and one line says why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import LAUNCHER, launcher_env, run_launcher
from tests.core.test_no_survivors import FAMILY, Run, _alive, _await_adoption, _gone_after, _kill_marked

#: What a worker tells about itself: everything a fork could get wrong.
PORTRAIT = """
import sys
modules = sorted(sys.modules)
preloaded = sorted(m for m in ("json", "counted", "torch", "empty") if m in sys.modules)
import json, os
out = sys.argv[1]
try:
    stdin = os.readlink("/proc/self/fd/0")
except OSError:
    stdin = "?"
main = sys.modules["__main__"]
portrait = {
    "preloaded": preloaded,
    "name": __name__,
    "file": __file__,
    "argv": sys.argv,
    "orig_argv": getattr(sys, "orig_argv", None),
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "own_session": os.getsid(0) == os.getpid(),
    "own_group": os.getpgid(0) == os.getpid(),
    "ppid": os.getppid(),
    "stdin": stdin,
    "stdout_pipe": os.readlink("/proc/self/fd/1").startswith("pipe:"),
    "main_names": sorted(n for n in vars(main) if not n.startswith("__")),
    "main_dunders": sorted(n for n in vars(main) if n.startswith("__")),
    "spec": [getattr(main.__spec__, "name", None), getattr(main.__spec__, "origin", None)],
    "loader": type(getattr(main, "__loader__", None)).__name__,
    "env": {k: v for k, v in os.environ.items()},
    "affinity": sorted(os.sched_getaffinity(0)),
    "stdout": [sys.stdout.write_through, sys.stdout.line_buffering, sys.stdout.encoding,
               type(sys.stdout.buffer).__name__],
    "executable": sys.executable,
    "modules": modules,
}
print("hello from rank", os.environ["RANK"])
with open(os.path.join(out, os.environ["RANK"] + ".json"), "w") as f:
    json.dump(portrait, f)
"""

#: A module whose every import is counted in a file, to see how often the template imported it.
COUNTED = """
import os
with open(os.environ["COUNT_FILE"], "a") as f:
    f.write("imported\\n")
"""

#: Fails once (rank 1 of the first attempt), after rank 0 optionally touched the counted module.
RESTARTED = """
import json, os, sys, time
preloaded = "counted" in sys.modules
import counted
out, touch = sys.argv[1], sys.argv[2] == "touch"
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
rank = os.environ["RANK"]
with open(os.path.join(out, f"{attempt}.{rank}"), "w") as f:
    json.dump({"preloaded": preloaded, "ppid": os.getppid(), "pid": os.getpid()}, f)
if attempt == "0":
    if rank == "0" and touch:
        path = counted.__file__
        with open(path, "a") as f:
            f.write("# changed\\n")
        stamp = os.stat(path).st_mtime + 5
        os.utime(path, (stamp, stamp))
    if rank == "1":
        while len([n for n in os.listdir(out) if n.startswith("0.")]) < 2:
            time.sleep(0.01)
        sys.exit(3)
"""


def _run(args: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
         timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run the launcher to its end; (the completed process, the launcher's pid)."""
    proc = subprocess.Popen([*LAUNCHER, *args], env=launcher_env(env), cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), proc.pid


def _portraits(out: Path) -> dict[str, dict]:
    return {name.stem: json.loads(name.read_text()) for name in sorted(out.glob("*.json"))}


def _preload_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "--preload" in line]


def _comparable(portrait: dict, launcher_pid: int) -> dict:
    """A portrait without what differs between any two runs (pids, the job's token, ports)."""
    assert portrait["ppid"] == launcher_pid, "the worker must be the agent's own child"
    env = {k: v for k, v in portrait["env"].items()
           if k not in ("LAUNCHER_JOB_TOKEN", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")}
    return {**portrait, "preloaded": None, "ppid": None, "env": env, "modules": None}


def test_preloaded_workers_are_what_a_normal_start_gives(write_script, tmp_path):
    script = write_script("portrait.py", PORTRAIT)
    runs = {}
    out = tmp_path / "out"  # one directory for both runs: the workers' argv must be the same
    out.mkdir()
    for mode, flags in (("normal", []), ("preload", ["--preload", "json"])):
        for old in out.iterdir():
            old.unlink()
        result, pid = _run(["--standalone", "--nproc-per-node", "2", *flags, script, str(out)],
                           env={"MY_SETTING": "x y"}, cwd=str(tmp_path))
        assert result.returncode == 0, result.stderr
        assert "[default0]:hello from rank 0" in result.stdout
        assert "[default1]:hello from rank 1" in result.stdout
        portraits = _portraits(out)
        assert set(portraits) == {"0", "1"}
        runs[mode] = (portraits, pid, result.stderr)
    preloaded, preload_pid, stderr = runs["preload"]
    assert all(p["preloaded"] == ["json"] for p in preloaded.values()), "json was not preloaded"
    assert all(p["preloaded"] == [] for p in runs["normal"][0].values())
    assert not _preload_lines(stderr), stderr
    for rank in ("0", "1"):
        expected = _comparable(runs["normal"][0][rank], runs["normal"][1])
        got = _comparable(preloaded[rank], preload_pid)
        assert got == expected
        assert got["name"] == "__main__" and got["own_session"] and got["own_group"]
        assert got["stdin"] == "/dev/null" and got["stdout_pipe"]
        assert "_serve" not in got["main_names"], "__main__ must be a fresh module, not the template's"


def test_a_forked_worker_has_only_the_preloaded_modules_more(write_script, tmp_path):
    write_script("empty.py", "")
    script = write_script("portrait.py", PORTRAIT)
    out = tmp_path / "out"
    out.mkdir()
    modules = {}
    for mode, flags in (("normal", []), ("preload", ["--preload", "empty"])):
        result, _ = _run(["--standalone", "--nproc-per-node", "2", *flags, script, str(out)])
        assert result.returncode == 0, result.stderr
        modules[mode] = set(_portraits(out)["0"]["modules"])
    # The template's own machinery leaves only the C socket module behind.
    assert modules["preload"] - modules["normal"] <= {"empty", "_socket"}
    assert "empty" in modules["preload"]
    assert modules["normal"] <= modules["preload"]


def test_module_mode_runs_a_fresh_main(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "portrait.py").write_text(PORTRAIT)
    runs = {}
    out = tmp_path / "out"
    out.mkdir()
    for mode, flags in (("normal", []), ("preload", ["--preload", "json"])):
        for old in out.iterdir():
            old.unlink()
        result, pid = _run(["--standalone", "--nproc-per-node", "2", *flags, "-m", "pkg.portrait", str(out)],
                           cwd=str(tmp_path))
        assert result.returncode == 0, result.stderr
        runs[mode] = {rank: _comparable(p, pid) for rank, p in _portraits(out).items()}
    assert runs["preload"] == runs["normal"]
    assert runs["preload"]["0"]["argv"][0] == str(package / "portrait.py")
    assert runs["preload"]["0"]["path0"] == str(tmp_path)


ENDINGS = {
    "exception": ("raise ValueError('bad input')", "exit code 1"),
    "signal": ("os.kill(os.getpid(), signal.SIGTERM)", "signal SIGTERM"),
    "interrupt": ("raise KeyboardInterrupt", "signal SIGINT"),
    "exit": ("sys.exit(7)", "exit code 7"),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_exit_codes_signals_and_tracebacks_propagate(write_script, ending):
    statement, expected = ENDINGS[ending]
    script = write_script("ends.py", f"import os, signal, sys\n\ndef end():\n    {statement}\n\nend()\n")
    reports = {}
    for mode, flags in (("normal", []), ("preload", ["--preload", "json"])):
        result = run_launcher(["--standalone", *flags, script])
        assert result.returncode == 1, result.stderr
        exit_line = [line for line in result.stderr.splitlines() if line.strip().startswith("exit ")]
        tail = result.stderr[result.stderr.index("stderr     :"):]
        reports[mode] = (exit_line, tail)
        assert expected in exit_line[0], result.stderr
        assert "_preload_main" not in result.stderr and "runpy" not in result.stderr
    assert reports["preload"] == reports["normal"]
    if ending in ("exception", "interrupt"):
        assert f'File "{script}", line 6, in <module>' in reports["preload"][1]
        assert f'File "{script}", line 4, in end' in reports["preload"][1]


def test_failing_worker_is_restarted_from_the_same_template(write_script, tmp_path):
    write_script("counted.py", COUNTED)
    script = write_script("restarted.py", RESTARTED)
    out = tmp_path / "out"
    out.mkdir()
    count = tmp_path / "count"
    result, pid = _run(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--preload", "counted",
                        script, str(out), "keep"], env={"COUNT_FILE": str(count)})
    assert result.returncode == 0, result.stderr
    records = {name.name: json.loads(name.read_text()) for name in out.iterdir()}
    assert set(records) == {"0.0", "0.1", "1.0", "1.1"}
    assert all(r["preloaded"] and r["ppid"] == pid for r in records.values()), (records, result.stderr)
    assert count.read_text().count("imported") == 1, ("the template should import it once for both attempts",
                                                      result.stderr)


def test_a_module_changed_on_disk_recreates_the_template(write_script, tmp_path):
    write_script("counted.py", COUNTED)
    script = write_script("restarted.py", RESTARTED)
    out = tmp_path / "out"
    out.mkdir()
    count = tmp_path / "count"
    result, _ = _run(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--preload", "counted",
                      script, str(out), "touch"], env={"COUNT_FILE": str(count), "LOGLEVEL": "INFO"})
    assert result.returncode == 0, result.stderr
    records = {name.name: json.loads(name.read_text()) for name in out.iterdir()}
    assert all(r["preloaded"] for r in records.values()), records
    assert count.read_text().count("imported") == 2, "the changed module must be imported again"
    assert "counted.py changed on disk since the template imported it; re-creating the template" in result.stderr


def test_a_template_that_started_a_thread_is_refused_in_one_line(write_script, tmp_path):
    write_script("threaded.py", """
        import threading, time
        threading.Thread(target=time.sleep, args=(60,), name="poller", daemon=True).start()
    """)
    script = write_script("check.py", """
        import os, sys
        assert "threaded" not in sys.modules
        if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
            sys.exit(1)
    """)
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                           "--preload", "json,threaded", script])
    assert result.returncode == 0, result.stderr
    lines = _preload_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert "not preloading: importing threaded started 1 thread(s) (poller)" in lines[0]
    assert "starting workers normally" in lines[0]


def test_a_module_that_cannot_be_imported_falls_back_in_one_line(write_script):
    script = write_script("ok.py", "import sys\nassert 'json' not in sys.modules\n")
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--preload", "json,no_such_module_here", script])
    assert result.returncode == 0, result.stderr
    lines = _preload_lines(result.stderr)
    assert len(lines) == 1 and "cannot import no_such_module_here (ModuleNotFoundError" in lines[0], result.stderr


def test_hang_stacks_of_preloaded_workers(write_script):
    script = write_script("stuck.py", """
        import os, sys, time
        import launcher
        def wait_forever():
            time.sleep(60)
        assert "json" in sys.modules
        assert launcher.__file__  # the start-up hook's path entry must be gone from PYTHONPATH:
        assert "_site" not in os.environ.get("PYTHONPATH", "")
        launcher.heartbeat()
        if os.environ["RANK"] == "1":
            wait_forever()
        for _ in range(100):
            launcher.heartbeat()
            time.sleep(0.1)
    """)
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "2", "--preload", "json",
                           script], timeout=60)
    assert result.returncode == 1, result.stderr
    assert "rank 1: wait_forever (stuck.py:5) <- <module> (stuck.py:11)" in result.stderr, result.stderr


def test_no_python_and_run_path_fall_back_in_one_line(write_script):
    script = write_script("ok.py", "import sys\nassert 'json' not in sys.modules\nprint('ran')\n")
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--preload", "json", "--no-python",
                           sys.executable, script])
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("ran") == 2
    lines = _preload_lines(result.stderr)
    assert len(lines) == 1 and "does not apply with --no-python" in lines[0], result.stderr

    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--preload", "json", "--run-path", script])
    assert result.returncode == 0, result.stderr
    lines = _preload_lines(result.stderr)
    assert len(lines) == 1 and "does not apply to function entrypoints" in lines[0], result.stderr


def test_the_flag_and_its_variable(write_script):
    script = write_script("ok.py", "import sys\nassert 'json' in sys.modules\n")
    result = run_launcher(["--standalone", "--nproc-per-node", "2", script], env={"PET_PRELOAD": "json"})
    assert result.returncode == 0, result.stderr
    result = run_launcher(["--standalone", "--preload", "json,not a module", script])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "launcher: error: --preload 'not a module' is not a module name: use dotted names like torch or torch.nn"
    ]


# -- nothing outlives the job, the template included (as tests/core/test_no_survivors.py) -----------


@pytest.fixture
def preloaded_family(write_script, tmp_path):
    script = write_script("family.py", FAMILY)
    runs: list[Run] = []

    def start(mode: str, *flags: str, env: dict[str, str] | None = None) -> Run:
        run = Run(script, tmp_path / f"out{len(runs)}", mode, "--preload", "json", *flags, env=env)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.cleanup()


def _template_pids(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"_preload_main.py" in f.read() and _alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("mode,flags,code", [("success", (), 0), ("restart", ("--max-restarts", "1"), 0),
                                             ("failure", ("--max-restarts", "0"), 1)])
def test_no_process_outlives_a_preloaded_job(preloaded_family, mode, flags, code):
    run = preloaded_family(mode, *flags)
    stderr = run.finish()
    assert run.proc.returncode == code, stderr
    assert not _preload_lines(stderr), stderr
    left, _, _ = _gone_after(run.marker)
    assert not left, f"processes outlived the job: {left}"


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_the_template_dies_with_the_agent(preloaded_family, how):
    run = preloaded_family("wait", env={"LOGLEVEL": "DEBUG"})
    pids = run.families()
    assert all(_alive(pid) for pid in pids)
    # Forked workers show the template's command line too: the template is the one not recorded.
    assert len([pid for pid in _template_pids(run.marker) if pid not in pids]) == 1
    if how == "SIGKILL":
        _await_adoption(run)  # without a cgroup: once the agent has registered its adopted orphans
        run.proc.kill()
        run.proc.wait(30)
    else:
        run.proc.send_signal(signal.SIGTERM)
        assert run.finish() is not None
    left, _, _ = _gone_after(run.marker)
    _kill_marked(run.marker)
    assert not left, f"processes outlived the agent ({how}): {left}"


# -- torch ------------------------------------------------------------------------------------------


def test_torch_is_imported_once_and_workers_restart_with_it(write_script, tmp_path):
    pytest.importorskip("torch")
    script = write_script("torch_worker.py", """
        import json, os, sys
        preloaded = "torch" in sys.modules
        import torch
        out = sys.argv[1]
        attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
        with open(os.path.join(out, f"{attempt}.{rank}"), "w") as f:
            json.dump({"preloaded": preloaded, "sum": torch.ones(3).sum().item(),
                       "cuda_initialized": torch.cuda.is_initialized()}, f)
        if attempt == "0" and rank == "1":
            sys.exit(5)
    """)
    out = tmp_path / "out"
    out.mkdir()
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--preload", "torch",
                           script, str(out)], timeout=300)
    assert result.returncode == 0, result.stderr
    assert not _preload_lines(result.stderr), result.stderr
    records = {name.name: json.loads(name.read_text()) for name in out.iterdir()}
    assert set(records) == {"0.0", "0.1", "1.0", "1.1"}
    assert all(r["preloaded"] and r["sum"] == 3.0 and not r["cuda_initialized"] for r in records.values())
