"""Fixtures that start real schedulers (installed with apt-get when missing, as root only)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clusters.schedulers import SlurmCluster, ensure_packages


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """slurmctld and two slurmd (nodes n1 and n2 of this host), stopped after the session."""
    reason = ensure_packages("slurm")
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except RuntimeError as exc:
        pytest.skip(f"cannot start a Slurm cluster here: {str(exc).splitlines()[0]}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def rsh_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A stand-in for ssh that drops the host and runs the command here: hosts node1 and node2.

    Each daemon it starts gets a session directory of its own (Open MPI's ``orte_tmpdir_base``):
    on one real host they would share ``/tmp/ompi.<host>.<uid>/jf.<family>``, and two daemons
    creating it at the same moment, or a directory an earlier killed job left under the same
    family number, fail the start ("mkdir ... File exists"). Short: PMIx puts sockets there.
    """
    sessions = tempfile.mkdtemp(prefix="rsh", dir="/tmp")
    path = tmp_path_factory.mktemp("rsh") / "rsh.sh"
    path.write_text(
        "#!/bin/sh\n# Drop ssh's options and the host name, run the rest on this host.\n"
        'while [ "$#" -gt 0 ]; do case "$1" in -*) shift;; *) host=$1; shift; break;; esac; done\n'
        f'OMPI_MCA_orte_tmpdir_base={sessions}/$host.$$; export OMPI_MCA_orte_tmpdir_base\n'
        'mkdir -p "$OMPI_MCA_orte_tmpdir_base"\n'
        'exec sh -c "$*"\n'
    )
    path.chmod(0o755)
    try:
        yield str(path)
    finally:
        shutil.rmtree(sessions, ignore_errors=True)


@pytest.fixture(scope="session")
def openmpi() -> str:
    """Open MPI's mpirun."""
    reason = ensure_packages("openmpi")
    if reason:
        pytest.skip(reason)
    return shutil.which("mpirun") or "/usr/bin/mpirun"


@pytest.fixture(scope="session")
def mpich() -> str:
    """MPICH's mpirun (Debian names it mpirun.mpich; /usr/bin/mpirun stays Open MPI's)."""
    reason = ensure_packages("mpich")
    if reason:
        pytest.skip(reason)
    return shutil.which("mpirun.mpich") or "/usr/bin/mpirun.mpich"


@pytest.fixture
def train_script(tmp_path: Path) -> Path:
    """A worker that checks a gloo all_reduce over the whole job; ``FAIL_RANK`` exits 3 instead.

    Each rank's line ends with its Slurm node (``SLURMD_NODENAME``, ``-`` outside Slurm): the virtual
    nodes share one host name, so that is what tells them apart.
    """
    path = tmp_path / "train.py"
    path.write_text(
        "import os, sys\n"
        "import torch, torch.distributed as dist\n"
        "rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])\n"
        "if os.environ.get('FAIL_RANK') == str(rank):\n"
        "    sys.exit(3)\n"
        "dist.init_process_group('gloo')\n"
        "value = torch.tensor([rank + 1.0])\n"
        "dist.all_reduce(value)\n"
        "expected = world * (world + 1) / 2\n"
        "print(f'rank {rank} of {world} group {os.environ[\"GROUP_RANK\"]} sum {value.item():g} "
        "expected {expected:g} node {os.environ.get(\"SLURMD_NODENAME\", \"-\")}', flush=True)\n"
        "dist.destroy_process_group()\n"
        "sys.exit(0 if value.item() == expected else 1)\n"
    )
    return path
