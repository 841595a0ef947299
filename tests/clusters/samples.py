"""Sample jobs for the cluster tests: real environment dumps (``data/``) and documented variables.

``data/*.json`` were captured on Debian 12 (Slurm 22.05.8 with two virtual nodes ``n1``/``n2``,
Open MPI 4.1.4, MPICH 4.0.2; ``slurm-srun-pmix`` also needs ``libpmix-dev``, which Slurm's PMIx plugin
loads, and ``TmpFS=DIR/%n`` so that the two virtual slurmds do not share PMIx's directory): ``nodes``
holds, per launcher, the scheduler's variables it saw.
LSF and Kubeflow have no packages here: their jobs are built from the documented variables.
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


def dump(name: str) -> list[dict[str, str]]:
    """The environments of the launchers of captured job ``name``."""
    return json.loads((DATA / f"{name}.json").read_text())["nodes"]


def dump_names() -> list[str]:
    return sorted(path.stem for path in DATA.glob("*.json"))


def kubeflow_job(pods: int = 2, master: str = "pytorch-mnist-master-0", port: int = 23456) -> list[dict[str, str]]:
    """What the training operator sets in each pod of a PyTorchJob without an elastic policy."""
    return [
        {
            "MASTER_ADDR": master, "MASTER_PORT": str(port), "WORLD_SIZE": str(pods), "RANK": str(rank),
            "PYTHONUNBUFFERED": "0", "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
        }
        for rank in range(pods)
    ]


def lsf_job(hosts: tuple[str, ...] = ("hostA", "hostB"), slots: int = 4, job: str = "4711") -> list[dict[str, str]]:
    """LSF's variables on each host of a job (``bsub -n 8 -R span[ptile=4]``), ``HOST`` naming the host."""
    mcpu = " ".join(f"{host} {slots}" for host in hosts)
    return [
        {"LSB_JOBID": job, "LSB_MCPU_HOSTS": mcpu, "LSB_HOSTS": " ".join(h for h in hosts for _ in range(slots)),
         "LSB_JOBNAME": "train", "LSF_BINDIR": "/opt/lsf/bin", "HOST": host}
        for host in hosts
    ]
