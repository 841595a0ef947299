"""Registration: names, conf keys, lazy imports, and the distribution found by its entry point."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import launcher_etcd.plugin
import pytest
from etcd_servers import PYTHON, python_env
from launcher.plugins.manager import get_plugin_manager
from launcher.plugins.types import RendezvousBackend
from launcher_etcd.settings import ALL_CONFIG_KEYS


def test_registers_etcd_and_torchruns_etcd_v2_as_one_backend() -> None:
    manager = get_plugin_manager(load_entrypoints=False, environ={})
    manager.register_plugin(launcher_etcd.plugin)
    etcd = manager.get("rendezvous backend", "etcd")
    assert isinstance(etcd, RendezvousBackend)
    assert manager.get("rendezvous backend", "ETCD-V2") is etcd
    assert etcd.aliases == ("etcd-v2",) and etcd.create_handler is not None and etcd.create_store is None
    assert etcd.config_keys == ALL_CONFIG_KEYS and etcd.config_keys is not None
    torchrun_names = {"protocol", "cacert", "cert", "key", "ssl_cert", "ssl_cert_key", "ca_cert", "read_timeout",
                      "etcd_prefix", "last_call_timeout", "timeout"}  # fmt: skip
    core_names = {"join_timeout", "heartbeat_timeout", "keep_alive_interval", "keep_alive_max_attempt", "close_timeout"}
    assert torchrun_names | core_names | {"username", "password", "lease_ttl"} <= etcd.config_keys


def test_listing_backends_imports_no_etcd_client() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        from launcher.plugins.manager import get_plugin_manager
        import launcher_etcd.plugin
        manager = get_plugin_manager(load_entrypoints=False, environ={})
        manager.register_plugin(launcher_etcd.plugin)
        manager.get("rendezvous backend", "etcd")
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("etcd3gw", "requests", "urllib3", "torch"))
        print(json.dumps(heavy))
        """
    )
    result = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=python_env(), timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


@pytest.mark.slow
def test_installed_distribution_is_found_through_its_entry_point(installed_plugin: Path) -> None:
    code = textwrap.dedent(
        """
        import json
        from launcher.plugins.manager import get_plugin_manager
        provided = get_plugin_manager(environ={}).lookup("rendezvous backend", "etcd-v2")
        import launcher_etcd
        print(json.dumps([provided.plugin.distribution, provided.plugin.version, provided.registration.name,
                          launcher_etcd.__file__]))
        """
    )
    env = python_env({"PYTHONPATH": str(installed_plugin)})
    result = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=env, timeout=60, cwd="/")
    assert result.returncode == 0, result.stderr
    distribution, version, name, module = json.loads(result.stdout)
    assert (distribution, version, name) == ("launcher-etcd", "0.1.0", "etcd")
    assert module.startswith(str(installed_plugin))
