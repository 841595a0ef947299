"""--preemption-signals and --preemption-grace: parsing, and bad input (one line, exit 2, nothing started)."""

from __future__ import annotations

import signal

import pytest
from launcher.config import LaunchConfig
from launcher.errors import UsageError
from launcher.preemption.settings import (
    parse_preemption_grace,
    parse_preemption_signals,
    preemption_plan,
    preemption_settings,
)

from tests.conftest import run_launcher


def test_parse_signals():
    assert parse_preemption_signals(None) is None
    assert parse_preemption_signals(" SIGTERM, usr1 ,TERM") == (signal.SIGTERM, signal.SIGUSR1)
    assert parse_preemption_signals(["SIGUSR2"]) == (signal.SIGUSR2,)
    for bad, words in (("", "names no signal"), ("SIGTERM,,SIGUSR1", "empty item"),
                       ("SIGNOPE", "'SIGNOPE' is not a signal"), ("SIGKILL", "'SIGKILL' is not a signal"),
                       ("9", "'9' is not a signal")):
        with pytest.raises(UsageError, match=words):
            parse_preemption_signals(bad)


def test_parse_grace_and_the_plan():
    assert parse_preemption_grace(None) is None
    assert parse_preemption_grace(" ") is None
    assert parse_preemption_grace("2.5") == 2.5
    assert parse_preemption_grace(0) == 0.0
    for bad in ("-1", "nan", "inf", "1_0", "ten", "604801"):
        with pytest.raises(UsageError, match="--preemption-grace must be a number of seconds from 0 to 604800"):
            parse_preemption_grace(bad)
    assert preemption_plan(None, None, 30.0) is None  # off: a SIGTERM keeps torchrun's meaning
    plan = preemption_plan(None, 5.0, 30.0)
    assert plan is not None and plan.signals == (signal.SIGTERM,) and plan.grace == 5.0
    plan = preemption_plan((signal.SIGUSR1,), None, 12.0)  # the grace defaults to --shutdown-timeout
    assert plan is not None and plan.signals == (signal.SIGUSR1,) and plan.grace == 12.0


def test_the_python_api_checks_them_too():
    with pytest.raises(UsageError, match="--preemption-grace"):
        preemption_settings(grace=-3)
    with pytest.raises(UsageError, match="--preemption-signals"):
        preemption_settings(signals="SIGSTOP")
    config = LaunchConfig(settings={"preemption": preemption_settings(grace="7")})
    assert config.settings["preemption"].grace == 7.0


@pytest.mark.parametrize(("args", "env", "words"), [
    (["--preemption-grace", "-1"], {}, "--preemption-grace must be a number of seconds from 0 to 604800, got '-1'"),
    (["--preemption-grace", "soon"], {}, "--preemption-grace must be a number of seconds"),
    ([], {"PET_PREEMPTION_GRACE": "nan"}, "PET_PREEMPTION_GRACE must be a number of seconds"),
    (["--preemption-signals", "SIGTREM"], {}, "--preemption-signals: 'SIGTREM' is not a signal the launcher can catch"),
    (["--preemption-signals", ""], {}, "--preemption-signals '' names no signal"),
    ([], {"PET_PREEMPTION_SIGNALS": "TERM,"}, "PET_PREEMPTION_SIGNALS 'TERM,' has an empty item"),
    (["--requeue"], {}, "--requeue needs a Slurm job (SLURM_JOB_ID is not set)"),
    (["--requeue"], {"SLURM_JOB_ID": "42", "PATH": "/nonexistent"}, "scontrol is not on PATH"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, env, words):
    marker = tmp_path / "started"
    script = tmp_path / "w.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    result = run_launcher(["--standalone", *args, str(script)], env=env, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("launcher: error: "), result.stderr
    assert words in lines[0], result.stderr
    assert not marker.exists()
