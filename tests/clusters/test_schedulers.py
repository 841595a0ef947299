"""Real jobs under real schedulers, with no rendezvous flags: the environment supplies them.

Each job runs the script of its page in ``docs/clusters/``, read from the page: Slurm's word for
word; the MPI pages' with the few changes this machine needs made visibly (:func:`_adapted`), and
the ssh stand-in and running as root given through the MPI launchers' own environment variables.

Slurm runs two virtual nodes (n1, n2) of this host, so every node has the same host name: the
launcher tells nodes apart by Slurm's node index, and so do these tests (``SLURMD_NODENAME``),
never by host name. Open MPI and MPICH start one launcher per "node" (node1, node2) through an ssh
stand-in that runs the command here.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from tests.clusters.schedulers import SlurmCluster
from tests.conftest import launcher_env, unwrapped

DOCS = Path(__file__).resolve().parents[2] / "docs" / "clusters"
#: ``launcher`` (the documented command) on PATH: this interpreter's.
BINDIR = str(Path(sys.executable).parent)
#: Four workers per node in the documents; two on this machine's two cores.
FEWER_WORKERS = {"--nproc-per-node=4": "--nproc-per-node=2"}


def _doc_script(page: str, *markers: str) -> str:
    """The one ``bash`` block of ``docs/clusters/PAGE`` that holds every marker, word for word."""
    blocks = re.findall(r"^```bash\n(.*?)^```$", (DOCS / page).read_text(), re.MULTILINE | re.DOTALL)
    [script] = [block for block in blocks if all(marker in block for marker in markers)]
    return script


def _adapted(script: str, changes: dict[str, str]) -> str:
    """``script`` with each change made exactly once: only what must differ on this machine."""
    for old, new in changes.items():
        assert script.count(old) == 1, f"the documented script no longer says {old!r} once:\n{script}"
        script = script.replace(old, new)
    return script


def _path_env(extra: dict[str, str] | None = None, *dirs: str) -> dict[str, str]:
    """The launcher's environment, with ``launcher`` (and ``dirs``) first on PATH."""
    path = os.pathsep.join([BINDIR, *dirs, os.environ.get("PATH", "")])
    return launcher_env({"PATH": path, **(extra or {})})


def _nodes_of_groups(output: str) -> dict[str, set[str]]:
    """Each group rank's Slurm nodes, from the train script's lines."""
    groups: dict[str, set[str]] = {}
    for group, node in re.findall(r"rank \d of \d group (\d) sum \d+ expected \d+ node (\S+)", output):
        groups.setdefault(group, set()).add(node)
    return groups


def _submit(
    cluster: SlurmCluster, tmp_path: Path, train: Path, script_text: str, extra: dict[str, str] | None = None
) -> tuple[dict[str, str], str]:
    """sbatch -N2 a documented script (``launcher`` on PATH, train.py beside it); state and output."""
    out = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text(script_text)
    if train.parent != tmp_path:
        (tmp_path / "train.py").write_text(train.read_text())
    result = cluster.run("sbatch", "-N2", "--parsable", f"--chdir={tmp_path}", f"--output={out}", str(script),
                         env=_path_env(extra))
    assert result.returncode == 0, result.stderr
    job = result.stdout.strip().split(";")[0]
    fields = cluster.wait_job(job)
    return fields, out.read_text() if out.exists() else ""


def _slurm_script() -> str:
    """docs/clusters/slurm.md's job script, word for word."""
    return _doc_script("slurm.md", "#SBATCH", "srun")


def test_sbatch_two_nodes(slurm_cluster: SlurmCluster, tmp_path: Path, train_script: Path) -> None:
    fields, output = _submit(slurm_cluster, tmp_path, train_script, _slurm_script())
    assert fields["JobState"] == "COMPLETED", output
    sums = re.findall(r"rank (\d) of 4 group (\d) sum 10 expected 10", output)
    assert sorted(sums) == [("0", "0"), ("1", "0"), ("2", "1"), ("3", "1")], output
    # The two launchers ran on the two slurmds: one node per group, n1 and n2 both.
    groups = _nodes_of_groups(output)
    assert sorted(groups) == ["0", "1"] and all(len(nodes) == 1 for nodes in groups.values()), output
    assert set.union(*groups.values()) == {"n1", "n2"}, output
    job = fields["JobId"]
    lines = re.findall(rf"Slurm job {job}: node (\d) of 2, static rendezvous at \S+:(\d+)", output)
    assert sorted(lines) == [("0", str(15000 + int(job) % 15000)), ("1", str(15000 + int(job) % 15000))], output


def test_sbatch_with_a_failing_rank(slurm_cluster: SlurmCluster, tmp_path: Path, train_script: Path) -> None:
    fields, output = _submit(slurm_cluster, tmp_path, train_script, _slurm_script(), {"FAIL_RANK": "3"})
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


def _run_doc_script(script: str, tmp_path: Path, env: dict[str, str]) -> str:
    """Run ``script`` with bash in ``tmp_path`` (train.py, hosts); its output, after a zero exit.

    The MPI launchers give each node's launcher a pty, but merge every node's output into one
    stream: no launcher may draw live lines there (an erased line would be torn by another node's
    output), so the output holds no erase sequence. Read as bytes: universal newlines would hide
    the carriage returns.
    """
    path = tmp_path / "job.sh"
    path.write_text(script)
    result = subprocess.run(["bash", str(path)], capture_output=True, timeout=240, env=env, cwd=tmp_path)
    output = (result.stdout + result.stderr).decode(errors="replace")
    assert result.returncode == 0, output
    assert "\x1b[K" not in output, ascii(output)
    return output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_openmpi_one_launcher_per_node(openmpi: str, rsh_agent: str, tmp_path: Path, train_script: Path) -> None:
    script = _adapted(_doc_script("openmpi.md", "mpirun"), FEWER_WORKERS)
    (tmp_path / "hosts").write_text("node1 slots=4\nnode2 slots=4\n")
    # mpirun --allow-run-as-root and --mca plm_rsh_agent, as Open MPI's environment variables.
    root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
    # rtc ^hwloc: Open MPI 4's daemon maps its hwloc topology into shared memory at a fixed address
    # and segfaults (in hwloc_shmem_topology_write) when something already lives there; it binds
    # nothing these tests need.
    env = _path_env({**root, "OMPI_MCA_plm_rsh_agent": rsh_agent, "OMPI_MCA_rtc": "^hwloc"},
                    str(Path(openmpi).parent))
    output = _run_doc_script(script, tmp_path, env)
    sums = re.findall(r"rank (\d) of 4 group \d sum 10 expected 10", output)
    assert sorted(sums) == ["0", "1", "2", "3"], output
    assert len(re.findall(r"Open MPI job \d+: 2 nodes, c10d rendezvous at", output)) == 2, output


def test_mpich_one_launcher_per_node(mpich: str, rsh_agent: str, tmp_path: Path, train_script: Path) -> None:
    # MPICH's ranks learn nothing of where to meet: the endpoint is the one flag to give. The
    # page's node1 does not resolve here; both "nodes" are this host.
    port = _free_port()
    script = _adapted(_doc_script("mpich.md", "mpiexec"),
                      {"mpiexec ": f"{mpich} ", "node1:29400": f"127.0.0.1:{port}", **FEWER_WORKERS})
    # mpiexec -launcher ssh -launcher-exec, as Hydra's environment variables.
    env = _path_env({"HYDRA_LAUNCHER": "ssh", "HYDRA_LAUNCHER_EXEC": rsh_agent})
    output = _run_doc_script(script, tmp_path, env)
    assert sorted(re.findall(r"rank (\d) of 4 group \d sum 10", output)) == ["0", "1", "2", "3"], output
    assert len(re.findall(rf"MPI \(PMI\): 2 nodes, c10d rendezvous at 127\.0\.0\.1:{port}", output)) == 2, output


def test_srun_pmi2_job(slurm_cluster: SlurmCluster, tmp_path: Path, train_script: Path) -> None:
    """docs/clusters/mpich.md's ``srun --mpi=pmi2`` job script under the two-node cluster."""
    mpi_types = slurm_cluster.run("srun", "--mpi=list")
    assert "pmi2" in mpi_types.stdout + mpi_types.stderr, mpi_types
    script = _adapted(_doc_script("mpich.md", "--mpi=pmi2"), FEWER_WORKERS)
    fields, output = _submit(slurm_cluster, tmp_path, train_script, script)
    assert fields["JobState"] == "COMPLETED", output
    assert sorted(re.findall(r"rank (\d) of 4 group \d sum 10 expected 10", output)) == ["0", "1", "2", "3"], output
    groups = _nodes_of_groups(output)
    assert all(len(nodes) == 1 for nodes in groups.values()) and set.union(*groups.values()) == {"n1", "n2"}, output
    job = fields["JobId"]
    port = 15000 + int(job) % 15000
    assert len(re.findall(rf"MPI \(PMI\) job {job}: 2 nodes, c10d rendezvous at \S+:{port}", output)) == 2, output


def test_salloc_without_srun_says_how_to_call_it(slurm_cluster: SlurmCluster, train_script: Path) -> None:
    result = slurm_cluster.run("salloc", "-N2", sys.executable, "-m", "launcher", str(train_script),
                               env=launcher_env())
    assert result.returncode == 2, result.stderr
    assert "salloc runs the launcher on one of them only" in result.stderr, result.stderr
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1" in result.stderr
    assert "Traceback" not in result.stderr
