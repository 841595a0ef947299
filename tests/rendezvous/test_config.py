"""``--rdzv-conf`` keys of the core's rendezvous: table, parsing, validation."""

from __future__ import annotations

import pytest
from launcher.rendezvous.api import RendezvousConfigError
from launcher.rendezvous.config import CONFIG_KEYS, DynamicRendezvousConfig, check_config_keys

TORCHRUN_KEYS = {
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "read_timeout",
    "is_host",
    "heartbeat_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "store_type",
    "timeout",
}


def test_table_keeps_every_torchrun_c10d_key() -> None:
    assert set(CONFIG_KEYS) >= TORCHRUN_KEYS
    assert set(CONFIG_KEYS) - TORCHRUN_KEYS == {"stable_rank0", "join_networks", "secret_file"}
    assert all(key.help for key in CONFIG_KEYS.values())


def test_defaults_are_torchruns() -> None:
    config = DynamicRendezvousConfig.from_mapping({}, known=CONFIG_KEYS)
    assert (config.join_timeout, config.last_call_timeout, config.close_timeout, config.read_timeout) == (
        600.0,
        30.0,
        30.0,
        60.0,
    )
    assert (config.keep_alive_interval, config.keep_alive_max_attempt) == (5.0, 3)
    assert config.liveness_timeout == 15.0
    assert config.is_host is None and config.store_type == "tcp" and not config.stable_rank0


def test_values_are_parsed() -> None:
    config = DynamicRendezvousConfig.from_mapping(
        {
            "join_timeout": "12.5",
            "last_call_timeout": "0.5",
            "is_host": "yes",
            "keep_alive_interval": "2",
            "keep_alive_max_attempt": "4",
            "store_type": "FILE",
            "stable_rank0": "1",
            "timeout": "999",
        },
        known=CONFIG_KEYS,
    )
    assert config.join_timeout == 12.5 and config.last_call_timeout == 0.5
    assert config.is_host is True and config.stable_rank0 is True
    assert config.store_type == "file"
    assert config.liveness_timeout == 8.0
    assert DynamicRendezvousConfig.from_mapping({"heartbeat_timeout": "7"}).liveness_timeout == 7.0


def test_unknown_key_lists_the_known_ones() -> None:
    with pytest.raises(RendezvousConfigError) as caught:
        DynamicRendezvousConfig.from_mapping({"join_timout": "5"}, known=CONFIG_KEYS)
    message = str(caught.value)
    assert "'join_timout'" in message
    for key in CONFIG_KEYS:
        assert key in message
    with pytest.raises(RendezvousConfigError, match="unknown to the etcd rendezvous"):
        check_config_keys({"x": "1"}, {"y"}, backend="etcd")


def test_unknown_keys_pass_when_not_checked() -> None:
    assert DynamicRendezvousConfig.from_mapping({"plugin_key": "1"}).join_timeout == 600.0


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("join_timeout", "soon", "must be a number"),
        ("join_timeout", "0", "must be a number of seconds above 0 and at most 604800"),
        ("last_call_timeout", "-1", "must be a number of seconds above 0 and at most 604800"),
        ("read_timeout", "0", "must be a number of seconds above 0 and at most 604800"),
        ("keep_alive_interval", "0", "must be a number of seconds above 0 and at most 604800"),
        ("keep_alive_max_attempt", "0", "must be an integer from 1 to 1000"),
        ("keep_alive_max_attempt", "2.5", "must be an integer"),
        ("is_host", "maybe", "true or false"),
        ("store_type", "etcd", "tcp or file"),
    ],
)
def test_invalid_values(key: str, value: str, match: str) -> None:
    with pytest.raises(RendezvousConfigError, match=match):
        DynamicRendezvousConfig.from_mapping({key: value}, known=CONFIG_KEYS)


def test_heartbeat_timeout_must_outlast_the_heartbeat_interval() -> None:
    with pytest.raises(RendezvousConfigError, match="longer than keep_alive_interval"):
        DynamicRendezvousConfig.from_mapping({"heartbeat_timeout": "5"})
    with pytest.raises(RendezvousConfigError, match="longer than keep_alive_interval"):
        DynamicRendezvousConfig(keep_alive_interval=1.0, heartbeat_timeout=0.5)


def test_builtin_c10d_registration_accepts_exactly_the_core_keys() -> None:
    from launcher.plugins.builtin.rendezvous import C10D_CONFIG_KEYS
    from launcher.rendezvous.config import CONFIG_KEYS

    assert set(C10D_CONFIG_KEYS) == set(CONFIG_KEYS)


def test_builtin_static_registration_accepts_the_static_keys() -> None:
    from launcher.plugins.builtin.rendezvous import STATIC_CONFIG_KEYS
    from launcher.rendezvous.static import CONFIG_KEYS

    assert set(STATIC_CONFIG_KEYS) == set(CONFIG_KEYS)
    assert {"join_networks", "secret_file"} <= set(CONFIG_KEYS)
