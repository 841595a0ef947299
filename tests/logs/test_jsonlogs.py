"""The example third-party LogsSpecs ``plugins/launcher-jsonlogs``, built and installed for real."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.logs.conftest import launch, lines

PLUGIN_SOURCE = Path(__file__).resolve().parents[2] / "plugins" / "launcher-jsonlogs"

WORKER = """
import os, sys
rank = os.environ["RANK"]
for i in range(int(sys.argv[1])):
    print(f"out {rank} {i}")
    if i % 10 == 0:
        print(f"err {rank} {i}", file=sys.stderr)
sys.stdout.buffer.write(b"bytes \\xff\\n")
sys.stdout.write("caf\\u00e9 unfinished")
"""


@pytest.fixture(scope="module")
def jsonlogs_site(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Build and install the distribution into a private --target directory."""
    work = tmp_path_factory.mktemp("jsonlogs")
    source = work / "src"
    # Build from a copy: a build leaves build/ and *.egg-info beside the sources.
    shutil.copytree(PLUGIN_SOURCE, source)
    target = work / "site"
    try:
        import setuptools  # noqa: F401

        # The build backend is here already: build offline, in a second or so.
        isolation = ["--no-build-isolation", "--no-index"]
    except ImportError:  # a bare virtualenv: pip fetches setuptools for an isolated build
        isolation = []
    built = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation,
         "--disable-pip-version-check", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=120,
    )
    assert built.returncode == 0, built.stderr
    assert (target / "launcher_jsonlogs").is_dir()
    return str(target)


def _records(log_dir: Path) -> list[dict]:
    (run,) = log_dir.iterdir()
    files = list(run.iterdir())
    assert [f.name for f in files] == [f"{socket.gethostname()}.jsonl"]
    assert files[0].stat().st_mode & 0o777 == 0o600
    return [json.loads(line) for line in files[0].read_text().splitlines()]


def test_every_line_with_its_rank(tmp_path, write_script, jsonlogs_site):
    script = write_script("w.py", WORKER)
    log_dir = tmp_path / "logs"
    n = 2000
    result = launch(["--standalone", "--nproc-per-node", "2", "--logs-specs", "jsonlogs",
                     "--log-dir", str(log_dir), script, str(n)],
                    env={"PYTHONPATH": jsonlogs_site}, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    texts: dict[tuple[int, str], list[str]] = defaultdict(list)
    for record in _records(log_dir):
        assert set(record) == {"timestamp", "node", "rank", "local_rank", "role", "attempt", "stream", "text"}
        assert record["local_rank"] == record["rank"] and record["attempt"] == 0
        assert isinstance(record["timestamp"], float)
        texts[record["rank"], record["stream"]].append(record["text"])
    for rank in (0, 1):
        assert texts[rank, "stdout"] == [f"out {rank} {i}" for i in range(n)] + ["bytes \\xff", "café unfinished"]
        assert texts[rank, "stderr"] == [f"err {rank} {i}" for i in range(0, n, 10)]
    # Not redirected: the console shows everything too.
    assert len(lines(result.stdout)) == 2 * (n + 2)


def test_redirected_streams_stay_off_the_console(tmp_path, write_script, jsonlogs_site):
    script = write_script("w.py", WORKER)
    log_dir = tmp_path / "logs"
    result = launch(["--standalone", "--nproc-per-node", "2", "--logs-specs", "jsonlogs",
                     "--log-dir", str(log_dir), "-r", "1", script, "30"],
                    env={"PYTHONPATH": jsonlogs_site}, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    assert lines(result.stdout) == []
    assert sorted(lines(result.stderr)) == sorted(f"[default{r}]:err {r} {i}" for r in (0, 1) for i in (0, 10, 20))
    assert len(_records(log_dir)) == 2 * (30 + 2 + 3)


def test_listed_and_needs_a_directory(write_script, jsonlogs_site):
    listing = subprocess.run([sys.executable, "-m", "launcher", "plugins"], capture_output=True, text=True,
                             env={"PYTHONPATH": jsonlogs_site, "PATH": "/usr/bin:/bin"}, timeout=30)
    assert "jsonlogs" in listing.stdout and "launcher-jsonlogs" in listing.stdout
    script = write_script("w.py", WORKER)
    result = launch(["--standalone", "--nproc-per-node", "1", "--logs-specs", "jsonlogs", script, "1"],
                    env={"PYTHONPATH": jsonlogs_site})
    assert result.returncode != 0
    assert "needs --log-dir" in result.stderr.decode()
