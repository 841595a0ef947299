"""How the script runs: python -u script, -m module, --no-python binaries, --run-path."""

from __future__ import annotations

import os
import sys

from tests.conftest import run_launcher


def test_module_mode(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(
        "import os, sys\nprint('module', __name__, os.environ['RANK'], sys.argv[1:])\n"
    )
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "-m", "mypkg.train", "--lr", "0.1"],
                          env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "module __main__ 0 ['--lr', '0.1']" in result.stdout
    assert "module __main__ 1 ['--lr', '0.1']" in result.stdout


def test_no_python_runs_binary(tmp_path):
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--no-python", "sh", "-c",
                           'echo "shell rank $RANK of $WORLD_SIZE"'])
    assert result.returncode == 0, result.stderr
    assert "shell rank 0 of 2" in result.stdout and "shell rank 1 of 2" in result.stdout


def test_no_python_with_path_to_executable(tmp_path):
    program = tmp_path / "prog.sh"
    program.write_text("#!/bin/sh\necho prog $LOCAL_RANK\n")
    program.chmod(0o755)
    result = run_launcher(["--standalone", "--no-python", str(program)])
    assert result.returncode == 0, result.stderr
    assert "prog 0" in result.stdout


def test_run_path(write_script):
    script = write_script(
        "rp.py",
        """
        import os, sys
        print("run-path", __name__, os.environ["RANK"], sys.argv[1:], flush=True)
        """,
    )
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--run-path", script, "a", "b"])
    assert result.returncode == 0, result.stderr
    assert "run-path __main__ 0 ['a', 'b']" in result.stdout
    assert "run-path __main__ 1 ['a', 'b']" in result.stdout


def test_run_path_failure_is_reported(write_script):
    script = write_script("rp_fail.py", "raise SystemExit(4)\n")
    result = run_launcher(["--standalone", "--run-path", script])
    assert result.returncode == 1
    assert "exit code 4" in result.stderr


def test_local_rank_macro(write_script):
    script = write_script("macro.py", "import sys; print('arg', sys.argv[1])\n")
    result = run_launcher(["--standalone", "--nproc-per-node", "2", script, "--local-rank=${local_rank}"])
    assert result.returncode == 0, result.stderr
    assert "arg --local-rank=0" in result.stdout and "arg --local-rank=1" in result.stdout


def test_python_exec_override(write_script, tmp_path):
    wrapper = tmp_path / "mypython"
    wrapper.write_text(f"#!/bin/sh\nexport VIA_WRAPPER=1\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    script = write_script("which.py", "import os; print('wrapper', os.environ.get('VIA_WRAPPER'))\n")
    result = run_launcher(["--standalone", script], env={"PYTHON_EXEC": str(wrapper)})
    assert result.returncode == 0, result.stderr
    assert "wrapper 1" in result.stdout


def test_python_m_launcher_and_console_script_agree(write_script):
    import shutil
    import subprocess

    from tests.conftest import launcher_env

    script = write_script("same.py", "print('same')\n")
    console = shutil.which("launcher", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    assert console is not None
    result = subprocess.run([console, "--standalone", script], env=launcher_env(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "same" in result.stdout
