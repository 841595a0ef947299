"""The plugin manager, with plugins found the way a third party's are: entry points on sys.path."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from launcher.plugins import hookimpl
from launcher.plugins.hookspec import HOOKS_BY_KIND
from launcher.plugins.manager import (
    PluginConflictError,
    PluginLoadError,
    PluginNotFoundError,
    get_plugin_manager,
    registration_rows,
)
from launcher.plugins.types import DeviceProvider, EventHandler, RendezvousBackend


def make_distribution(root: Path, name: str, version: str, modules: dict[str, str],
                      entry_points: dict[str, dict[str, str]]) -> None:
    """A fake installed distribution: modules plus a ``.dist-info`` with entry points."""
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, entries in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{key} = {value}" for key, value in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


GOOD = """
from launcher.plugins import hookimpl
from launcher.plugins.types import DeviceProvider

@hookimpl
def launcher_device_providers():
    yield DeviceProvider(name="fakedev", description="three fake devices", count_devices=lambda: 3)
"""

BROKEN = """
import module_that_does_not_exist_anywhere
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("thirdparty_")]:
        del sys.modules[name]


def test_third_party_plugin_is_found_with_its_distribution(site):
    make_distribution(site, "launcher-fakedev", "1.2.3", {"thirdparty_fakedev": GOOD},
                      {"launcher": {"fakedev": "thirdparty_fakedev"}})
    manager = get_plugin_manager(environ={})
    provided = manager.lookup("device provider", "fakedev")
    assert provided.registration.count_devices() == 3
    assert (provided.plugin.distribution, provided.plugin.version) == ("launcher-fakedev", "1.2.3")
    row = next(r for r in registration_rows(manager) if r["name"] == "fakedev")
    assert row["loaded"] and row["distribution"] == "launcher-fakedev"


def test_broken_plugin_is_skipped_and_reported(site, caplog):
    make_distribution(site, "launcher-broken", "0.1", {"thirdparty_broken": BROKEN},
                      {"launcher": {"broken": "thirdparty_broken"}})
    manager = get_plugin_manager(environ={})
    assert "static" in manager.names("rendezvous backend")  # the rest still works
    assert any("broken" in r.message and "failed to load" in r.message for r in caplog.records)
    failed = [r for r in registration_rows(manager) if not r["loaded"]]
    assert failed and "module_that_does_not_exist_anywhere" in failed[0]["error"]


def test_asking_for_what_a_broken_plugin_provides_shows_its_error(site):
    make_distribution(site, "launcher-broken", "0.1", {"thirdparty_broken": BROKEN},
                      {"launcher": {"broken": "thirdparty_broken"}})
    manager = get_plugin_manager(environ={})
    with pytest.raises(PluginLoadError, match="ModuleNotFoundError.*module_that_does_not_exist_anywhere"):
        manager.get("rendezvous backend", "broken")


def test_duplicate_name_names_both_distributions(site):
    make_distribution(site, "launcher-fakedev", "1.0", {"thirdparty_a": GOOD}, {"launcher": {"a": "thirdparty_a"}})
    make_distribution(site, "other-fakedev", "2.0", {"thirdparty_b": GOOD}, {"launcher": {"b": "thirdparty_b"}})
    manager = get_plugin_manager(environ={})
    with pytest.raises(PluginConflictError) as info:
        manager.get("device provider", "fakedev")
    message = str(info.value)
    assert "launcher-fakedev 1.0" in message and "other-fakedev 2.0" in message


def test_builtin_name_conflict_is_an_error(plugin_manager, register_plugin):
    class Clash:
        @hookimpl
        def launcher_rendezvous_backends(self):
            yield RendezvousBackend(name="static", create_handler=lambda p: None)

    register_plugin(Clash())
    with pytest.raises(PluginConflictError, match="'static' is provided twice"):
        plugin_manager.names("rendezvous backend")


def test_unknown_name_lists_choices_and_hint(plugin_manager):
    with pytest.raises(PluginNotFoundError) as info:
        plugin_manager.get("rendezvous backend", "zookeeper")
    assert "c10d, static" in str(info.value) or "c10d" in str(info.value)
    assert "pip install" not in str(info.value)  # no made-up distribution name


def test_unknown_name_suggests_the_closest_and_names_known_distributions():
    # Without entry points: the names must be unknown even where launcher-etcd is installed.
    plugin_manager = get_plugin_manager(autoload=False, environ={})
    with pytest.raises(PluginNotFoundError, match="did you mean static\\? choose one of c10d, static"):
        plugin_manager.get("rendezvous backend", "statc")
    with pytest.raises(PluginNotFoundError, match="launcher-etcd distribution: pip install launcher-etcd") as info:
        plugin_manager.get("rendezvous backend", "etcd-v2")
    assert "./plugins/launcher-etcd" in str(info.value)
    with pytest.raises(PluginNotFoundError, match="pip install launcher-webhook"):
        plugin_manager.get("event handler", "webhook")


def test_disable_autoload_keeps_builtins_only(site):
    make_distribution(site, "launcher-fakedev", "1.0", {"thirdparty_fakedev": GOOD},
                      {"launcher": {"fakedev": "thirdparty_fakedev"}})
    manager = get_plugin_manager(environ={"LAUNCHER_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "fakedev" not in manager.names("device provider")
    assert "cpu" in manager.names("device provider")


def test_allowlist_and_blocklist(site):
    make_distribution(site, "launcher-fakedev", "1.0", {"thirdparty_fakedev": GOOD},
                      {"launcher": {"fakedev": "thirdparty_fakedev"}})
    assert "fakedev" not in get_plugin_manager(environ={"LAUNCHER_PLUGINS": ""}).names("device provider")
    assert "fakedev" in get_plugin_manager(environ={"LAUNCHER_PLUGINS": "fakedev"}).names("device provider")
    assert "fakedev" not in get_plugin_manager(environ={"LAUNCHER_PLUGINS": "other"}).names("device provider")
    blocked = get_plugin_manager(environ={"LAUNCHER_BLOCK_PLUGINS": "fakedev,builtin-numa"})
    assert "fakedev" not in blocked.names("device provider")
    assert blocked.names("numa strategy") == []


def test_torchrun_logs_specs_group_is_read_after_launcher_plugins(site):
    make_distribution(
        site, "torch-logs-thing", "0.3",
        {"thirdparty_tlogs": "class MyLogs:\n    pass\n"},
        {"torchrun.logs_specs": {"mylogs": "thirdparty_tlogs:MyLogs", "default": "thirdparty_tlogs:MyLogs"}},
    )
    manager = get_plugin_manager(environ={})
    provided = manager.lookup("logs specs", "mylogs")
    assert provided.plugin.group == "torchrun.logs_specs"
    assert provided.registration.load_class().__name__ == "MyLogs"
    # launcher's own 'default' wins over any torchrun.logs_specs 'default'.
    assert manager.lookup("logs specs", "default").plugin.group == "launcher"


def test_registration_names_are_validated():
    with pytest.raises(ValueError, match="invalid device provider name"):
        DeviceProvider(name="Bad Name!", count_devices=lambda: 1)
    assert EventHandler(name="  MySink ", create_sink=lambda c: None).name == "mysink"
    with pytest.raises(ValueError, match="exactly one"):
        RendezvousBackend(name="x")


def test_hook_returning_wrong_type_is_reported(plugin_manager, register_plugin):
    class Wrong:
        @hookimpl
        def launcher_device_providers(self):
            yield "not a registration"

    register_plugin(Wrong())
    with pytest.raises(TypeError, match="expected device provider registrations"):
        plugin_manager.registrations("device provider")


def test_every_hook_kind_has_a_registration_type_and_documented_example():
    from launcher.plugins import hookspec, types

    for kind, hook in HOOKS_BY_KIND.items():
        assert kind in types.REGISTRATION_TYPES
        doc = getattr(hookspec.LauncherSpecs, hook).__doc__
        assert "@hookimpl" in doc and "yield" in doc, hook


def test_torchrun_handlers_group_is_usable_by_name(site):
    """A handler registered for torchrun is found without being loaded, and runs through the adapter."""
    from tests.rendezvous.test_torch_handlers import PLUGIN_SOURCE

    make_distribution(
        site, "torch-rdzv-thing", "0.5", {"thirdparty_rdzv": PLUGIN_SOURCE},
        {"torchrun.handlers": {"tcpfake": "thirdparty_rdzv:get_creator", "c10d": "thirdparty_rdzv:get_creator"}},
    )
    manager = get_plugin_manager(environ={})
    provided = manager.lookup("rendezvous backend", "tcpfake")
    assert (provided.plugin.group, provided.plugin.distribution) == ("torchrun.handlers", "torch-rdzv-thing")
    assert "thirdparty_rdzv" not in sys.modules  # listing and lookup load nothing
    # launcher's own c10d wins over a torchrun.handlers entry of the same name.
    assert manager.lookup("rendezvous backend", "c10d").plugin.group == "launcher"

    from launcher.rendezvous.api import RendezvousParameters

    params = RendezvousParameters(backend="tcpfake", endpoint="", run_id="t", min_nodes=1, max_nodes=1)
    handler = provided.registration.create_handler(params)
    try:
        info = handler.next_rendezvous()
        assert info.group_world_size >= 1
    finally:
        handler.shutdown()
