"""The Python API: LaunchConfig and launch(config, entrypoint)(*args)."""

from __future__ import annotations

import os
import sys
import time

import pytest
from launcher import LaunchConfig, launch
from launcher.api import WorkerFailedError
from launcher.errors import UsageError


def rank_times(scale: int) -> int:
    return int(os.environ["RANK"]) * scale


def fail_on_rank_one() -> str:
    if os.environ["RANK"] == "1":
        raise SystemExit(3)
    return "ok"


def fail_first_attempt() -> int:
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "0":
        os._exit(2)
    return int(os.environ["TORCHELASTIC_RESTART_COUNT"])


@pytest.mark.parametrize("start_method", ["spawn", "fork", "forkserver"])
def test_function_returns_per_rank_values(start_method):
    config = LaunchConfig(nproc_per_node=3, start_method=start_method)
    assert launch(config, rank_times)(10) == {0: 0, 1: 10, 2: 20}


def test_function_failure_raises_with_every_failure():
    with pytest.raises(WorkerFailedError) as info:
        launch(LaunchConfig(nproc_per_node=2), fail_on_rank_one)()
    failures = info.value.failures
    assert [f.rank for f in failures] == [1]
    assert failures[0].exitcode == 3
    assert "exit code 3" in str(info.value)


def _claim(path: str) -> str:
    """Unpickled in each spawned worker's bootstrap, before its setsid(): the first one to get here
    claims ``path`` with its pid and takes 3 s more; the other goes on at once."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return path
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    time.sleep(3)
    return path


class SlowForOneWorker:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (_claim, (self.path,))


def fail_unless_slow(path: str) -> str:
    with open(path) as claimed:
        if claimed.read() == str(os.getpid()):
            return "ok"
    raise SystemExit(3)


def test_a_worker_stopped_before_its_setsid_gets_the_signal(tmp_path):
    # One worker fails while the other still unpickles its arguments, before it leads a process
    # group of its own: the stop must reach it at once, not after the 30 s grace and a SIGKILL.
    start = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        launch(LaunchConfig(nproc_per_node=2), fail_unless_slow)(SlowForOneWorker(str(tmp_path / "claim")))
    assert [f.exitcode for f in info.value.failures] == [3]
    assert time.monotonic() - start < 20


def test_function_restart():
    assert launch(LaunchConfig(nproc_per_node=2, max_restarts=1), fail_first_attempt)() == {0: 1, 1: 1}


def test_command_entrypoint(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    code = f"import os; open(os.path.join({str(out)!r}, os.environ['RANK']), 'w').close()"
    assert launch(LaunchConfig(nproc_per_node=2), sys.executable)("-c", code) == {0: None, 1: None}
    assert sorted(os.listdir(out)) == ["0", "1"]


def test_invalid_config_is_a_usage_error():
    with pytest.raises(UsageError, match="nproc-per-node"):
        LaunchConfig(nproc_per_node=0)
    with pytest.raises(UsageError, match="event handler"):
        launch(LaunchConfig(event_log_handlers=["nope"]), rank_times)(1)
