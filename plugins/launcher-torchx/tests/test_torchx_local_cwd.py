"""Real jobs through TorchX's CLI and its ``local_cwd`` scheduler, with the plugin installed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torchx", reason="torchx is not installed (pip install torchx)")

from torchx_plugin_support import free_port, results, run_torchx  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

_APP_HANDLE = re.compile(r"^local_cwd://torchx/(?P<app_id>\S+)$", re.MULTILINE)


def app_id(stdout: str) -> str:
    match = _APP_HANDLE.search(stdout)
    assert match, stdout
    return match["app_id"]


def test_components_are_listed_next_to_torchx_builtins(installed_site: Path, shim_bin: Path, tmp_path: Path) -> None:
    result = run_torchx(["builtins"], site=installed_site, bin_dir=shim_bin, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    listed = set(re.findall(r"^\s*\d+\.\s+(\S+)$", result.stdout, re.MULTILINE))
    assert {"launcher.ddp", "launcher.spmd"} <= listed
    # Registering components must not hide TorchX's own.
    assert {"dist.ddp", "dist.spmd", "utils.echo"} <= listed


def test_invalid_j_fails_like_dist_ddp(installed_site: Path, shim_bin: Path, job_dir: Path) -> None:
    last_lines = []
    for component in ("dist.ddp", "launcher.ddp"):
        result = run_torchx(
            ["run", "-s", "local_cwd", component, "-j", "2y3", "--script", "ar.py"],
            site=installed_site, bin_dir=shim_bin, cwd=job_dir, timeout=60,
        )  # fmt: skip
        assert result.returncode == 1
        last_lines.append(result.stderr.strip().splitlines()[-1])
    assert last_lines[0] == last_lines[1]
    assert last_lines[1] == "ValueError: Invalid format for -j, usage example: 1:2x4 or 1x4 or 4. Given: 2y3"


@pytest.mark.parametrize(
    "component_args",
    [["launcher.ddp", "-j", "1x2", "--script", "ar.py"],
     ["launcher.spmd", "-j", "1x2", "-h", "cpu.small", "-m", "ar"]],
    ids=["ddp-script", "spmd-module"],
)  # fmt: skip
def test_one_node_two_workers(installed_site: Path, shim_bin: Path, job_dir: Path, component_args: list[str]) -> None:
    result = run_torchx(
        ["run", "-s", "local_cwd", "-cfg", f"log_dir={job_dir / 'logs'}", *component_args],
        site=installed_site, bin_dir=shim_bin, cwd=job_dir,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Job finished: SUCCEEDED" in output
    found = sorted(results(output), key=lambda r: r["rank"])
    assert [(r["rank"], r["env_rank"], r["world"], r["sum"]) for r in found] == [(0, 0, 2, 3.0), (1, 1, 2, 3.0)]
    this_app = app_id(result.stdout)
    assert {r["run_id"] for r in found} == {this_app}  # --rdzv-id is TorchX's app id
    assert {r["role"] for r in found} == {"ar"}
    assert all(r["agent"][1:3] == ["-m", "launcher"] for r in found), found  # launcher, not torchrun
    # The launcher kept the workers' logs under TorchX's log directory (PET_LOG_DIR).
    assert list((job_dir / "logs" / "torchx" / this_app / "torchelastic").rglob("stdout.log"))


def test_two_nodes_two_workers_each(installed_site: Path, shim_bin: Path, job_dir: Path) -> None:
    result = run_torchx(
        ["run", "-s", "local_cwd", "launcher.ddp", "-j", "2x2", "--rdzv_port", str(free_port()), "--script", "ar.py"],
        site=installed_site, bin_dir=shim_bin, cwd=job_dir,
    )  # fmt: skip
    output = result.stdout + result.stderr
    found = sorted(results(output), key=lambda r: r["rank"])
    # Two agents (TorchX replicas ar/0 and ar/1) met through c10d at $TORCHX_RANK0_HOST:rdzv_port
    # and their four workers all-reduced over gloo.
    assert [(r["rank"], r["world"], r["sum"]) for r in found] == [(rank, 4, 10.0) for rank in range(4)], output
    assert {r["local_rank"] for r in found} == {0, 1}
    assert {r["run_id"] for r in found} == {app_id(result.stdout)}
    if result.returncode != 0 and re.search(r"rendezvous failed: .*the store failed", output):
        pytest.xfail(
            "core c10d rendezvous (in progress): after the job succeeded, the agent serving the c10d store "
            "exited while the other agent still used the store, so that agent exits 1 with 'rendezvous "
            "failed: ... the store failed' and TorchX marks the job FAILED"
        )
    assert result.returncode == 0, output
    assert "Job finished: SUCCEEDED" in output


def test_failure_report_reaches_the_torchx_log(installed_site: Path, shim_bin: Path, job_dir: Path) -> None:
    logs = job_dir / "logs"
    result = run_torchx(
        ["run", "-s", "local_cwd", "-cfg", f"log_dir={logs}", "launcher.ddp", "-j", "1x2", "--script", "fail.py"],
        site=installed_site, bin_dir=shim_bin, cwd=job_dir,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Job finished: FAILED" in output
    # TorchX streams the replica's log, prefixed with "fail/0", until it takes the app for finished,
    # which can be before the launcher printed its report (seen once under load): only the worker's
    # own lines are sure to be streamed. The whole report is in the log file, checked below.
    assert re.search(r"^fail/0 \[fail1\]:RuntimeError: rank one gives up: launcher-torchx failure test$", output,
                     re.MULTILINE), output
    # And it is in TorchX's own log files for the replica.
    stderr_log = logs / "torchx" / app_id(result.stdout) / "fail" / "0" / "stderr.log"
    text = stderr_log.read_text()
    assert "Root cause" in text
    assert re.search(r"rank\s*:\s*1 \(local rank 1, role fail\)", text), text
    assert "exit code 1" in text
