"""The plugin manager, with plugins found the way a third party's are: entry points on sys.path."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from launcher.plugins import hookimpl
from launcher.plugins.listing import registration_rows
from launcher.plugins.manager import (
    InvalidPluginError,
    PluginConflictError,
    PluginLoadError,
    PluginNotFoundError,
    get_plugin_manager,
)
from launcher.plugins.types import (
    REGISTRATION_CLASSES,
    DeviceProvider,
    EventHandler,
    LogsSpecsProvider,
    NumaStrategy,
    RendezvousBackend,
)


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
    provided = manager.lookup(DeviceProvider, "fakedev")
    assert provided.registration.count_devices() == 3
    assert (provided.plugin.distribution, provided.plugin.version) == ("launcher-fakedev", "1.2.3")
    row = next(r for r in registration_rows(manager) if r.name == "fakedev")
    assert row.loaded and row.distribution == "launcher-fakedev"


def test_broken_plugin_is_skipped_and_reported(site, caplog):
    make_distribution(site, "launcher-broken", "0.1", {"thirdparty_broken": BROKEN},
                      {"launcher": {"broken": "thirdparty_broken"}})
    manager = get_plugin_manager(environ={})
    assert "static" in manager.names(RendezvousBackend)  # the rest still works
    assert any("broken" in r.message and "failed to load" in r.message for r in caplog.records)
    failed = [r for r in registration_rows(manager) if not r.loaded]
    assert failed and "module_that_does_not_exist_anywhere" in (failed[0].error or "")


def test_asking_for_what_a_broken_plugin_provides_shows_its_error(site):
    make_distribution(site, "launcher-broken", "0.1", {"thirdparty_broken": BROKEN},
                      {"launcher": {"broken": "thirdparty_broken"}})
    manager = get_plugin_manager(environ={})
    with pytest.raises(PluginLoadError, match="ModuleNotFoundError.*module_that_does_not_exist_anywhere"):
        manager.get(RendezvousBackend, "broken")


def test_duplicate_name_names_both_distributions(site):
    make_distribution(site, "launcher-fakedev", "1.0", {"thirdparty_a": GOOD}, {"launcher": {"a": "thirdparty_a"}})
    make_distribution(site, "other-fakedev", "2.0", {"thirdparty_b": GOOD}, {"launcher": {"b": "thirdparty_b"}})
    manager = get_plugin_manager(environ={})
    with pytest.raises(PluginConflictError) as info:
        manager.get(DeviceProvider, "fakedev")
    message = str(info.value)
    assert "launcher-fakedev 1.0" in message and "other-fakedev 2.0" in message


def test_builtin_name_conflict_is_an_error(plugin_manager, register_plugin):
    class Clash:
        @hookimpl
        def launcher_rendezvous_backends(self):
            yield RendezvousBackend(name="static", create_handler=lambda p: None)

    register_plugin(Clash())
    with pytest.raises(PluginConflictError, match="'static' is provided twice"):
        plugin_manager.names(RendezvousBackend)


def test_unknown_name_lists_choices_and_hint(plugin_manager):
    with pytest.raises(PluginNotFoundError) as info:
        plugin_manager.get(RendezvousBackend, "zookeeper")
    assert "c10d, static" in str(info.value) or "c10d" in str(info.value)
    assert "pip install" not in str(info.value)  # no made-up distribution name


def test_unknown_name_suggests_the_closest_and_names_known_distributions():
    # Without entry points: the names must be unknown even where launcher-etcd is installed.
    plugin_manager = get_plugin_manager(autoload=False, environ={})
    with pytest.raises(PluginNotFoundError, match="did you mean static\\? choose one of c10d, static"):
        plugin_manager.get(RendezvousBackend, "statc")
    with pytest.raises(PluginNotFoundError, match="launcher-etcd distribution, which is not on PyPI") as info:
        plugin_manager.get(RendezvousBackend, "etcd-v2")
    assert "pip install ./plugins/launcher-etcd from a launcher checkout" in str(info.value)
    assert "pip install launcher" not in str(info.value)  # not published: no made-up package name
    with pytest.raises(PluginNotFoundError, match="pip install ./plugins/launcher-webhook"):
        plugin_manager.get(EventHandler, "webhook")


def test_disable_autoload_keeps_builtins_only(site):
    make_distribution(site, "launcher-fakedev", "1.0", {"thirdparty_fakedev": GOOD},
                      {"launcher": {"fakedev": "thirdparty_fakedev"}})
    manager = get_plugin_manager(environ={"LAUNCHER_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "fakedev" not in manager.names(DeviceProvider)
    assert "cpu" in manager.names(DeviceProvider)


def test_allowlist_and_blocklist(site):
    make_distribution(site, "launcher-fakedev", "1.0", {"thirdparty_fakedev": GOOD},
                      {"launcher": {"fakedev": "thirdparty_fakedev"}})
    assert "fakedev" not in get_plugin_manager(environ={"LAUNCHER_PLUGINS": ""}).names(DeviceProvider)
    assert "fakedev" in get_plugin_manager(environ={"LAUNCHER_PLUGINS": "fakedev"}).names(DeviceProvider)
    assert "fakedev" not in get_plugin_manager(environ={"LAUNCHER_PLUGINS": "other"}).names(DeviceProvider)
    blocked = get_plugin_manager(environ={"LAUNCHER_BLOCK_PLUGINS": "fakedev,builtin-numa"})
    assert "fakedev" not in blocked.names(DeviceProvider)
    assert blocked.names(NumaStrategy) == []


def test_torchrun_logs_specs_group_is_read_after_launcher_plugins(site):
    make_distribution(
        site, "torch-logs-thing", "0.3",
        {"thirdparty_tlogs": "class MyLogs:\n    pass\n"},
        {"torchrun.logs_specs": {"mylogs": "thirdparty_tlogs:MyLogs", "default": "thirdparty_tlogs:MyLogs"}},
    )
    manager = get_plugin_manager(environ={})
    provided = manager.lookup(LogsSpecsProvider, "mylogs")
    assert provided.plugin.group == "torchrun.logs_specs"
    assert provided.registration.load_class().__name__ == "MyLogs"
    # launcher's own 'default' wins over any torchrun.logs_specs 'default'.
    assert manager.lookup(LogsSpecsProvider, "default").plugin.group == "launcher"


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
        plugin_manager.registrations(DeviceProvider)


def test_every_hook_kind_has_a_registration_type_and_documented_example():
    from launcher.plugins import hookspec, types

    for cls in types.REGISTRATION_CLASSES:
        doc = getattr(hookspec.LauncherSpecs, cls.hook).__doc__
        assert "@hookimpl" in doc and "yield" in doc, cls.hook


def test_torchrun_handlers_group_is_usable_by_name(site):
    """A handler registered for torchrun is found without being loaded, and runs through the adapter."""
    from tests.rendezvous.test_torch_handlers import PLUGIN_SOURCE

    make_distribution(
        site, "torch-rdzv-thing", "0.5", {"thirdparty_rdzv": PLUGIN_SOURCE},
        {"torchrun.handlers": {"tcpfake": "thirdparty_rdzv:get_creator", "c10d": "thirdparty_rdzv:get_creator"}},
    )
    manager = get_plugin_manager(environ={})
    provided = manager.lookup(RendezvousBackend, "tcpfake")
    assert (provided.plugin.group, provided.plugin.distribution) == ("torchrun.handlers", "torch-rdzv-thing")
    assert "thirdparty_rdzv" not in sys.modules  # listing and lookup load nothing
    # launcher's own c10d wins over a torchrun.handlers entry of the same name.
    assert manager.lookup(RendezvousBackend, "c10d").plugin.group == "launcher"

    from launcher.rendezvous.api import RendezvousParameters

    params = RendezvousParameters(backend="tcpfake", endpoint="", run_id="t", min_nodes=1, max_nodes=1)
    handler = provided.registration.create_handler(params)
    try:
        info = handler.next_rendezvous()
        assert info.group_world_size >= 1
    finally:
        handler.shutdown()


def test_lookup_is_by_registration_class_and_typed(plugin_manager):
    backend = plugin_manager.get(RendezvousBackend, "c10d")
    assert isinstance(backend, RendezvousBackend) and backend.create_handler is not None
    assert plugin_manager.lookup(RendezvousBackend, "static").plugin.name == "builtin-rendezvous"
    with pytest.raises(TypeError, match="not a kind of registration"):
        plugin_manager.get("rendezvous backend", "c10d")


# -- unknown hooks -------------------------------------------------------------------------------

MISSPELLED = """
from launcher.plugins import hookimpl
from launcher.plugins.types import RendezvousBackend

@hookimpl
def launcher_rendezvous_backend():
    yield RendezvousBackend(name="typo", create_handler=lambda params: None)
"""


def test_unknown_hook_in_an_installed_plugin_is_a_usage_error(site):
    make_distribution(site, "my-dist", "1.0", {"thirdparty_typo": MISSPELLED},
                      {"launcher": {"my-plugin": "thirdparty_typo"}})
    with pytest.raises(InvalidPluginError) as info:
        get_plugin_manager(environ={})
    assert str(info.value) == (
        "plugin 'my-plugin' (my-dist 1.0) implements unknown hook 'launcher_rendezvous_backend': "
        "did you mean launcher_rendezvous_backends?"
    )
    assert info.value.exit_code == 2


def test_unknown_hook_in_a_registered_object_leaves_the_manager_as_it_was(plugin_manager):
    class Unrelated:
        @hookimpl
        def launcher_frobnicate(self):
            return []

    plugin = Unrelated()
    with pytest.raises(InvalidPluginError, match="unknown hook 'launcher_frobnicate'; launcher's hooks are "):
        plugin_manager.register_plugin(plugin)
    assert not plugin_manager.is_registered(plugin)
    assert "static" in plugin_manager.names(RendezvousBackend)


def test_an_optional_unknown_hook_is_allowed(plugin_manager, register_plugin):
    class Optional:
        @hookimpl(optionalhook=True)
        def launcher_from_a_later_version(self):
            return []

    register_plugin(Optional())
    assert "static" in plugin_manager.names(RendezvousBackend)


def test_the_unknown_hook_is_named_not_an_optional_one_beside_it(plugin_manager):
    class Mixed:
        # Its name sorts first, and pluggy finds implementations in dir() order.
        @hookimpl(optionalhook=True)
        def launcher_future_hook(self):
            return []

        @hookimpl
        def totally_unknown(self):
            return []

    plugin = Mixed()
    with pytest.raises(InvalidPluginError) as info:
        plugin_manager.register_plugin(plugin)
    assert "unknown hook 'totally_unknown'" in str(info.value)
    assert "launcher_future_hook" not in str(info.value)
    assert not plugin_manager.is_registered(plugin)


# -- hooks are called through pluggy ---------------------------------------------------------------


class HideStatic:
    """A new-style wrapper around the built-in hook: drops 'static', renames c10d's description."""

    @hookimpl(wrapper=True)
    def launcher_rendezvous_backends(self):
        import dataclasses

        results = yield
        changed = []
        for registrations in results:
            kept = [reg for reg in registrations if reg.name != "static"]
            changed.append(
                [dataclasses.replace(reg, description="c10d, wrapped") if reg.name == "c10d" else reg for reg in kept]
            )
        return changed


def test_a_wrapper_changes_what_the_builtins_provide(plugin_manager, register_plugin):
    register_plugin(HideStatic())
    # Other installed distributions (launcher-etcd) may add names of their own.
    names = plugin_manager.names(RendezvousBackend)
    assert "c10d" in names and "static" not in names
    with pytest.raises(PluginNotFoundError, match="unknown rendezvous backend 'static'"):
        plugin_manager.get(RendezvousBackend, "static")
    # The replaced registration is the wrapper's: it built it.
    provided = plugin_manager.lookup(RendezvousBackend, "c10d")
    assert provided.registration.description == "c10d, wrapped"
    assert "HideStatic" in provided.plugin.name
    # What it left alone is still the core's.
    assert plugin_manager.lookup(EventHandler, "null").plugin.name == "builtin-event-handlers"


def test_an_old_style_hookwrapper_works_and_owns_what_it_adds(plugin_manager, register_plugin):
    added = DeviceProvider(name="fromwrapper", count_devices=lambda: 2, accelerator=False)

    class AddOne:
        @hookimpl(hookwrapper=True)
        def launcher_device_providers(self):
            outcome = yield
            outcome.force_result([*outcome.get_result(), [added]])

    plugin = register_plugin(AddOne())
    provided = plugin_manager.lookup(DeviceProvider, "fromwrapper")
    assert provided.registration is added
    assert provided.plugin.name == plugin_manager.get_name(plugin)
    assert plugin_manager.lookup(DeviceProvider, "cpu").plugin.name == "builtin-devices"


def test_results_are_attributed_by_identity_not_position(plugin_manager, register_plugin):
    class Nothing:  # returns None: pluggy adds no result for it
        @hookimpl(tryfirst=True)
        def launcher_device_providers(self):
            return None

    class One:
        @hookimpl(trylast=True)
        def launcher_device_providers(self):
            yield DeviceProvider(name="onedev", count_devices=lambda: 1, accelerator=False)

    register_plugin(Nothing())
    one = register_plugin(One())
    assert plugin_manager.lookup(DeviceProvider, "onedev").plugin.name == plugin_manager.get_name(one)
    assert plugin_manager.lookup(DeviceProvider, "cuda").plugin.name == "builtin-devices"


def test_a_wrapper_returning_a_wrong_type_is_named(plugin_manager, register_plugin):
    class Wrong:
        @hookimpl(wrapper=True)
        def launcher_numa_strategies(self):
            results = yield
            return [*results, ["not a registration"]]

    register_plugin(Wrong())
    with pytest.raises(TypeError, match="expected numa strategy registrations"):
        plugin_manager.names(NumaStrategy)


def test_every_kind_is_a_class_with_its_hook():
    from launcher.plugins.hookspec import LauncherSpecs

    # launcher_flag_groups adds flags, not named registrations (test_flag_groups_are_collected).
    assert {cls.hook for cls in REGISTRATION_CLASSES} | {"launcher_flag_groups"} == {
        name for name in vars(LauncherSpecs) if name.startswith("launcher_")
    }
    assert len({cls.kind for cls in REGISTRATION_CLASSES}) == len(REGISTRATION_CLASSES)


def test_flag_groups_are_collected():
    from launcher.flags import Flag, FlagGroup
    from launcher.options import flag_groups
    from launcher.plugins import hookimpl

    def group(name):
        return FlagGroup(name=name, title=name, flags=(Flag(f"--{name}-x", help=""),), read=lambda values: name)

    class First:
        @hookimpl
        def launcher_flag_groups(self):
            yield group("first")
            yield group("second")

    class Single:
        @hookimpl
        def launcher_flag_groups(self):
            return [group("third")]

    manager = get_plugin_manager(load_entrypoints=False)
    manager.register_plugin(First())
    manager.register_plugin(Single())
    assert [g.name for g in manager.flag_groups()] == ["first", "second", "third"]  # registration order
    names = [g.name for g in flag_groups(manager)]
    assert names[-3:] == ["first", "second", "third"] and names[0] == "rendezvous"

    class Wrong:
        @hookimpl
        def launcher_flag_groups(self):
            yield "--not-a-group"

    manager.register_plugin(Wrong())
    with pytest.raises(InvalidPluginError, match="returned '--not-a-group' from launcher_flag_groups"):
        manager.flag_groups()

    class Clash:
        @hookimpl
        def launcher_flag_groups(self):
            yield FlagGroup(name="mine", title="mine", flags=(Flag("--hang-timeout", help=""),), read=lambda v: 0)

    clashing = get_plugin_manager(load_entrypoints=False)
    clashing.register_plugin(Clash())
    with pytest.raises(PluginConflictError, match="--hang-timeout is declared by the flag groups 'hangs' and 'mine'"):
        flag_groups(clashing)
