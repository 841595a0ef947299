"""Real jobs under real schedulers, with no rendezvous flags: the environment supplies them.

Slurm runs two virtual nodes (n1, n2) of this host, so every node has the same host name: the
launcher tells nodes apart by Slurm's node index, never by host name. Open MPI and MPICH start
one launcher per "node" (nodeA, nodeB) through an ssh stand-in that runs the command here.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from tests.clusters.conftest import root_flags
from tests.clusters.schedulers import SlurmCluster
from tests.conftest import launcher_env, unwrapped

SLURM_PAGE = Path(__file__).resolve().parents[2] / "docs" / "clusters" / "slurm.md"


def _batch(tmp_path: Path) -> Path:
    """docs/clusters/slurm.md's job script, word for word."""
    blocks = re.findall(r"^```bash\n(.*?)^```$", SLURM_PAGE.read_text(), re.MULTILINE | re.DOTALL)
    [script_text] = [block for block in blocks if "#SBATCH" in block and "srun" in block]
    script = tmp_path / "job.sh"
    script.write_text(script_text)
    return script


def _submit(
    cluster: SlurmCluster, tmp_path: Path, train: Path, extra: dict[str, str] | None = None
) -> tuple[dict[str, str], str]:
    """sbatch -N2 the documented script (``launcher`` on PATH, train.py beside it); state and output."""
    out = tmp_path / "job.out"
    script = _batch(tmp_path)
    if train.parent != tmp_path:
        (tmp_path / "train.py").write_text(train.read_text())
    bindir = str(Path(sys.executable).parent)
    env = launcher_env({"PATH": bindir + os.pathsep + os.environ.get("PATH", ""), **(extra or {})})
    result = cluster.run("sbatch", "-N2", "--parsable", f"--chdir={tmp_path}", f"--output={out}", str(script),
                         env=env)
    assert result.returncode == 0, result.stderr
    job = result.stdout.strip().split(";")[0]
    fields = cluster.wait_job(job)
    return fields, out.read_text() if out.exists() else ""


def test_sbatch_two_nodes(slurm_cluster: SlurmCluster, tmp_path: Path, train_script: Path) -> None:
    fields, output = _submit(slurm_cluster, tmp_path, train_script)
    assert fields["JobState"] == "COMPLETED", output
    sums = re.findall(r"rank (\d) of 4 group (\d) sum 10 expected 10", output)
    assert sorted(sums) == [("0", "0"), ("1", "0"), ("2", "1"), ("3", "1")], output
    job = fields["JobId"]
    lines = re.findall(rf"Slurm job {job}: node (\d) of 2, static rendezvous at \S+:(\d+)", output)
    assert sorted(lines) == [("0", str(15000 + int(job) % 15000)), ("1", str(15000 + int(job) % 15000))], output


def test_sbatch_with_a_failing_rank(slurm_cluster: SlurmCluster, tmp_path: Path, train_script: Path) -> None:
    fields, output = _submit(slurm_cluster, tmp_path, train_script, {"FAIL_RANK": "3"})
    assert fields["JobState"] == "FAILED", output
    assert fields["ExitCode"] != "0:0", fields
    text = unwrapped(output)
    assert re.search(r"rank\s*:\s*3\b", text) and "exit code 3" in text, output


def test_srun_with_two_launchers_per_node_says_how_to_call_it(
    slurm_cluster: SlurmCluster, tmp_path: Path, train_script: Path
) -> None:
    result = slurm_cluster.run("srun", "-N2", "-n4", sys.executable, "-m", "launcher", str(train_script),
                               env=launcher_env())
    assert result.returncode != 0
    assert "srun started 2 launchers on" in result.stderr and "--ntasks-per-node=1" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def _hostfile(tmp_path: Path, spec: str) -> Path:
    path = tmp_path / "hosts"
    path.write_text(spec)
    return path


def test_openmpi_one_launcher_per_node(openmpi: str, rsh_agent: str, tmp_path: Path, train_script: Path) -> None:
    import subprocess

    hosts = _hostfile(tmp_path, "nodeA slots=2\nnodeB slots=2\n")
    result = subprocess.run(
        [openmpi, *root_flags(), "--hostfile", str(hosts), "--map-by", "ppr:1:node", "-np", "2",
         "--mca", "plm_rsh_agent", rsh_agent, sys.executable, "-m", "launcher", "--nproc-per-node=2",
         str(train_script)],
        capture_output=True, text=True, timeout=240, env=launcher_env(), cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    sums = re.findall(r"rank (\d) of 4 group \d sum 10 expected 10", output)
    assert sorted(sums) == ["0", "1", "2", "3"], output
    assert len(re.findall(r"Open MPI job \d+: 2 nodes, c10d rendezvous at", output)) == 2, output


def test_mpich_one_launcher_per_node(mpich: str, rsh_agent: str, tmp_path: Path, train_script: Path) -> None:
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # MPICH's ranks learn nothing of where to meet: the endpoint is the one flag to give.
    result = subprocess.run(
        [mpich, "-launcher", "ssh", "-launcher-exec", rsh_agent, "-hosts", "nodeA:1,nodeB:1", "-np", "2",
         sys.executable, "-m", "launcher", "--nproc-per-node=2", f"--rdzv-endpoint=127.0.0.1:{port}",
         str(train_script)],
        capture_output=True, text=True, timeout=240, env=launcher_env(), cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert sorted(re.findall(r"rank (\d) of 4 group \d sum 10", output)) == ["0", "1", "2", "3"], output
    assert len(re.findall(r"MPI \(PMI\): 2 nodes, c10d rendezvous at 127\.0\.0\.1", output)) == 2, output


def test_salloc_without_srun_says_how_to_call_it(slurm_cluster: SlurmCluster, train_script: Path) -> None:
    result = slurm_cluster.run("salloc", "-N2", sys.executable, "-m", "launcher", str(train_script),
                               env=launcher_env())
    assert result.returncode == 2, result.stderr
    assert "salloc runs the launcher on one of them only" in result.stderr, result.stderr
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1" in result.stderr
    assert "Traceback" not in result.stderr
