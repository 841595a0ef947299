"""The webhook's flag group, through the installed distribution: --help, parsing, checks, the autoload switch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from webhook_servers import PLUGIN_ROOT, Behaviour, EventServer

FLAGS = ("--webhook-url", "--webhook-batch-size", "--webhook-max-queue", "--webhook-timeout",
         "--webhook-retries", "--webhook-backoff", "--webhook-close-timeout")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The distribution pip-installed into a directory (built from a copy, as a user's pip would)."""
    root = tmp_path_factory.mktemp("webhook-flags")
    source = root / "src"
    shutil.copytree(PLUGIN_ROOT, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    target = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--no-index", "--target", str(target), str(source)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    yield target


def _launcher(site: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("LAUNCHER_", "PET_")) and not k.lower().endswith("_proxy")}
    environ.update(PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
                   COLUMNS="200", no_proxy="127.0.0.1", **env)
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          env=environ, cwd=tmp_path, timeout=120)


def _worker(tmp_path: Path) -> tuple[Path, Path]:
    """A worker script that leaves a marker file, and the marker's path."""
    marker = tmp_path / "worker-ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    return script, marker


@pytest.mark.slow
def test_the_group_is_in_help(site: Path, tmp_path: Path) -> None:
    result = _launcher(site, tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    title = lines.index("webhook event handler (launcher-webhook; --event-log-handler webhook):")
    listed = [line.split()[0].rstrip(",") for line in lines[title + 1:] if line.startswith("  --")]
    assert tuple(listed[: len(FLAGS)]) == FLAGS


@pytest.mark.slow
def test_flags_reach_the_sink(site: Path, tmp_path: Path,
                              event_server: Callable[[Behaviour], EventServer]) -> None:
    server = event_server(lambda n: (200, 0.0))
    script, marker = _worker(tmp_path)
    # The variable names another URL: the flag wins over it.
    result = _launcher(site, tmp_path, "--standalone", "--event-log-handler", "webhook", "--webhook-url", server.url,
                       "--webhook-batch-size", "1", str(script), LAUNCHER_WEBHOOK_URL="http://127.0.0.1:9/unused")
    assert result.returncode == 0, result.stderr
    assert marker.exists()
    delivered = server.delivered()
    assert delivered and delivered[-1]["type"] == "job_succeeded"
    assert all(len(request.body["events"]) == 1 for request in server.requests)  # --webhook-batch-size 1
    assert len(server.requests) >= 3  # rendezvous, workers started, ..., job succeeded: one request each


@pytest.mark.slow
def test_the_variable_is_the_fallback(site: Path, tmp_path: Path,
                                      event_server: Callable[[Behaviour], EventServer]) -> None:
    server = event_server(lambda n: (200, 0.0))
    script, _ = _worker(tmp_path)
    result = _launcher(site, tmp_path, "--standalone", "--event-log-handler", "webhook", str(script),
                       LAUNCHER_WEBHOOK_URL=server.url)
    assert result.returncode == 0, result.stderr
    assert [e["type"] for e in server.delivered()][-1] == "job_succeeded"


@pytest.mark.slow
@pytest.mark.parametrize(("args", "env", "expect"), [
    (["--webhook-batch-size", "0"], {}, "--webhook-batch-size must be an integer from 1 to 1000000, got '0'"),
    (["--webhook-url", "ftp://host/x"], {}, "--webhook-url must be an http:// or https:// URL, got 'ftp://host/x'"),
    ([], {"LAUNCHER_WEBHOOK_TIMEOUT": "soon"}, "LAUNCHER_WEBHOOK_TIMEOUT must be a number of seconds above 0"),
    (["--webhook-retries=-1"], {}, "--webhook-retries must be an integer from 0 to 1000000, got '-1'"),
    (["--webhook-timeout", "0"], {}, "--webhook-timeout must be a number of seconds above 0 and at most 604800"),
    (["--webhook-u", "http://h/x"], {}, "unrecognized arguments: --webhook-u"),
])
def test_a_bad_value_is_one_line_and_exit_2(site: Path, tmp_path: Path, args: list[str], env: dict[str, str],
                                            expect: str) -> None:
    script, marker = _worker(tmp_path)
    result = _launcher(site, tmp_path, "--standalone", "--event-log-handler", "webhook", *args, str(script), **env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and expect in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_absent_when_plugins_do_not_autoload(site: Path, tmp_path: Path) -> None:
    help_text = _launcher(site, tmp_path, "--help", LAUNCHER_DISABLE_PLUGIN_AUTOLOAD="1")
    assert help_text.returncode == 0 and "--event-log-handler" in help_text.stdout
    assert "--webhook" not in help_text.stdout
    script, marker = _worker(tmp_path)
    refused = _launcher(site, tmp_path, "--standalone", "--webhook-url", "http://h/x", str(script),
                        LAUNCHER_DISABLE_PLUGIN_AUTOLOAD="1")
    assert refused.returncode == 2 and "unrecognized arguments: --webhook-url" in refused.stderr
    assert not marker.exists()
