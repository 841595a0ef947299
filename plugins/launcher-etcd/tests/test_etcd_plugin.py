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
from launcher_etcd.settings import ALL_CONFIG_KEYS, ETCD_KEYS


def test_registers_etcd_and_torchruns_etcd_v2_as_one_backend() -> None:
    manager = get_plugin_manager(load_entrypoints=False, environ={})
    manager.register_plugin(launcher_etcd.plugin)
    etcd = manager.get(RendezvousBackend, "etcd")
    assert isinstance(etcd, RendezvousBackend)
    assert manager.get(RendezvousBackend, "ETCD-V2") is etcd
    assert etcd.aliases == ("etcd-v2",) and etcd.create_handler is not None and etcd.create_store is None
    assert etcd.config_keys == ALL_CONFIG_KEYS and etcd.config_keys is not None
    # The plugin module declares the keys by name; the settings module holds their table.
    assert frozenset(ETCD_KEYS) == launcher_etcd.plugin.ETCD_KEY_NAMES
    torchrun_names = {"protocol", "cacert", "cert", "key", "ssl_cert", "ssl_cert_key", "ca_cert", "read_timeout",
                      "etcd_prefix", "last_call_timeout", "timeout"}  # fmt: skip
    core_names = {"join_timeout", "heartbeat_timeout", "keep_alive_interval", "keep_alive_max_attempt", "close_timeout"}
    assert torchrun_names | core_names | {"username", "password", "lease_ttl"} <= etcd.config_keys


def test_listing_backends_imports_no_etcd_client() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        from launcher.plugins.manager import get_plugin_manager
        from launcher.plugins.types import RendezvousBackend
        import launcher_etcd.plugin
        manager = get_plugin_manager(load_entrypoints=False, environ={})
        manager.register_plugin(launcher_etcd.plugin)
        manager.get(RendezvousBackend, "etcd")
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("etcd3gw", "requests", "urllib3", "torch")
                       or m == "launcher_etcd.settings")
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
        from launcher.plugins.types import RendezvousBackend
        provided = get_plugin_manager(environ={}).lookup(RendezvousBackend, "etcd-v2")
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


@pytest.mark.parametrize(
    ("endpoint", "conf", "words"),
    [
        ("", {}, "needs --rdzv-endpoint"),
        (":::", {}, "not an IPv6 address"),
        ("a b:1", {}, "not a host name"),
        ("h:2379", {"join_timeout": "nan"}, "join_timeout must be a number of seconds"),
        # etcd reads torchrun's timeout as join_timeout; the message names the key the user typed.
        ("h:2379", {"timeout": "nan"}, "^--rdzv-conf timeout must be a number of seconds"),
        ("h:2379", {"read_timeout": "-1"}, "read_timeout must be a number of seconds"),
        ("h:2379", {"lease_ttl": "inf"}, "lease_ttl must be a number of seconds from 2"),
        ("h:2379", {"lease_ttl": "1"}, "lease_ttl must be a number of seconds from 2"),
        ("h:2379", {"protocol": "ftp"}, "use http or https"),
        ("h:2379", {"store_type": "tcp"}, "'store_type' is unknown to the etcd backend"),
    ],
)
def test_every_value_is_checked_before_anything_starts(endpoint: str, conf: dict[str, str], words: str) -> None:
    """Through the registry, as the CLI and the Python API check: a usage error, no connection tried."""
    from launcher.config import LaunchConfig
    from launcher.errors import UsageError
    from launcher.rendezvous.registry import check_rendezvous_config

    manager = get_plugin_manager(load_entrypoints=False, environ={})
    manager.register_plugin(launcher_etcd.plugin)
    config = LaunchConfig(min_nodes=1, max_nodes=2, rdzv_backend="etcd", rdzv_endpoint=endpoint,
                          rdzv_configs=conf, run_id="j")  # fmt: skip
    with pytest.raises(UsageError, match=words) as info:
        check_rendezvous_config(config, manager)
    assert "\n" not in str(info.value)


def test_an_endpoint_host_that_dns_says_does_not_exist_fails_at_once() -> None:
    """Not after read_timeout of retries: the resolver's NXDOMAIN is final (RFC 6761 .invalid)."""
    import socket

    from etcd_helpers import node_params
    from launcher.rendezvous.api import RendezvousError
    from launcher_etcd.backend import connect
    from launcher_etcd.settings import EtcdSettings

    try:
        socket.getaddrinfo("nosuch.invalid", 2379)
    except socket.gaierror as exc:
        if exc.errno != socket.EAI_NONAME:
            pytest.skip(f"this resolver does not answer 'no such name' for .invalid: {exc}")
    else:
        pytest.skip(".invalid resolves here")
    settings = EtcdSettings.from_parameters(node_params("nosuch.invalid:2379,nosuch2.invalid", "j", read_timeout="30"))
    with pytest.raises(RendezvousError, match=r"cannot resolve the etcd endpoint host\(s\) 'nosuch.invalid', "
                       r"'nosuch2.invalid'") as info:  # fmt: skip
        connect(settings, "j")
    assert "\n" not in str(info.value)
