"""``--rdzv-conf join_networks`` and ``secret_file`` (or ``LAUNCHER_RDZV_SECRET``): the store's admission."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest
from launcher.rendezvous.api import RendezvousConfigError
from launcher.rendezvous.config import CONFIG_KEYS, SECRET_ENV, DynamicRendezvousConfig, store_admission

from tests.conftest import run_launcher

SECRET = "0123456789abcdef0123"


def secret_file(tmp_path: Path, text: str = SECRET, mode: int = 0o600) -> str:
    path = tmp_path / "secret"
    path.write_text(text + "\n")
    os.chmod(path, mode)
    return str(path)


def test_nothing_configured_means_no_admission() -> None:
    assert store_admission({}, environ={}) is None
    assert DynamicRendezvousConfig.from_mapping({}, known=CONFIG_KEYS).store_admission is None


def test_networks_are_semicolon_separated(tmp_path: Path) -> None:
    admission = store_admission({"join_networks": "10.0.0.0/8; fd00::/8;"}, environ={})
    assert admission is not None and admission.secret is None
    assert admission.networks == (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8"))


def test_secret_from_a_file_or_the_environment(tmp_path: Path) -> None:
    from_file = store_admission({"secret_file": secret_file(tmp_path)}, environ={})
    assert from_file is not None and from_file.secret == SECRET.encode()
    from_env = store_admission({}, environ={SECRET_ENV: SECRET})
    assert from_env is not None and from_env.secret == SECRET.encode() and not from_env.networks
    config = DynamicRendezvousConfig.from_mapping({"secret_file": secret_file(tmp_path)}, known=CONFIG_KEYS)
    assert config.store_admission is not None and config.store_admission.secret == SECRET.encode()


@pytest.mark.parametrize(
    ("config", "env", "message"),
    [
        ({"join_networks": "10.0.0.0/8,fd00::/8"}, {}, "not an address range"),
        ({"join_networks": "10.0.0.0/40"}, {}, "not an address range"),
        ({"join_networks": ";"}, {}, "join_networks is empty"),
        ({"secret_file": "/nonexistent/secret"}, {}, "cannot read it"),
        ({}, {SECRET_ENV: "short"}, "shorter than 16 bytes"),
    ],
)
def test_bad_settings_are_one_line_errors(config: dict[str, str], env: dict[str, str], message: str) -> None:
    with pytest.raises(RendezvousConfigError, match=message) as info:
        store_admission(config, environ=env)
    assert "\n" not in str(info.value)


def test_secret_file_must_be_private_long_and_alone(tmp_path: Path) -> None:
    with pytest.raises(RendezvousConfigError, match="chmod o-r"):
        store_admission({"secret_file": secret_file(tmp_path, mode=0o644)}, environ={})
    with pytest.raises(RendezvousConfigError, match="shorter than 16"):
        store_admission({"secret_file": secret_file(tmp_path, "tiny")}, environ={})
    with pytest.raises(RendezvousConfigError, match="not both"):
        store_admission({"secret_file": secret_file(tmp_path)}, environ={SECRET_ENV: SECRET})


@pytest.mark.timeout(60)
def test_command_line_error_exits_2_without_starting_workers(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "w.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    result = run_launcher(
        [
            "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
            "--rdzv-conf", "join_networks=10.0.0.0/40,is_host=true,join_timeout=5",
            str(script),
        ]
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "join_networks" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()
