"""Real schedulers for the cluster tests: a two-node Slurm cluster and Open MPI/MPICH "nodes".

Debian packages Slurm, Open MPI and MPICH. :func:`ensure_packages` installs the missing ones (only
as root with apt-get; otherwise the tests skip and say why). :class:`SlurmCluster` writes a
``slurm.conf`` in a temporary directory and starts ``slurmctld`` and two ``slurmd`` (virtual nodes
``n1`` and ``n2`` of this host, the build has MULTIPLE_SLURMD); :meth:`SlurmCluster.stop` kills every
daemon it started, so none outlives the test session.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

#: Debian packages per scheduler (also on .ci/run's apt-get line).
PACKAGES = {
    "slurm": ("slurmctld", "slurmd", "slurm-client"),
    "openmpi": ("openmpi-bin",),
    "mpich": ("mpich",),
}
#: The program that proves each scheduler is installed.
PROGRAMS = {"slurm": ("slurmctld", "slurmd", "sbatch"), "openmpi": ("mpirun",), "mpich": ("mpirun.mpich",)}


def missing_reason(scheduler: str) -> str | None:
    """``None`` when ``scheduler`` is installed or could be installed now; else why not (a skip reason)."""
    if all(shutil.which(p) or os.path.exists(f"/usr/sbin/{p}") for p in PROGRAMS[scheduler]):
        return None
    if os.geteuid() != 0:
        packages = " ".join(PACKAGES[scheduler])
        return f"{scheduler} is not installed and installing it needs root (apt-get install {packages})"
    if shutil.which("apt-get") is None:
        return f"{scheduler} is not installed and there is no apt-get to install it"
    return None


def ensure_packages(scheduler: str) -> str | None:
    """Install ``scheduler``'s packages if missing; ``None`` on success, else a skip reason."""
    reason = missing_reason(scheduler)
    if reason is not None:
        return reason
    if all(shutil.which(p) or os.path.exists(f"/usr/sbin/{p}") for p in PROGRAMS[scheduler]):
        return None
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    result = subprocess.run(
        ["apt-get", "install", "-y", "-qq", *PACKAGES[scheduler]],
        capture_output=True, text=True, env=env, timeout=600,
    )
    if result.returncode != 0:
        return f"apt-get install {' '.join(PACKAGES[scheduler])} failed: {result.stderr.strip()[-300:]}"
    return None


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """slurmctld and two slurmd (``n1``, ``n2``, two CPUs each) on this host, under ``root``.

    ``nodes`` names other virtual nodes; ``topology`` is a ``topology.conf`` (``SwitchName=...``
    lines) for the ``topology/tree`` plugin, which then gives every task ``SLURM_TOPOLOGY_ADDR``.
    """

    NODES: tuple[str, ...] = ("n1", "n2")

    def __init__(self, root: Path, nodes: tuple[str, ...] | None = None, topology: str | None = None) -> None:
        self.root = root
        if nodes is not None:
            self.NODES = nodes
        self.topology = topology
        self.conf = root / "slurm.conf"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def _write_conf(self) -> None:
        host = socket.gethostname()
        ctld_port, *node_ports = _free_ports(1 + len(self.NODES))
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        nodes = "\n".join(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=2"
            for name, port in zip(self.NODES, node_ports, strict=True)
        )
        plugin = ""
        if self.topology is not None:  # read from beside slurm.conf
            (self.root / "topology.conf").write_text(self.topology)
            plugin = "TopologyPlugin=topology/tree\n"
        self.conf.write_text(
            f"""ClusterName=launchertest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
InactiveLimit=0
KillWait=10
MinJobAge=600
FirstJobId={random.randrange(1000, 2_000_000)}
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool/%n
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd-%n.pid
SlurmctldLogFile={self.root}/log/slurmctld.log
SlurmdLogFile={self.root}/log/slurmd-%n.log
{plugin}{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )

    def start(self, timeout: float = 60) -> None:
        """Start the daemons and wait until every node is idle."""
        self._write_conf()
        log = (self.root / "log" / "daemons.out").open("ab")  # noqa: SIM115 - the daemons keep it
        self.procs.append(subprocess.Popen([_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf)],
                                           stdout=log, stderr=log, env=self.env, start_new_session=True))
        for name in self.NODES:
            (self.root / "spool" / name).mkdir(parents=True, exist_ok=True)
            self.procs.append(subprocess.Popen([_sbin("slurmd"), "-D", "-N", name, "-f", str(self.conf)],
                                               stdout=log, stderr=log, env=self.env, start_new_session=True))
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            result = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                                    env=self.env, timeout=30)
            state = result.stdout + result.stderr
            if result.returncode == 0 and all(f"{n} idle" in state for n in self.NODES):
                return
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead:
                break
            time.sleep(0.3)
        self.stop()
        logs = "".join(p.read_text(errors="replace")[-800:] for p in (self.root / "log").glob("*"))
        raise RuntimeError(f"the Slurm cluster did not start: {state.strip()}\n{logs}")

    def run(self, *args: str, timeout: float = 120, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (``sbatch``, ``srun``...) against this cluster.

        ``env`` (default: ours) is the job's environment too: Slurm exports it to the tasks.
        """
        environ = dict(self.env if env is None else env, SLURM_CONF=str(self.conf))
        return subprocess.run(list(args), capture_output=True, text=True, env=environ, timeout=timeout)

    def wait_job(self, job_id: str, timeout: float = 180) -> dict[str, str]:
        """Wait until the job ends; its ``scontrol show job`` fields."""
        deadline = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            out = self.run("scontrol", "show", "job", "-o", job_id).stdout
            fields = dict(item.split("=", 1) for item in out.split() if "=" in item)
            if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return fields
            time.sleep(0.5)
        raise TimeoutError(f"Slurm job {job_id} did not end in {timeout} s: {fields.get('JobState')}")

    def stop(self) -> None:
        """Cancel the jobs, then kill every daemon this cluster started."""
        if self.procs and self.procs[0].poll() is None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self.run("scancel", "--full", "--partition=debug", timeout=30)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and self.run("squeue", "-h", timeout=30).stdout.strip():
                    time.sleep(0.3)
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
