"""Agents in namespace hosts: starting them, waiting for them, reading what they said."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.conftest import launcher_env
from tests.multinode.netns import Host

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ALLREDUCE = str(SCRIPTS / "allreduce_worker.py")
ELASTIC = str(SCRIPTS / "elastic_worker.py")
FAILING = str(SCRIPTS / "failing_worker.py")
#: The group forms, then each rank works alone for a set time, and may fail (see the script).
ENDING = str(SCRIPTS / "ending_worker.py")
#: Runs the launcher and notes whether the agent process loaded torch (see the script).
AGENT_MODULES = str(SCRIPTS / "agent_modules.py")
#: The repository root, so that ``tests.*`` and the editable ``launcher`` import the same way everywhere.
ROOT = str(Path(__file__).resolve().parents[2])


class AgentProcess:
    """One ``python -m launcher`` running inside a namespace host; output goes to two files."""

    def __init__(self, host: Host, name: str, args: Sequence[str], log_dir: Path, env: dict[str, str],
                 program: Sequence[str] = ("-m", "launcher")) -> None:
        self.host = host
        self.name = name
        self.args = list(args)
        self.stdout_path = log_dir / f"{name}.stdout"
        self.stderr_path = log_dir / f"{name}.stderr"
        self.started = time.monotonic()
        self.ended: float | None = None
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = host.popen(
                [sys.executable, *program, *self.args], env=env, stdout=out, stderr=err, cwd=ROOT
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def poll(self) -> int | None:
        code = self.process.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    def wait(self, timeout: float) -> int:
        """The exit status; fails the test (with both logs) if the agent is still running after ``timeout``."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"agent {self.name} still running after {timeout:g} s\n{self.describe()}") from None
        self.poll()
        return code

    @property
    def elapsed(self) -> float:
        """Seconds from start to exit (or to now while running)."""
        return (self.ended if self.ended is not None else time.monotonic()) - self.started

    def kill(self, signum: int = signal.SIGKILL) -> None:
        """Signal the agent process alone (not its workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signum)

    def describe(self, lines: int = 40) -> str:
        out = "\n".join(self.stdout.splitlines()[-lines:])
        err = "\n".join(self.stderr.splitlines()[-lines:])
        status = self.process.poll()
        return (
            f"--- agent {self.name} on {self.host.netns} ({self.host.addr}), exit status {status} ---\n"
            f"args: {' '.join(self.args)}\n--- stdout (tail) ---\n{out}\n--- stderr (tail) ---\n{err}\n"
        )


def wait_all(agents: Sequence[AgentProcess], timeout: float, *, expect: int | None = 0,
             context: Sequence[AgentProcess] = ()) -> list[int]:
    """Wait for every agent to exit; their exit statuses.

    With ``expect`` set, fails the test as soon as one agent exits with another status (instead
    of waiting for the rest); fails after ``timeout`` seconds in any case. The logs of
    ``agents`` and ``context`` go into the failure message.
    """
    deadline = time.monotonic() + timeout
    everyone = list(dict.fromkeys([*agents, *context]))
    while True:
        codes = [agent.poll() for agent in agents]
        for agent, code in zip(agents, codes, strict=True):
            if expect is not None and code is not None and code != expect:
                raise AssertionError(
                    f"agent {agent.name} exited with {code}, expected {expect}\n"
                    + "\n".join(a.describe() for a in everyone)
                )
        if all(code is not None for code in codes):
            return [int(code) for code in codes if code is not None]
        if time.monotonic() >= deadline:
            running = [a.name for a, c in zip(agents, codes, strict=True) if c is None]
            raise AssertionError(
                f"agents {running} still running after {timeout:g} s\n" + "\n".join(a.describe() for a in everyone)
            )
        time.sleep(0.2)


def agent_env(host: Host, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The agent's environment: gloo bound to the host's veth, INFO logs, one thread per worker."""
    env = launcher_env(
        {
            "GLOO_SOCKET_IFNAME": host.ifname,
            "OMP_NUM_THREADS": "1",
            "LOGLEVEL": "INFO",
            "MN_PG_TIMEOUT": "30",
        }
    )
    pythonpath = [ROOT, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    if extra:
        env.update(extra)
    return env


def free_port(host: Host) -> int:
    """A port the kernel of ``host``'s namespace calls free now (the namespace is the test's own,
    so nothing else takes it before the agent binds it)."""
    code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    if ":" in host.addr:
        code = code.replace("socket.socket()", "socket.socket(socket.AF_INET6)").replace("('', 0)", "('::', 0)")
    result = host.run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, *, interval: float = 0.1,
               on_timeout: Callable[[], str] | None = None) -> Any:
    """Poll ``predicate`` until it returns something true; that value. Fails the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = on_timeout() if on_timeout is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{detail}")
        time.sleep(interval)


def read_progress(state_dir: Path) -> list[dict[str, Any]]:
    """The records the elastic worker's rank 0 wrote, one per completed step (oldest first)."""
    path = state_dir / "progress.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return records


def all_reduce_ranks(text: str, world: int) -> dict[int, str]:
    """Global rank -> group rank, for every worker that printed a correct all_reduce."""
    total = world * (world + 1) // 2
    pattern = rf"rank (\d+) of {world} \(group rank (\d+)[^)]*\) all_reduce ok {total}\b"
    return {int(m.group(1)): m.group(2) for m in re.finditer(pattern, text)}

