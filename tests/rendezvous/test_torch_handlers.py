"""Handlers registered for torchrun (``torchrun.handlers``) work by name, loaded only when chosen."""

from __future__ import annotations

import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
from launcher.rendezvous.api import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousParameters,
    RendezvousTimeoutError,
)
from launcher.rendezvous.torch_handlers import ENTRY_POINT_GROUP, EntryPointCreator, TorchHandlerAdapter
from launcher.store.api import KeyValueStore

pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.timeout(60)

MODULE = "fake_torchrun_rdzv"

PLUGIN_SOURCE = """
from torch.distributed import HashStore
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

CREATED = []


class FakeHandler(RendezvousHandler):
    def __init__(self, params):
        self.params = params
        self.closed = False
        self.store = HashStore()
        CREATED.append(self)

    def get_backend(self):
        return self.params.backend

    @property
    def use_agent_store(self):
        return True

    def next_rendezvous(self):
        mode = self.params.config.get("mode", "ok")
        if mode == "closed":
            raise RendezvousClosedError("closed by the fake")
        if mode == "timeout":
            raise RendezvousTimeoutError("nobody came")
        if mode == "tuple":
            return self.store, 0, 1
        return RendezvousInfo(self.store, 1, 3, RendezvousStoreInfo("10.9.8.7", 4321))

    def is_closed(self):
        return self.closed

    def set_closed(self):
        self.closed = True

    def num_nodes_waiting(self):
        return 2

    def get_run_id(self):
        return self.params.run_id

    def shutdown(self):
        return True


def get_creator():
    return FakeHandler


def broken():
    raise ImportError("the plugin's dependency is missing")
"""


@pytest.fixture
def fake_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A distribution on sys.path that registers handlers in ``torchrun.handlers``."""
    (tmp_path / f"{MODULE}.py").write_text(PLUGIN_SOURCE)
    info = tmp_path / "fake_torchrun_rdzv-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-torchrun-rdzv\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(
            f"""\
            [torchrun.handlers]
            fake = {MODULE}:get_creator
            broken = {MODULE}:broken
            Not A Name! = {MODULE}:get_creator
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    return tmp_path


def _params(backend: str = "fake", **config: str) -> RendezvousParameters:
    return RendezvousParameters(
        backend=backend, endpoint="somewhere:1", run_id="job", min_nodes=1, max_nodes=3, config=config
    )


def _creator(name: str) -> EntryPointCreator:
    # Listing the group and naming backends is the plugin manager's job (tests/core/
    # test_plugin_manager.py); here the entry point is taken straight from the metadata.
    (entry_point,) = (ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name)
    return EntryPointCreator(entry_point)


def test_entry_point_is_loaded_only_when_a_handler_is_created(fake_distribution: Path) -> None:
    creator = _creator("fake")
    assert MODULE not in sys.modules, "wrapping the entry point must not import the plugin"
    creator(_params()).shutdown()
    assert MODULE in sys.modules


def test_handler_works_by_name(fake_distribution: Path) -> None:
    handler = _creator("fake")(_params())
    assert isinstance(handler, TorchHandlerAdapter)
    info = handler.next_rendezvous()
    assert (info.group_rank, info.group_world_size) == (1, 3)
    assert (info.master_addr, info.master_port, info.use_agent_store) == ("10.9.8.7", 4321, True)
    assert isinstance(info.store, KeyValueStore)
    info.store.set("k", b"v")
    assert info.store.get("k") == b"v"
    assert handler.num_nodes_waiting() == 2
    assert handler.lost_nodes() == []
    assert handler.get_run_id() == "job"
    assert not handler.is_closed()
    handler.set_closed()
    assert handler.is_closed()
    assert handler.shutdown()


def test_old_style_tuple_result(fake_distribution: Path) -> None:
    handler = _creator("fake")(_params(mode="tuple"))
    info = handler.next_rendezvous()
    assert (info.group_rank, info.group_world_size) == (0, 1)
    assert info.master_addr and 0 < info.master_port < 65536


@pytest.mark.parametrize(("mode", "error"), [("closed", RendezvousClosedError), ("timeout", RendezvousTimeoutError)])
def test_torch_errors_become_launcher_errors(fake_distribution: Path, mode: str, error: type[Exception]) -> None:
    handler = _creator("fake")(_params(mode=mode))
    with pytest.raises(error, match="fake rendezvous"):
        handler.next_rendezvous()


def test_broken_entry_point_fails_when_chosen(fake_distribution: Path) -> None:
    creator = _creator("broken")
    with pytest.raises(RendezvousError, match="'broken'.*failed to load: ImportError"):
        creator(_params("broken"))
