"""Preemption under real Slurm: examples/preemptible_job.sh, preempted mid-run, saves on every
rank, is requeued (by Slurm, or by launcher's --requeue), resumes from its checkpoint and ends
COMPLETED with the final weights of an uninterrupted run.

The job script is submitted word for word; the two virtual nodes n1 and n2 share this host.
A requeued job waits about two minutes before it is eligible again (Slurm lets the old job's
credentials expire); the tests let it start sooner with ``scontrol update StartTime=now+3``.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from tests.clusters.schedulers import SlurmCluster
from tests.clusters.test_schedulers import _path_env

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB = EXAMPLES / "preemptible_job.sh"
TRAIN = EXAMPLES / "preemptible_train.py"

pytestmark = pytest.mark.timeout(400)


def _submit(cluster: SlurmCluster, tmp_path: Path) -> tuple[str, Path]:
    """sbatch the documented job script (the training script beside it); the job id and its output."""
    shutil.copy(TRAIN, tmp_path / TRAIN.name)
    result = cluster.run("sbatch", "--parsable", f"--chdir={tmp_path}", str(JOB), env=_path_env())
    assert result.returncode == 0, result.stderr
    job = result.stdout.strip().split(";")[0]
    return job, tmp_path / f"preemptible-{job}.out"


def _fields(cluster: SlurmCluster, job: str) -> dict[str, str]:
    out = cluster.run("scontrol", "show", "job", "-o", job).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def _wait_for(what: str, check, timeout: float, detail) -> None:  # noqa: ANN001 - callables of the tests below
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{detail()}")
        time.sleep(0.3)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _final_weights(output: str) -> str:
    found = re.findall(r"final weights: (.*)", output)
    assert len(found) == 1, output
    return found[0]


def _preempt_and_resume(cluster: SlurmCluster, tmp_path: Path, preempt) -> tuple[dict[str, str], str]:  # noqa: ANN001
    """Run the job, ``preempt(job)`` once it is training, let the requeued job start; its end and output."""
    job, out = _submit(cluster, tmp_path)
    _wait_for("the job to train", lambda: "step 100" in _read(out), 120, lambda: _read(out))
    preempt(job)
    _wait_for("the job to be requeued", lambda: _fields(cluster, job).get("JobState") == "PENDING", 60,
              lambda: f"{_fields(cluster, job)}\n{_read(out)}")
    # Not "now": slurmd refuses a job whose credential is from the second its old one was revoked in.
    assert cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now+3").returncode == 0
    fields = cluster.wait_job(job, timeout=180)
    return fields, _read(out)


@pytest.fixture(scope="module")
def uninterrupted(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The final weights of the same job, never preempted."""
    job, out = _submit(slurm_cluster, tmp_path_factory.mktemp("uninterrupted"))
    fields = slurm_cluster.wait_job(job, timeout=180)
    assert fields["JobState"] == "COMPLETED", _read(out)
    return _final_weights(_read(out))


def _check_preempted_and_resumed(output: str, fields: dict[str, str], uninterrupted: str, grace: int) -> None:
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", (fields, output)
    # The first attempt: every rank saved at the same step, and both nodes said "preempted".
    saved = re.findall(r"rank (\d): preempted at step (\d+), checkpoint saved", output)
    assert sorted(rank for rank, _ in saved) == ["0", "1", "2", "3"], output
    [step] = {step for _, step in saved}
    reports = re.findall(r"node \S+ \(node (\d)\): job preempted \(SIG\w+ received here\); 2 of 2 local worker\(s\) "
                         rf"exited cleanly within the {grace} s grace; exit status 75", output)
    assert sorted(reports) == ["0", "1"], output
    # The second: every rank knows it is a continuation, and goes on from the checkpoint.
    resumed = re.findall(rf"rank (\d): resuming at step {step} \(requeued 1 time\(s\) before\)", output)
    assert sorted(resumed) == ["0", "1", "2", "3"], output
    assert _final_weights(output) == uninterrupted, output
    assert "Traceback" not in output, output


def test_a_job_slurm_requeues_saves_resumes_and_ends_as_if_never_interrupted(
    slurm_cluster: SlurmCluster, tmp_path: Path, uninterrupted: str
) -> None:
    """Preemption with requeue, as an administrator's ``scontrol requeue`` does it: SIGTERM to every task."""
    def requeue(job: str) -> None:
        assert slurm_cluster.run("scontrol", "requeue", job).returncode == 0

    fields, output = _preempt_and_resume(slurm_cluster, tmp_path, requeue)
    # Slurm kills the job KillWait (10 s here) after its SIGTERM: the 60 s grace is cut to that.
    _check_preempted_and_resumed(output, fields, uninterrupted, grace=10)
    assert output.count("the grace is 10 s, not 60 s: Slurm's KillWait ends the job then") == 2, output
    assert "SIGTERM received here" in output
    # Slurm requeued it already: launcher's --requeue must not queue a second restart.
    assert re.search(rf"not requeued again: Slurm already requeued job {fields['JobId']} \(restart 1\)", output), output


def test_the_time_limit_signal_saves_requeues_once_and_resumes(
    slurm_cluster: SlurmCluster, tmp_path: Path, uninterrupted: str
) -> None:
    """``--signal=USR1@120``'s signal, sent now with ``scancel --signal``: launcher requeues the job itself."""
    def signal_usr1(job: str) -> None:
        assert slurm_cluster.run("scancel", "--signal=USR1", job).returncode == 0

    fields, output = _preempt_and_resume(slurm_cluster, tmp_path, signal_usr1)
    _check_preempted_and_resumed(output, fields, uninterrupted, grace=60)  # no time limit: the flag's grace
    assert "the grace is" not in output, output
    assert "SIGUSR1 received here" in output
    assert len(re.findall(rf"requeued Slurm job {fields['JobId']} \(restart 1\)", output)) == 1, output
