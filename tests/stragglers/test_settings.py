"""The straggler flags: defaults, the API's settings, and bad input (one line, exit 2, no worker)."""

from __future__ import annotations

import pytest
from launcher.errors import UsageError
from launcher.stragglers.settings import DEFAULT_INTERVAL, DEFAULT_THRESHOLD, straggler_settings

from tests.conftest import run_launcher


def test_api_settings() -> None:
    settings = straggler_settings(threshold="1.3", interval=2)
    assert settings.enabled and settings.threshold == 1.3 and settings.interval == 2.0
    assert settings.action == "report"
    # Accepted with a fixed --nnodes too: a spare may come.
    assert straggler_settings(action=" Exclude ").action == "exclude"
    assert straggler_settings(enabled=False).threshold == DEFAULT_THRESHOLD
    assert straggler_settings().interval == DEFAULT_INTERVAL
    with pytest.raises(UsageError, match="--straggler-threshold"):
        straggler_settings(threshold=0.5)


BAD = [
    (["--straggler-threshold", "fast"], "--straggler-threshold 'fast' is not a number"),
    (["--straggler-threshold", "0"], "--straggler-threshold '0' is out of range"),
    (["--straggler-threshold", "-1.5"], "--straggler-threshold '-1.5' is out of range"),
    (["--straggler-threshold", "1"], "--straggler-threshold '1' is out of range"),
    (["--straggler-threshold", "1e9"], "--straggler-threshold '1e9' is out of range"),
    (["--straggler-threshold", "nan"], "--straggler-threshold 'nan' is not a finite number"),
    (["--straggler-action", "reboot"], "--straggler-action 'reboot' is not an action: use report or exclude"),
    (["--straggler-interval", "0"], "--straggler-interval '0' is out of range"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, tmp_path) -> None:
    marker = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    result = run_launcher(["--standalone", "--nproc-per-node", "1", "--straggler-detection", *args, str(script)],
                          timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr and not marker.exists()


def test_bad_environment_variable_names_it(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    result = run_launcher(["--standalone", str(script)], env={"PET_STRAGGLER_THRESHOLD": "abc"}, timeout=60)
    assert result.returncode == 2 and "PET_STRAGGLER_THRESHOLD 'abc' is not a number" in result.stderr
