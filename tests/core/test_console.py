"""The command line and the Python API print the launcher's notices in the same words and format."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import launcher_env, run_launcher

API_SCRIPT = """
from launcher import LaunchConfig, launch

def work():
    return 1

if __name__ == "__main__":
    assert launch(LaunchConfig(nproc_per_node=2), work)() == {0: 1, 1: 1}
"""


def _omp_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "OMP_NUM_THREADS" in line]


def test_cli_and_api_print_the_same_omp_num_threads_notice(write_script, tmp_path):
    worker = write_script("worker.py", "pass\n")
    cli = run_launcher(["--standalone", "--nproc-per-node", "2", worker])
    assert cli.returncode == 0, cli.stderr
    api_script = write_script("api.py", API_SCRIPT)
    api = subprocess.run([sys.executable, api_script], env=launcher_env(), capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)  # fmt: skip
    assert api.returncode == 0, api.stderr
    assert _omp_lines(cli.stderr) == _omp_lines(api.stderr)
    assert _omp_lines(cli.stderr) == [
        "[launcher] WARNING: setting OMP_NUM_THREADS=1 for each worker so 2 workers do not oversubscribe "
        "the CPUs; set OMP_NUM_THREADS to tune it"
    ]
