"""A LogsSpecs written for torchrun, registered under ``torchrun.logs_specs``, works unchanged."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from launcher.plugins.manager import get_plugin_manager
from launcher.plugins.types import LogsSpecsProvider

from tests.logs.conftest import launch, lines, run_dir

pytest.importorskip("torch.distributed.elastic.multiprocessing.api")

# What a third party ships for torchrun: classes built on torch's own LogsSpecs and Std.
THIRD_PARTY = '''
import os

from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, LogsDest, LogsSpecs, Std


class FlatLogsSpecs(LogsSpecs):
    """<log_dir>/rank<RANK>.out and .err; Std decides which streams go there."""

    @property
    def root_log_dir(self):
        return str(self._root_log_dir)

    def _std(self, spec, rank):
        value = spec if isinstance(spec, Std) else spec.get(rank, Std.NONE)
        assert isinstance(value, Std), type(value)  # torchrun hands LogsSpecs torch's Std
        return value

    def reify(self, envs):
        os.makedirs(self.root_log_dir, exist_ok=True)
        dest = LogsDest()
        for local_rank, env in envs.items():
            base = os.path.join(self.root_log_dir, "rank" + env["RANK"])
            redirects = self._std(self._redirects, local_rank) | self._std(self._tee, local_rank)
            tee = self._std(self._tee, local_rank)
            dest.stdouts[local_rank] = base + ".out" if redirects & Std.OUT else ""
            dest.stderrs[local_rank] = base + ".err" if redirects & Std.ERR else ""
            if tee & Std.OUT:
                dest.tee_stdouts[local_rank] = dest.stdouts[local_rank]
            if tee & Std.ERR:
                dest.tee_stderrs[local_rank] = dest.stderrs[local_rank]
            dest.error_files[local_rank] = base + ".error.json"
            env["TORCHELASTIC_ERROR_FILE"] = dest.error_files[local_rank]
        return dest


class TorchDefault(DefaultLogsSpecs):
    """torch's own default layout, unchanged."""


class OldStyle(LogsSpecs):
    """Written for torch < 2.3: no local_ranks_filter argument."""

    def __init__(self, log_dir=None, redirects=Std.NONE, tee=Std.NONE):
        super().__init__(log_dir, redirects, tee)

    @property
    def root_log_dir(self):
        return str(self._root_log_dir)

    def reify(self, envs):
        return LogsDest({r: "" for r in envs}, {r: "" for r in envs}, {}, {}, {r: "" for r in envs})
'''


@pytest.fixture
def torchrun_plugin(tmp_path: Path) -> dict[str, str]:
    """Install the classes above the way a distribution would, as a dist-info on PYTHONPATH."""
    site = tmp_path / "site"
    info = site / "flat_logs-1.0.dist-info"
    info.mkdir(parents=True)
    (site / "flat_logs.py").write_text(textwrap.dedent(THIRD_PARTY))
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flat-logs\nVersion: 1.0\n\n")
    (info / "entry_points.txt").write_text(
        "[torchrun.logs_specs]\nflat = flat_logs:FlatLogsSpecs\ntorchdefault = flat_logs:TorchDefault\n"
        "oldstyle = flat_logs:OldStyle\n"
    )
    return {"PYTHONPATH": str(site)}


WORKER = """
import os, sys
print(f"out of rank {os.environ['RANK']}")
print(f"err of rank {os.environ['RANK']}", file=sys.stderr)
print(f"error file {os.environ.get('TORCHELASTIC_ERROR_FILE')}")
"""


def test_torchrun_logs_specs_class_runs_a_real_job(tmp_path, write_script, torchrun_plugin):
    script = write_script("w.py", WORKER)
    log_dir = tmp_path / "flat"
    result = launch(["--standalone", "--nproc-per-node", "2", "--logs-specs", "flat", "--log-dir", str(log_dir),
                     "-r", "1", "-t", "0:2", script], env=torchrun_plugin, timeout=90)
    assert result.returncode == 0, result.stderr.decode()
    assert sorted(p.name for p in log_dir.iterdir()) == ["rank0.err", "rank0.out", "rank1.out"]
    for rank in (0, 1):
        out = (log_dir / f"rank{rank}.out").read_text()
        assert f"out of rank {rank}\n" in out
        assert f"error file {log_dir / f'rank{rank}.error.json'}" in out
    assert (log_dir / "rank0.err").read_text() == "err of rank 0\n"
    assert lines(result.stdout) == []
    err = lines(result.stderr)
    assert "[default0]:err of rank 0" in err and "[default1]:err of rank 1" in err


def test_torch_default_logs_specs_subclass(tmp_path, write_script, torchrun_plugin):
    script = write_script("w.py", WORKER)
    log_dir = tmp_path / "logs"
    result = launch(["--standalone", "--nproc-per-node", "2", "--logs-specs", "torchdefault",
                     "--log-dir", str(log_dir), "--tee", "3", "--local-ranks-filter", "0", script],
                    env=torchrun_plugin, timeout=90)
    assert result.returncode == 0, result.stderr.decode()
    attempt = run_dir(log_dir) / "attempt_0"
    for rank in (0, 1):
        assert f"out of rank {rank}" in (attempt / str(rank) / "stdout.log").read_text()
        assert (attempt / str(rank) / "stderr.log").read_text() == f"err of rank {rank}\n"
    assert "[default0]:out of rank 0" in lines(result.stdout)
    assert not [line for line in lines(result.stdout) if "rank 1" in line]


def test_logs_specs_without_local_ranks_filter_argument(write_script, torchrun_plugin):
    script = write_script("w.py", WORKER)
    result = launch(["--standalone", "--nproc-per-node", "1", "--logs-specs", "oldstyle", script],
                    env=torchrun_plugin, timeout=90)
    assert result.returncode == 0, result.stderr.decode()
    assert "out of rank 0" in lines(result.stdout)


def test_launcher_plugins_come_first(torchrun_plugin, monkeypatch):
    # torch itself registers "default" under torchrun.logs_specs; launcher's own wins.
    monkeypatch.syspath_prepend(torchrun_plugin["PYTHONPATH"])
    manager = get_plugin_manager(environ={})
    assert manager.lookup(LogsSpecsProvider, "default").plugin.group == "launcher"
    provided = manager.lookup(LogsSpecsProvider, "flat")
    assert provided.plugin.group == "torchrun.logs_specs"
    assert provided.plugin.distribution == "flat-logs"
