"""The example distribution of docs/plugins.md, built, pip-installed and used by real jobs.

Every fenced block of the guide whose first line is ``# file: PATH`` is written to PATH in a
source tree; the tree is installed with ``pip install --no-deps --no-build-isolation --target``,
and ``launcher`` runs with ``PYTHONPATH`` pointing there, as for any installed distribution.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from launcher.store.server import StoreServer

from tests.conftest import LAUNCHER, launcher_env, run_launcher

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
_FENCE = re.compile(r"^```([\w+-]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_MARK = re.compile(r"^#\s*file:\s*(\S+)\s*$")


def example_files(text: str) -> dict[str, str]:
    """``{path: content}`` of every fenced block whose first line is ``# file: path``."""
    files: dict[str, str] = {}
    for match in _FENCE.finditer(text):
        body = match.group(2)
        first, _, rest = body.partition("\n")
        mark = _MARK.match(first)
        if mark is None:
            continue
        path = mark.group(1)
        assert path not in files, f"docs/plugins.md has two blocks for {path}"
        files[path] = body
    return files


def has_core_rendezvous() -> bool:
    try:
        from launcher.rendezvous.dynamic import handler_over_store  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("acme-src")
    for path, content in example_files(GUIDE.read_text()).items():
        target = source / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    return source


@pytest.fixture(scope="module")
def site(source_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Where the example distribution is installed (for ``PYTHONPATH``)."""
    target = tmp_path_factory.mktemp("acme-site")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(source_tree)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return str(target)


def test_every_example_file_is_in_the_distribution(source_tree: Path) -> None:
    files = sorted(str(p.relative_to(source_tree)) for p in source_tree.rglob("*") if p.is_file())
    assert files == sorted(
        ["pyproject.toml", "acme_launcher/__init__.py", "acme_launcher/rendezvous.py", "acme_launcher/logs.py",
         "acme_launcher/events.py", "acme_launcher/numa.py", "acme_launcher/devices.py", "acme_launcher/cluster.py",
         "acme_launcher/health.py", "acme_launcher/flags.py", "acme_launcher/topology.py", "tests/test_acme.py"]
    )


def test_installed_plugins_are_listed(site: str) -> None:
    result = run_launcher(["plugins", "--json"], env={"PYTHONPATH": site})
    assert result.returncode == 0, result.stderr
    mine = {(row["kind"], row["name"]) for row in json.loads(result.stdout) if row["distribution"] == "acme-launcher"}
    assert mine == {
        ("rendezvous backend", "acme-store"),
        ("logs specs", "acme-by-rank"),
        ("event handler", "acme-audit"),
        ("numa strategy", "acme-split"),
        ("device provider", "acme"),
        ("cluster environment", "acme-grid"),
        ("health check", "acme-fabric"),
        ("topology source", "acme-inventory"),
    }


# A worker that reports who it is, and whatever else the test asks, as one JSON file per rank.
REPORTER = """
import json, os, sys
report = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_RANK", "ACME_VISIBLE_DEVICES")}
report["cpus"] = sorted(os.sched_getaffinity(0))
if len(sys.argv) > 2 and sys.argv[2] == "allreduce":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    value = torch.tensor([int(os.environ["RANK"]) + 1])
    dist.all_reduce(value)
    report["sum"] = int(value.item())
    dist.destroy_process_group()
print("hello from rank", os.environ["RANK"], flush=True)
print("stderr of rank", os.environ["RANK"], file=sys.stderr, flush=True)
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as out:
    json.dump(report, out)
"""


def _reports(directory: Path) -> dict[int, dict[str, object]]:
    return {int(p.stem): json.loads(p.read_text()) for p in directory.glob("*.json")}


@pytest.fixture
def reporter(tmp_path: Path) -> tuple[str, Path]:
    script = tmp_path / "report.py"
    script.write_text(REPORTER)
    out = tmp_path / "reports"
    out.mkdir()
    return str(script), out


@pytest.mark.skipif(
    not has_core_rendezvous(),
    reason="launcher.rendezvous.dynamic.handler_over_store (the core's rendezvous over a plugin's store) "
    "is not in this checkout yet",
)
def test_rendezvous_backend_example(site: str, reporter: tuple[str, Path]) -> None:
    pytest.importorskip("torch")
    script, out = reporter
    with StoreServer("127.0.0.1", 0) as service:  # the platform team's store service
        command = [
            *LAUNCHER, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "acme-store",
            "--rdzv-endpoint", f"127.0.0.1:{service.port}", "--rdzv-id", f"docs-{uuid.uuid4().hex[:8]}",
            "--local-addr", "127.0.0.1", "--rdzv-conf", "last_call_timeout=1,join_timeout=60",
            "--monitor-interval", "0.5", script, str(out), "allreduce",
        ]
        env = launcher_env({"PYTHONPATH": site})
        agents = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for _ in range(2)]
        outputs = [agent.communicate(timeout=180) for agent in agents]
    for agent, (_, stderr) in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, stderr
    reports = _reports(out)
    assert sorted(reports) == [0, 1]
    assert {r["WORLD_SIZE"] for r in reports.values()} == {"2"}
    assert sorted(str(r["GROUP_RANK"]) for r in reports.values()) == ["0", "1"]
    assert {r["sum"] for r in reports.values()} == {3}


def test_rendezvous_backend_rejects_unknown_keys(site: str, reporter: tuple[str, Path]) -> None:
    script, out = reporter
    result = run_launcher(
        ["--nnodes", "2", "--rdzv-backend", "acme-store", "--rdzv-endpoint", "127.0.0.1:1",
         "--rdzv-conf", "join_timeot=5", script, str(out)],
        env={"PYTHONPATH": site},
    )
    assert result.returncode == 2
    assert "join_timeot" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_logs_specs_example(site: str, reporter: tuple[str, Path], tmp_path: Path) -> None:
    script, out = reporter
    logs = tmp_path / "logs"
    result = run_launcher(
        ["--standalone", "--nproc-per-node", "2", "--logs-specs", "acme-by-rank", "--log-dir", str(logs),
         script, str(out)],
        env={"PYTHONPATH": site},
    )
    assert result.returncode == 0, result.stderr
    [attempt] = logs.glob("*/attempt-0")  # --standalone makes up the run id
    assert (attempt / "rank-0.out").read_text() == "hello from rank 0\n"
    assert (attempt / "rank-1.err").read_text() == "stderr of rank 1\n"
    assert "stderr of rank 1" in result.stderr  # stderr is tee'd to the console
    assert "hello from rank" not in result.stdout


def test_logs_specs_example_needs_a_log_dir(site: str, reporter: tuple[str, Path]) -> None:
    script, out = reporter
    result = run_launcher(["--standalone", "--logs-specs", "acme-by-rank", script, str(out)], env={"PYTHONPATH": site})
    assert result.returncode == 2
    assert "needs --log-dir" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_event_handler_example(site: str, reporter: tuple[str, Path], tmp_path: Path) -> None:
    script, out = reporter
    audit = tmp_path / "audit.log"
    result = run_launcher(
        ["--standalone", "--nproc-per-node", "2", "--event-log-handler", "acme-audit", script, str(out)],
        env={"PYTHONPATH": site, "ACME_AUDIT_LOG": str(audit)},
    )
    assert result.returncode == 0, result.stderr
    types = [line.split(" ")[2] for line in audit.read_text().splitlines()]
    assert types[0] == "rendezvous_started" and types[-1] == "job_succeeded"
    assert "workers_started" in types


def test_event_handler_example_needs_its_setting(site: str, reporter: tuple[str, Path]) -> None:
    script, out = reporter
    result = run_launcher(["--standalone", "--event-log-handler", "acme-audit", script, str(out)],
                          env={"PYTHONPATH": site})
    assert result.returncode == 2
    assert "ACME_AUDIT_LOG" in result.stderr and not list(out.iterdir())


def test_flag_group_example(site: str, reporter: tuple[str, Path], tmp_path: Path) -> None:
    script, out = reporter
    shown = run_launcher(["--help"], env={"PYTHONPATH": site, "COLUMNS": "200"})
    assert shown.returncode == 0 and "Acme audit log (--event-log-handler acme-audit):" in shown.stdout
    assert "--acme-audit-log ACME_AUDIT_LOG" in shown.stdout
    audit = tmp_path / "flag-audit.log"
    result = run_launcher(
        ["--standalone", "--event-log-handler", "acme-audit", "--acme-audit-log", str(audit), script, str(out)],
        env={"PYTHONPATH": site, "ACME_AUDIT_LOG": str(tmp_path / "not-this-one.log")},  # the flag wins
    )
    assert result.returncode == 0, result.stderr
    assert audit.read_text().splitlines()[-1].split(" ")[2] == "job_succeeded"
    assert not (tmp_path / "not-this-one.log").exists()
    for report in out.iterdir():  # the job above ran: no report may appear below
        report.unlink()
    missing = str(tmp_path / "no-such-dir" / "a.log")
    for args, env, source in ((["--acme-audit-log", missing], {}, "--acme-audit-log"),
                              ([], {"ACME_AUDIT_LOG": missing}, "ACME_AUDIT_LOG")):
        refused = run_launcher(["--standalone", "--event-log-handler", "acme-audit", *args, script, str(out)],
                               env={"PYTHONPATH": site, **env})
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert f"launcher: error: {source} " in refused.stderr and "no directory" in refused.stderr
    assert not list(out.iterdir())


def test_numa_strategy_example(site: str, reporter: tuple[str, Path]) -> None:
    script, out = reporter
    allowed = sorted(os.sched_getaffinity(0))
    nproc = min(2, len(allowed))
    result = run_launcher(
        ["--standalone", "--nproc-per-node", str(nproc), "--numa-binding", "acme-split", "--numa-fallback", "error",
         script, str(out)],
        env={"PYTHONPATH": site},
    )
    assert result.returncode == 0, result.stderr
    sets = [set(report["cpus"]) for report in _reports(out).values()]  # type: ignore[call-overload]
    assert len(sets) == nproc and all(sets)
    assert set().union(*sets) <= set(allowed)
    assert sum(len(s) for s in sets) == len(set().union(*sets)), f"workers share CPUs: {sets}"


@pytest.fixture
def acme_devices(tmp_path: Path) -> dict[str, str]:
    devices = tmp_path / "dev"
    devices.mkdir()
    for number in range(3):
        (devices / f"acme{number}").touch()
    return {"ACME_DEVICE_DIR": str(devices)}


def test_device_provider_example(site: str, reporter: tuple[str, Path], acme_devices: dict[str, str]) -> None:
    script, out = reporter
    result = run_launcher(["--standalone", "--nproc-per-node", "acme", "--virtual-local-rank", script, str(out)],
                          env={"PYTHONPATH": site, **acme_devices})
    assert result.returncode == 0, result.stderr
    reports = _reports(out)
    assert {rank: (r["LOCAL_RANK"], r["ACME_VISIBLE_DEVICES"]) for rank, r in reports.items()} == {
        0: ("0", "0"), 1: ("0", "1"), 2: ("0", "2")}


def test_device_provider_example_under_auto(
    site: str, reporter: tuple[str, Path], acme_devices: dict[str, str]
) -> None:
    script, out = reporter
    result = run_launcher(["--standalone", "--nproc-per-node", "auto", script, str(out)],
                          env={"PYTHONPATH": site, "ACME_VISIBLE_DEVICES": "2,0", "CUDA_VISIBLE_DEVICES": "",
                               **acme_devices})
    assert result.returncode == 0, result.stderr
    assert sorted(_reports(out)) == [0, 1]


def test_switches(site: str, reporter: tuple[str, Path], acme_devices: dict[str, str]) -> None:
    script, out = reporter
    blocked = run_launcher(["--standalone", "--nproc-per-node", "acme", script, str(out)],
                           env={"PYTHONPATH": site, "LAUNCHER_BLOCK_PLUGINS": "acme-devices", **acme_devices})
    assert blocked.returncode == 2 and "unknown device provider 'acme'" in blocked.stderr, blocked.stderr
    allowed = run_launcher(["plugins", "--json"], env={"PYTHONPATH": site, "LAUNCHER_PLUGINS": "acme-logs"})
    names = {row["name"] for row in json.loads(allowed.stdout) if row["distribution"] == "acme-launcher"}
    assert names == {"acme-by-rank"}
    none = run_launcher(["plugins", "--json"], env={"PYTHONPATH": site, "LAUNCHER_DISABLE_PLUGIN_AUTOLOAD": "1"})
    rows = json.loads(none.stdout)
    assert not [row for row in rows if row["distribution"] == "acme-launcher"]
    assert any(row["name"] == "c10d" for row in rows), "the core's own plugins always load"


def test_the_examples_conformance_tests_pass(site: str, source_tree: Path) -> None:
    """The guide's tests/test_acme.py, run by pytest as the distribution's own tests would be."""
    env = launcher_env({"PYTHONPATH": site})
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/test_acme.py"],
        cwd=source_tree, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, summary


def _grid_job_with_a_free_port() -> str:
    """A grid job id whose derived port (15000 + id mod 15000) is free on loopback now."""
    import random
    import socket

    for _ in range(50):
        job = str(random.randrange(1, 15000))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", 15000 + int(job)))
            except OSError:
                continue
        return job
    pytest.skip("no free port in 15000..29999")


def test_cluster_environment_example(site: str, reporter: tuple[str, Path]) -> None:
    script, out = reporter
    job = _grid_job_with_a_free_port()
    nodes = [
        subprocess.Popen(
            [*LAUNCHER, "--nproc-per-node", "1", script, str(out)],
            env=launcher_env({"PYTHONPATH": site, "GRID_JOB": job, "GRID_NODES": "2",
                              "GRID_NODE_INDEX": str(index), "GRID_HEAD": "127.0.0.1"}),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for index in range(2)
    ]
    results = [node.communicate(timeout=120) for node in nodes]
    for node, (_, err) in zip(nodes, results, strict=True):
        assert node.returncode == 0, err
    reports = _reports(out)
    assert sorted(reports) == [0, 1] and {r["GROUP_RANK"] for r in reports.values()} == {"0", "1"}
    assert f"Acme grid job {job}: node 1 of 2, static rendezvous at 127.0.0.1:{15000 + int(job)}" in results[1][1]


def test_health_check_example(site: str, reporter: tuple[str, Path], tmp_path: Path) -> None:
    script, out = reporter
    args = ["--standalone", "--health-checks", "acme-fabric,disk", script, str(out)]
    missing = str(tmp_path / "fabric.sock")
    sick = run_launcher(args, env={"PYTHONPATH": site, "ACME_FABRIC_SOCKET": missing})
    assert sick.returncode == 69, sick.stderr
    assert f"health check 'acme-fabric' failed: the fabric daemon does not answer on {missing}" in sick.stderr
    assert not _reports(out)
    import socket

    with socket.socket(socket.AF_UNIX) as server:
        server.bind(missing)
        server.listen()
        fine = run_launcher(args, env={"PYTHONPATH": site, "ACME_FABRIC_SOCKET": missing})
    assert fine.returncode == 0, fine.stderr
    assert sorted(_reports(out)) == [0]


def test_topology_source_example(site: str, reporter: tuple[str, Path], tmp_path: Path) -> None:
    script, out = reporter
    inventory = tmp_path / "inventory.json"
    inventory.write_text('{"127.0.0.1": {"pod": "pod2", "rack": "rack7"}}')
    args = ["--standalone", "--local-addr", "127.0.0.1", "--topology", "acme-inventory", script, str(out)]
    placed = run_launcher(args, env={"PYTHONPATH": site, "ACME_INVENTORY": str(inventory), "LOGLEVEL": "INFO"})
    assert placed.returncode == 0, placed.stderr
    assert "this node is at pod2.rack7" in placed.stderr, placed.stderr
    assert sorted(_reports(out)) == [0]
    inventory.write_text("{}")
    refused = run_launcher(args, env={"PYTHONPATH": site, "ACME_INVENTORY": str(inventory)})
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "--topology acme-inventory has no path for this node: 127.0.0.1" in refused.stderr
