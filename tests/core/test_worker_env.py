"""Workers get exactly torchrun's environment, so torch.distributed works unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import launcher_env, run_launcher

DUMP = """
import json, os, sys
out = sys.argv[1]
with open(os.path.join(out, os.environ["LOCAL_RANK"] + ".json"), "w") as f:
    json.dump(dict(os.environ), f)
"""

#: Variables whose values depend on the run (ports, ids, paths) rather than on the launcher.
RUN_SPECIFIC = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "MASTER_ADDR"}
TORCHRUN_KEYS = {
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS",
}


def _dump(cmd, tmp_path, name, write_script):
    out = tmp_path / name
    out.mkdir()
    script = write_script("dump.py", DUMP)
    result = subprocess.run([*cmd, script, str(out)], env=launcher_env({"MARKER_VAR": "kept"}),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return {int(p.split(".")[0]): json.loads((out / p).read_text()) for p in os.listdir(out)}


def test_environment_matches_torchrun(tmp_path, write_script):
    flags = ["--standalone", "--nproc-per-node", "3", "--max-restarts", "2"]
    ours = _dump([sys.executable, "-m", "launcher", *flags], tmp_path, "ours", write_script)
    torchrun = _dump([sys.executable, "-m", "torch.distributed.run", *flags], tmp_path, "torchrun", write_script)
    assert sorted(ours) == sorted(torchrun) == [0, 1, 2]
    for rank in ours:
        mine, theirs = ours[rank], torchrun[rank]
        assert set(theirs) >= TORCHRUN_KEYS
        # Every variable torchrun sets is set, with the same value unless it is run-specific.
        added_by_torchrun = {k for k in theirs if k not in os.environ or k in TORCHRUN_KEYS}
        for key in added_by_torchrun:
            assert key in mine, key
            if key not in RUN_SPECIFIC:
                assert mine[key] == theirs[key], (key, mine[key], theirs[key])
        # And nothing torchrun does not set, beyond what the launcher inherited.
        # (but the job's token, by which every process of the job is found at its end).
        extra = {k for k in mine if k not in theirs} - {"LAUNCHER_JOB_TOKEN"}
        assert not extra, extra
        assert len(mine["LAUNCHER_JOB_TOKEN"]) == 32
        assert mine["MARKER_VAR"] == "kept"
        assert mine["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert mine["TORCHELASTIC_ERROR_FILE"].endswith(f"/{rank}/error.json")


def test_rank_values_for_four_workers(tmp_path, write_script):
    envs = _dump([sys.executable, "-m", "launcher", "--standalone", "--nproc-per-node", "4", "--role", "trainer"],
                 tmp_path, "four", write_script)
    for rank, env in envs.items():
        assert env["RANK"] == env["LOCAL_RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "4"
        assert env["GROUP_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "1"
        assert env["ROLE_NAME"] == "trainer"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["OMP_NUM_THREADS"] == "1"
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_omp_num_threads_kept_when_set(tmp_path, write_script):
    out = tmp_path / "omp"
    out.mkdir()
    script = write_script("dump.py", DUMP)
    result = run_launcher(["--standalone", "--nproc-per-node", "2", script, str(out)], env={"OMP_NUM_THREADS": "3"})
    assert result.returncode == 0
    assert json.loads((out / "0.json").read_text())["OMP_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in result.stderr


def test_omp_warning_when_unset(tmp_path, write_script):
    out = tmp_path / "omp"
    out.mkdir()
    result = run_launcher(["--standalone", "--nproc-per-node", "2", write_script("d.py", DUMP), str(out)])
    assert result.returncode == 0
    assert "OMP_NUM_THREADS=1" in result.stderr


@pytest.mark.parametrize(
    ("env", "expected_workers"),
    [({"PET_NPROC_PER_NODE": "3", "PET_STANDALONE": "1"}, 3), ({"PET_NPROC_PER_NODE": "2", "PET_STANDALONE": ""}, 2)],
)
def test_pet_environment_fallbacks(tmp_path, write_script, env, expected_workers):
    out = tmp_path / "pet"
    out.mkdir()
    # PET_STANDALONE="" (as Kubeflow sets it) means off: the static backend on a free master port.
    extra = dict(env)
    if extra.get("PET_STANDALONE") == "":
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            extra["PET_MASTER_PORT"] = str(probe.getsockname()[1])
    result = run_launcher([write_script("d.py", DUMP), str(out)], env=extra)
    assert result.returncode == 0, result.stderr
    assert len(os.listdir(out)) == expected_workers


def test_flag_overrides_pet_variable(tmp_path, write_script):
    out = tmp_path / "o"
    out.mkdir()
    result = run_launcher(["--standalone", "--nproc_per_node", "1", write_script("d.py", DUMP), str(out)],
                          env={"PET_NPROC_PER_NODE": "3"})
    assert result.returncode == 0, result.stderr
    assert os.listdir(out) == ["0.json"]


def test_is_torchelastic_launched_and_record(tmp_path, write_script):
    script = write_script(
        "torch_check.py",
        """
        import torch.distributed as dist
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def main():
            assert dist.is_torchelastic_launched()
            print("launched ok")

        main()
        """,
    )
    result = run_launcher(["--standalone", "--nproc-per-node", "1", script], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "launched ok" in result.stdout
