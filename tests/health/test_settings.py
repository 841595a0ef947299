"""--health-checks and --health-check-cmd: parsing, and bad input (one line, exit 2, nothing started)."""

from __future__ import annotations

import pytest
from launcher.errors import UsageError
from launcher.health.settings import HealthSettings, parse_health_check_cmd, parse_health_checks, resolve_health_checks
from launcher.plugins.errors import PluginNotFoundError
from launcher.plugins.manager import get_plugin_manager

from tests.conftest import run_launcher


def test_parse_names():
    assert parse_health_checks(None) is None
    assert parse_health_checks("  ") is None
    assert parse_health_checks("none") == ()
    assert parse_health_checks(" GPU, disk,gpu ") == ("gpu", "disk")
    with pytest.raises(UsageError, match="empty name"):
        parse_health_checks("gpu,,disk")
    with pytest.raises(UsageError, match="goes alone"):
        parse_health_checks("gpu,none")


def test_resolve_defaults_and_unknown_names():
    manager = get_plugin_manager(autoload=False)  # the core's own checks only
    names = [c.name for c in resolve_health_checks(HealthSettings(), manager)]
    assert names == ["gpu", "disk", "python", "command"]
    assert resolve_health_checks(HealthSettings(()), manager) == ()
    with pytest.raises(PluginNotFoundError, match="did you mean disk"):
        resolve_health_checks(HealthSettings(("dsik",)), manager)
    with pytest.raises(UsageError, match="leaves out the 'command' check"):
        resolve_health_checks(HealthSettings(("gpu",), "/bin/true"), manager)


def test_command_path(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert parse_health_check_cmd(None) is None
    assert parse_health_check_cmd("/bin/true") == "/bin/true"
    with pytest.raises(UsageError, match="does not exist"):
        parse_health_check_cmd(str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="not executable"):
        parse_health_check_cmd(str(plain))
    with pytest.raises(UsageError, match="not a file"):
        parse_health_check_cmd(str(tmp_path))


@pytest.mark.parametrize(("args", "env", "words"), [
    (["--health-checks", "gpuu"], {}, "unknown health check 'gpuu': did you mean gpu?"),
    ([], {"PET_HEALTH_CHECKS": "disk,pyhton"}, "unknown health check 'pyhton': did you mean python?"),
    (["--health-check-cmd", "{tmp}/missing"], {}, "does not exist"),
    (["--health-check-cmd", "{tmp}/plain"], {}, "is not executable"),
    ([], {"PET_HEALTH_CHECK_CMD": "{tmp}/plain"}, "PET_HEALTH_CHECK_CMD"),
    ([], {"LAUNCHER_HEALTH_MIN_FREE_GIB": "lots"}, "LAUNCHER_HEALTH_MIN_FREE_GIB='lots' must be a number"),
])
def test_bad_input_is_one_line_exit_2_and_starts_nothing(tmp_path, args, env, words):
    (tmp_path / "plain").write_text("x")
    marker = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    env = {k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()}
    result = run_launcher(["--standalone", *args, str(script)], env=env, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launcher: error: "), result.stderr
    assert words in lines[0]
    assert not marker.exists()
