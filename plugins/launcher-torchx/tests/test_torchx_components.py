"""The components' AppDefs, without running a job: parameters, macros, errors, TorchX's own rules."""

from __future__ import annotations

import inspect
import os
import shlex
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torchx", reason="torchx is not installed (pip install torchx)")

import torchx_plugin_support  # noqa: E402,F401  (puts the plugin's source on sys.path)
from launcher_torchx import components  # noqa: E402
from torchx import specs  # noqa: E402
from torchx.components import dist  # noqa: E402
from torchx.specs.file_linter import validate  # noqa: E402
from torchx.specs.finder import ModuleComponentsFinder  # noqa: E402


def command_words(app: specs.AppDef, **macro_values: str) -> list[str]:
    """The agent's command line after TorchX's macro substitution, split as the shell would (unexpanded)."""
    values = specs.macros.Values(
        img_root="", app_id=macro_values.get("app_id", "app-1"),
        replica_id=macro_values.get("replica_id", "0"), rank0_env=macro_values.get("rank0_env", "RANK0_HOST"),
    )  # fmt: skip
    role = values.apply(app.roles[0])
    assert role.entrypoint == "bash" and role.args[0] == "-c"
    assert role.args[1].startswith("exec ")
    return shlex.split(role.args[1])[1:]


def flag(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_single_node_job_uses_a_free_local_port_and_runs_launcher() -> None:
    app = components.ddp("--lr", "0.1", script="train.py", j="1x2")
    role = app.roles[0]
    words = command_words(app, app_id="train-xyz")
    assert words[:3] == ["python", "-m", "launcher"]
    assert flag(words, "--rdzv-backend") == "c10d"
    assert flag(words, "--rdzv-endpoint") == "localhost:0"
    assert flag(words, "--rdzv-id") == "train-xyz"
    assert flag(words, "--nnodes") == "1"
    assert flag(words, "--nproc-per-node") == "2"
    assert flag(words, "--tee") == "3"
    assert flag(words, "--role") == "train"
    assert words[-3:] == ["train.py", "--lr", "0.1"]
    assert "torchrun" not in role.args[1]
    assert app.name == "train" and role.name == "train"
    assert (role.min_replicas, role.num_replicas) == (1, 1)
    assert role.resource == specs.resource(cpu=2, gpu=0, memMB=1024)
    assert role.port_map == {"c10d": 29500}
    assert role.env["TORCHX_TRACKING_EXPERIMENT_NAME"] == "default-experiment"
    assert role.env["LOGLEVEL"] == os.environ.get("LOGLEVEL", "WARNING")  # the launcher's log level, as dist.ddp


def test_multi_node_endpoint_is_the_schedulers_rank0_host(tmp_path: Path) -> None:
    app = components.ddp(m="pkg.trainer", j="1:3x4", rdzv_port=29411)
    role = app.roles[0]
    assert (role.min_replicas, role.num_replicas) == (1, 3)
    assert role.name == "trainer"
    words = command_words(app, rank0_env="MY_SCHEDULER_HOST0")
    assert flag(words, "--nnodes") == "1:3"
    assert flag(words, "--rdzv-endpoint") == "${MY_SCHEDULER_HOST0:=localhost}:29411"
    assert words[-2:] == ["-m", "pkg.trainer"]

    # What the shell makes of it on a replica: a stand-in "python" prints the agent's argv.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    values = specs.macros.Values(img_root="", app_id="app-9", replica_id="2", rank0_env="MY_SCHEDULER_HOST0")
    script = values.apply(role).args[1]
    cases = (("node-0.example", "node-0.example:29411"), ("", "localhost:29411"), (None, "localhost:29411"))
    for host, expected in cases:
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
        if host is not None:
            env["MY_SCHEDULER_HOST0"] = host
        argv = subprocess.run(
            ["bash", "-c", script], env=env, capture_output=True, text=True, check=True, timeout=10
        ).stdout.splitlines()
        assert argv[argv.index("--rdzv-endpoint") + 1] == expected
        assert argv[argv.index("--rdzv-id") + 1] == "app-9"


def test_static_backend_passes_the_replica_id_as_node_rank() -> None:
    app = components.ddp(script="train.py", j="2x1", rdzv_backend="static", rdzv_port=29412)
    words = command_words(app, replica_id="1")
    assert flag(words, "--rdzv-backend") == "static"
    assert flag(words, "--node-rank") == "1"
    assert "--node-rank" not in command_words(components.ddp(script="train.py", j="2x1"))
    with pytest.raises(ValueError, match="static rendezvous needs a fixed number of nodes"):
        components.ddp(script="train.py", j="1:2x1", rdzv_backend="static")


@pytest.mark.parametrize("j", ["4", "1x4", "2x8", "1:2x4", "3:3x1", "10x1"])
def test_valid_j_means_what_it_means_for_dist_ddp(j: str) -> None:
    low, high, nproc, _ = dist.parse_nnodes(j)
    role = components.ddp(script="t.py", j=j).roles[0]
    assert (role.min_replicas, role.num_replicas) == (low, high)
    assert flag(command_words(components.ddp(script="t.py", j=j)), "--nproc-per-node") == str(nproc)


@pytest.mark.parametrize("j", ["2y3", "x4", "1:4", "a", "", "1:2:3x4", "2x", "-1x2"])
def test_invalid_j_raises_torchx_s_own_error(j: str) -> None:
    with pytest.raises(ValueError) as theirs:
        dist.ddp(script="t.py", j=j)
    with pytest.raises(ValueError) as ours:
        components.ddp(script="t.py", j=j)
    assert str(ours.value) == str(theirs.value)
    assert str(ours.value).startswith("Invalid format for -j, usage example: 1:2x4 or 1x4 or 4. Given:")


@pytest.mark.parametrize(
    ("j", "why"),
    [("0x2", "at least 1 node"), ("0:2x2", "at least 1 node"), ("3:2x4", "exceeds the maximum"),
     ("2x0", "at least 1 process"), ("0", "at least 1 process")],
)  # fmt: skip
def test_sizes_that_cannot_run_are_refused(j: str, why: str) -> None:
    with pytest.raises(ValueError, match=f"Invalid -j: .*{why}.*Given: {j}$"):
        components.ddp(script="t.py", j=j)


def test_exactly_one_of_script_and_module() -> None:
    with pytest.raises(ValueError, match=r"exactly one of --script and -m must be given \(got neither\)"):
        components.ddp(j="1x1")
    with pytest.raises(ValueError, match=r"\(got both\)"):
        components.ddp(script="a.py", m="a", j="1x1")


def test_other_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="--tee must be"):
        components.ddp(script="a.py", tee=4)
    with pytest.raises(ValueError, match="--rdzv_port must be a TCP port"):
        components.ddp(script="a.py", j="2x1", rdzv_port=0)
    with pytest.raises(ValueError, match="--rdzv_backend must be"):
        components.ddp(script="a.py", j="2x1", rdzv_backend="c 10d")
    with pytest.raises(ValueError, match="--max_retries"):
        components.ddp(script="a.py", max_retries=-1)


def test_command_line_parameters_decode_as_torchx_decodes_them() -> None:
    app = specs.materialize_appdef(
        components.ddp,
        ["-j", "2x2", "--script", "train.py", "--env", "A=1,B=x y", "--debug", "True", "--h", "cpu.small",
         "--mounts", "type=bind,src=/data,dst=/mnt/data,readonly", "--max_retries", "2", "--name", "exp/run",
         "--max_restarts", "3", "--launcher_args", "--exit-barrier-timeout 60", "--", "--lr", "0.1"],
    )  # fmt: skip
    role = app.roles[0]
    assert app.name == "run"
    assert role.env["A"] == "1" and role.env["B"] == "x y"
    assert role.env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL" and role.env["CUDA_LAUNCH_BLOCKING"] == "1"
    assert role.env["TORCHX_TRACKING_EXPERIMENT_NAME"] == "exp"
    assert role.resource == specs.named_resources["cpu.small"]
    assert role.max_retries == 2
    assert role.mounts == [specs.BindMount(src_path="/data", dst_path="/mnt/data", read_only=True)]
    words = command_words(app)
    assert flag(words, "--max-restarts") == "3"
    assert flag(words, "--exit-barrier-timeout") == "60"
    assert words[-3:] == ["train.py", "--lr", "0.1"]


def test_spmd_reads_nproc_from_the_host_type() -> None:
    role = components.spmd(script="t.py", j="2", h="gpu.large").roles[0]
    assert (role.num_replicas, role.resource.gpu) == (2, 4)
    assert flag(command_words(components.spmd(script="t.py", j="2", h="gpu.large")), "--nproc-per-node") == "4"
    with pytest.raises(ValueError, match="NPROC cannot be inferred because host type `cpu.small` has no GPUs"):
        components.spmd(script="t.py", j="2", h="cpu.small")
    with pytest.warns(UserWarning, match="which has 4 GPUs"):
        components.spmd(script="t.py", j="1x2", h="gpu.large")
    elastic = components.spmd("--x", m="pkg.main", j="1:2x3", h="cpu.small")
    words = command_words(elastic)
    assert flag(words, "--nnodes") == "1:2" and flag(words, "--nproc-per-node") == "3"
    assert words[-3:] == ["-m", "pkg.main", "--x"]
    with pytest.raises(ValueError, match="Invalid format for -j"):
        components.spmd(script="t.py", j="2y", h="cpu.small")


def test_module_holds_exactly_two_valid_components() -> None:
    found = {c.name: c for c in ModuleComponentsFinder("launcher_torchx.components", "launcher").find()}
    assert sorted(found) == ["launcher.ddp", "launcher.spmd"]
    assert all(not c.validation_errors for c in found.values()), {n: c.validation_errors for n, c in found.items()}
    assert validate(components.__file__, "ddp") == [] and validate(components.__file__, "spmd") == []
    # The parameters users know from dist.ddp are all there, with the same defaults.
    ours = inspect.signature(components.ddp).parameters
    for name, param in inspect.signature(dist.ddp).parameters.items():
        assert name in ours, name
        if name != "script_args":
            assert ours[name].default == param.default, name
    spmd_params = inspect.signature(components.spmd).parameters
    assert [name for name in inspect.signature(dist.spmd).parameters if name not in spmd_params] == []
