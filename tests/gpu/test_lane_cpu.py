"""The GPU lane's CPU side, in the normal suite: its job script, stamps and measurements run here over
gloo on CPU tensors (the same code paths the GPU run takes, NCCL and CUDA aside), and the lane skips
rather than fails where torch sees no GPU.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import run_launcher
from tests.gpu import lane

torch = pytest.importorskip("torch")
CPU = {"backend": "gloo", "device": "cpu"}


def test_no_torch_or_no_device_means_no_gpu_lane(monkeypatch):
    lane.cuda_devices.cache_clear()
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    try:
        assert lane.cuda_devices() == 0 and lane.skip_reason() == "no torch here"
    finally:
        lane.cuda_devices.cache_clear()


def test_stamps_skip_a_line_being_written_and_first_looks_after_a_time(tmp_path):
    path = tmp_path / "stamps.jsonl"
    assert lane.stamps(path) == []
    path.write_text('{"event": "a", "t": 1.0}\n{"event": "b", "t": 2.0}\n{"event": "a", "t": 3.0}\n{"event": "a", "t"')
    rows = lane.stamps(path)
    assert [row["event"] for row in rows] == ["a", "b", "a"]
    assert lane.first(rows, "a")["t"] == 1.0 and lane.first(rows, "a", after=1.0)["t"] == 3.0
    assert lane.first(rows, "c") is None


def test_figures_go_to_the_lane_file(tmp_path, monkeypatch):
    path = tmp_path / "figures.jsonl"
    monkeypatch.setenv(lane.FIGURES_ENV, str(path))
    monkeypatch.setattr(lane, "RECORDED", [])
    lane.record_figure(lane.START.format("launcher"), 1.23456, ranks=1)
    assert path.read_text() == '{"figure": "start -> first all_reduce (launcher)", "ranks": 1, "seconds": 1.235}\n'


@pytest.mark.timeout(200)
def test_the_measurements_run_over_gloo_on_cpu(tmp_path):
    start = lane.measure_start("launcher", tmp_path / "start", **CPU)
    assert start["ranks"] == 1 and start["seconds"] > 0, start
    restart = lane.measure_restart("launcher --preload torch", tmp_path / "restart", **CPU)
    assert restart["replaced"] and restart["preloaded"] and restart["value"] == 1.0, restart
    in_place = lane.measure_in_place(tmp_path / "in_place", **CPU)
    assert in_place["same_pid"] and in_place["same_address"] and in_place["intact"], in_place
    assert in_place["call"] == 2 and in_place["calls"] == 2, in_place


@pytest.mark.timeout(150)
def test_the_ddp_mode_reads_its_straggler_slot(tmp_path):
    stamps = tmp_path / "stamps.jsonl"
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--straggler-detection", lane.JOB, "--mode", "ddp",
                           "--seconds", "2", "--width", "64", "--backend", "gloo", "--device", "cpu"],
                          env=lane.job_env(stamps), timeout=140)
    assert result.returncode == 0, result.stderr[-3000:]
    done = lane.first(lane.stamps(stamps), "ddp")
    slot = done["slot"]
    # On CPU tensors: the host's clock, nothing on the GPU's.
    assert slot["collectives"] >= done["steps"] * 10 > 0 and slot["gpu_collectives"] == slot["gpu_pending"] == 0, done
    assert 0.0 < slot["wait"] < done["seconds"], done


@pytest.mark.timeout(150)
def test_the_stalled_rank_mode_is_reported_as_the_gpu_test_expects(tmp_path):
    stamps = tmp_path / "stamps.jsonl"
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--hang-timeout", "3", lane.JOB, "--mode", "hang",
                           "--backend", "gloo", "--device", "cpu", "--stall-rank", "1"],
                          env=lane.job_env(stamps), timeout=140)
    assert lane.first(lane.stamps(stamps), "stalling") is not None, result.stderr[-3000:]
    assert result.returncode != 0
    assert re.search(r"^  rank 1: mode_hang \(gpu_job\.py:\d+\)", result.stderr, re.M), result.stderr[-4000:]


ROOT = Path(__file__).resolve().parents[2]


def load_benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_lane_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(200)
def test_without_a_gpu_the_figure_scripts_say_so_and_bad_input_is_one_line(tmp_path):
    if lane.cuda_devices():
        pytest.skip("a GPU is here: the figure scripts measure rather than skip")
    figures = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_figures.py"), "--json",
                              str(tmp_path / "f.json")], capture_output=True, text=True, timeout=120)
    assert figures.returncode == 0 and "skipped: torch" in figures.stdout, figures.stdout + figures.stderr
    assert "sees no CUDA device" in json.loads((tmp_path / "f.json").read_text())["skipped"]
    bench = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu_stragglers.py"), "--json",
                            str(tmp_path / "b.json")], capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0 and "needs a GPU" in bench.stdout, bench.stdout + bench.stderr
    assert "skipped" in json.loads((tmp_path / "b.json").read_text())
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_figures.py"), "--only", "speed"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "--only takes start" in bad.stderr, bad


def test_the_figures_table_puts_launcher_beside_torchrun():
    figures = load_benchmark("gpu_figures")
    found = {lane.START.format("launcher"): {"seconds": 4.0}, lane.START.format("torchrun"): {"seconds": 8.0},
             lane.RESTART.format("launcher --preload torch"): {"seconds": 1.0},
             lane.IN_PLACE: {"seconds": 0.5},
             "overhead": {"results": {"2048": {"plain_ms": 2.0, "timed_ms": 2.01, "overhead_percent": 0.5}}}}
    lines = figures.table(found, "header")
    assert lines[0] == "header"
    assert re.search(r"^start -> every rank's first all_reduce \(s\) +4\.000 +8\.000 +0\.50x$", "\n".join(lines), re.M)
    # No torchrun restart measured: its column says so rather than inventing a ratio.
    assert re.search(r"--preload torch +1\.000 +- +-$", "\n".join(lines), re.M), lines
    assert "straggler timing, DDP Linear(2048) step: 2.000 -> 2.010 ms (+0.50 %; budget 1 %)" in lines


@pytest.mark.timeout(300)
def test_the_lane_builds_its_wheel_and_installs_it_alone(tmp_path):
    pytest.importorskip("setuptools")
    gpu_lane = load_benchmark("gpu_lane")
    wheel = gpu_lane.build_wheel(tmp_path)
    env = gpu_lane.install(wheel, tmp_path)  # raises unless import launcher finds the install
    found = subprocess.run([sys.executable, "-c", "import launcher.stragglers.gpu_timeline as m; print(m.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert found.stdout.strip().startswith(str(tmp_path / "site")), found
