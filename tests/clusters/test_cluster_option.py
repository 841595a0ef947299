"""``--cluster``: what the environment fills, what the flags keep, and the one-line errors.

Real launcher processes: two "pods" of a Kubeflow PyTorchJob (only the operator's variables)
make one 4-rank gloo job; the rest checks the merge rules through the command line.
"""

from __future__ import annotations

import argparse
import logging
import socket
import subprocess
from pathlib import Path

import pytest
from launcher.clusters.apply import apply_cluster
from launcher.errors import UsageError
from launcher.options import parse_args
from launcher.plugins.manager import get_plugin_manager

from tests.clusters.samples import dump, kubeflow_job, lsf_job
from tests.conftest import LAUNCHER, launcher_env, run_launcher


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _apply(argv: list[str], environ: dict[str, str]) -> argparse.Namespace:
    args = parse_args([*argv, "train.py"])
    apply_cluster(args, get_plugin_manager(environ={}), environ)
    return args


SLURM_NODE_1 = dict(dump("slurm-batch-srun")[1])


def test_slurm_fills_every_missing_flag() -> None:
    args = _apply([], SLURM_NODE_1)
    assert (args.nnodes, args.node_rank, args.rdzv_backend, args.master_addr, args.master_port, args.rdzv_id) == (
        "2", "1", "static", "127.0.0.1", "15003", "slurm-3.0")


def test_explicit_flags_and_pet_variables_win(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PET_RDZV_ID", "mine")  # read when the parser is built
    with caplog.at_level(logging.WARNING):
        args = _apply(["--nnodes", "4", "--master-port", "12345"], {**SLURM_NODE_1, "PET_RDZV_ID": "mine"})
    assert (args.nnodes, args.master_port, args.node_rank) == ("4", "12345", "1")
    assert args.rdzv_id == "mine"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("--nnodes 4" in w and "2 nodes" in w and "SLURM_STEP_NUM_NODES" in w for w in warnings), warnings


def test_a_contradicting_node_rank_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        args = _apply(["--node-rank", "0"], SLURM_NODE_1)
    assert args.node_rank == "0"
    assert any("--node-rank 0" in r.getMessage() and "node 1" in r.getMessage() for r in caplog.records)


def test_c10d_chosen_on_the_command_line_gets_the_endpoint() -> None:
    args = _apply(["--rdzv-backend", "c10d"], SLURM_NODE_1)
    assert (args.rdzv_backend, args.rdzv_endpoint, args.nnodes) == ("c10d", "127.0.0.1:15003", "2")


def test_an_elastic_range_gets_c10d() -> None:
    args = _apply(["--nnodes", "1:2"], SLURM_NODE_1)
    assert (args.rdzv_backend, args.rdzv_endpoint, args.nnodes) == ("c10d", "127.0.0.1:15003", "1:2")


def test_topology_gets_c10d_whose_closer_places_the_nodes() -> None:
    """Slurm's own choice is static (ranks from SLURM_NODEID); --topology needs the round ordered."""
    args = _apply(["--topology", "slurm"], SLURM_NODE_1)
    assert (args.rdzv_backend, args.rdzv_endpoint, args.nnodes) == ("c10d", "127.0.0.1:15003", "2")
    args = _apply(["--topology", "slurm", "--master-port", "12345"], SLURM_NODE_1)  # static flags: static
    assert (args.rdzv_backend, args.node_rank) == ("static", "1")


def test_a_multi_node_job_shows_whole_lines_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler merges every node's output (mpirun through a pty per node): one node's live
    line would be torn by the others', so ``auto`` gives pipes; the flag and PET_WORKER_TTY decide."""
    assert _apply([], SLURM_NODE_1).worker_tty == "never"
    assert _apply(["--worker-tty", "always"], SLURM_NODE_1).worker_tty == "always"
    assert _apply(["--worker-tty", "auto"], SLURM_NODE_1).worker_tty == "auto"
    assert _apply(["--nnodes", "1"], SLURM_NODE_1).worker_tty == "auto"  # one node: its terminal is its own
    monkeypatch.setenv("PET_WORKER_TTY", "auto")  # read when the parser is built
    assert _apply([], {**SLURM_NODE_1, "PET_WORKER_TTY": "auto"}).worker_tty == "auto"


def test_none_changes_nothing() -> None:
    plain = parse_args(["train.py"])
    args = _apply(["--cluster", "none"], SLURM_NODE_1)
    for dest in ("nnodes", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "master_addr", "master_port",
                 "nproc_per_node"):
        assert getattr(args, dest) == getattr(plain, dest), dest


def test_standalone_is_left_alone() -> None:
    args = _apply(["--standalone"], SLURM_NODE_1)
    assert args.nnodes == "1:1" and args.rdzv_backend == "static"


def test_no_scheduler_changes_nothing() -> None:
    args = _apply([], {"HOME": "/root"})
    assert (args.nnodes, args.rdzv_backend, args.rdzv_id) == ("1:1", "static", "none")


def test_naming_an_absent_scheduler_is_an_error() -> None:
    with pytest.raises(UsageError, match="--cluster slurm: this is not a slurm job here"):
        _apply(["--cluster", "slurm"], {"HOME": "/root"})


def test_two_launchers_per_node_stop_with_the_way_to_call_it() -> None:
    with pytest.raises(UsageError, match="srun --nodes=2 --ntasks=2 --ntasks-per-node=1"):
        _apply([], dump("slurm-srun-two-tasks-per-node")[1])
    with pytest.raises(UsageError, match="ppr:1:node"):
        _apply([], dump("openmpi-in-salloc-two-per-node")[0])


def test_explicit_flags_get_past_a_problem() -> None:
    args = _apply(["--nnodes", "4", "--node-rank", "3", "--master-addr", "head"],
                  dump("slurm-srun-two-tasks-per-node")[3])
    assert (args.nnodes, args.node_rank, args.master_addr) == ("4", "3", "head")


def test_mpi_in_slurm_prefers_the_mpi_ranks() -> None:
    args = _apply([], dump("slurm-srun-pmi2")[1])
    assert (args.rdzv_backend, args.nnodes, args.rdzv_endpoint, args.rdzv_id) == (
        "c10d", "2", "127.0.0.1:15005", "slurm-5")


def test_lsf_fills_nproc_from_the_slots() -> None:
    # This host is the job's only host (LSF names hosts, so the job is built around our name).
    env = lsf_job((socket.gethostname(),), slots=3)[0]
    args = _apply([], env)
    assert (args.nnodes, args.nproc_per_node, args.rdzv_id) == ("1", "3", "lsf-4711")
    explicit = _apply(["--nproc-per-node", "2"], env)
    assert explicit.nproc_per_node == "2"


def test_unknown_name_is_one_line_listing_names(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit(9)\n")
    result = run_launcher(["--cluster", "sge", str(script)])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown --cluster 'sge'" in lines[0], result.stderr
    for name in ("auto", "none", "slurm", "openmpi", "mpich", "pmix", "lsf", "kubeflow"):
        assert name in lines[0]
    via_env = run_launcher([str(script)], env={"PET_CLUSTER": "sge"})
    assert via_env.returncode == 2 and "unknown --cluster 'sge'" in via_env.stderr


def test_kubeflow_pods_make_one_job(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "value = torch.tensor([float(os.environ['RANK']) + 1])\n"
        "dist.all_reduce(value)\n"
        "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'sum', int(value.item()), flush=True)\n"
        # Without it gloo may abort a worker at exit ("terminate called without an active exception").
        "dist.destroy_process_group()\n"
    )
    port = _free_port()
    pods = [
        subprocess.Popen([*LAUNCHER, "--nproc-per-node", "2", str(script)], env=launcher_env(pod),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for pod in kubeflow_job(2, master="127.0.0.1", port=port)
    ]
    outputs = []
    for pod in pods:
        out, err = pod.communicate(timeout=180)
        outputs.append((pod.returncode, out, err))
    for code, _, err in outputs:
        assert code == 0, err
    text = "".join(out for _, out, _ in outputs)
    assert sorted(line.split()[1] for line in text.splitlines() if "sum 10" in line) == ["0", "1", "2", "3"], text
    errors = "".join(err for _, _, err in outputs)
    assert "Kubeflow PyTorchJob at 127.0.0.1: node 1 of 2" in errors, errors
    assert f"static rendezvous at 127.0.0.1:{port}" in errors
