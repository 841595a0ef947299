"""The invariants checked after every trial: each a function of a :class:`TrialRecord` returning violations.

A record holds only what was observed (exit statuses, the agents' output, what was left in
``/proc`` and the namespaces, the job's progress files), so each invariant is a pure function,
tested on constructed records, and a campaign's violations are plain strings naming the trial.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from launcher.testing.chaos.faults import CATALOGUE
from launcher.testing.chaos.plan import Trial


@dataclass
class AgentRecord:
    """One agent of a trial: where it ran, how it ended, what it said."""

    host: int
    address: str
    #: Exit status (negative: killed by that signal); ``None``: the harness had to kill it (a hang).
    exit_code: int | None
    elapsed: float
    stdout: str = ""
    stderr: str = ""


@dataclass
class Injected:
    """One fault as carried out: when, and whom it hit (a worker fault: that rank's pid and rank)."""

    kind: str
    host: int
    at: float
    pid: int | None = None
    rank: int | None = None
    error: str | None = None


@dataclass
class TrialRecord:
    """Everything a trial left to judge it by."""

    trial: Trial
    tool: str
    agents: list[AgentRecord]
    #: Seconds within which every agent had to end (from the configured timeouts).
    bound: float
    injected: list[Injected] = field(default_factory=list)
    #: Processes left on each host after the agents ended: ``host -> ["pid cmdline", ...]``.
    leftovers: dict[int, list[str]] = field(default_factory=dict)
    #: Processes outside the hosts' namespaces that carry the trial's marker variable.
    marked_elsewhere: list[str] = field(default_factory=list)
    #: The training finished (rank 0 wrote its result) and the digest it wrote.
    finished: bool = False
    digest: str | None = None
    expected_digest: str = ""
    #: MIN nodes and the store survive every fault: the job must finish.
    must_finish: bool = False
    #: Lines each host's workers wrote to their own progress files: ``host -> [(time, line)]``.
    progress: dict[int, list[tuple[float, str]]] = field(default_factory=dict)


def _struck_hosts(record: TrialRecord) -> set[int]:
    return {i.host for i in record.injected if CATALOGUE[i.kind].strikes_agent}


def no_hang(record: TrialRecord) -> list[str]:
    """(1) Every agent ends within the bound computed from the configured timeouts."""
    return [f"invariant 1 (no hang): agent on h{a.host} still running after {a.elapsed:.0f} s "
            f"(bound {record.bound:.0f} s), killed by the harness"
            for a in record.agents if a.exit_code is None]


def no_leftovers(record: TrialRecord) -> list[str]:
    """(2) No process of the job left on any host, nor anywhere else with the trial's marker."""
    out = [f"invariant 2 (leftover): on h{host}: {', '.join(procs)}"
           for host, procs in record.leftovers.items() if procs]
    if record.marked_elsewhere:
        out.append(f"invariant 2 (leftover): outside the hosts: {', '.join(record.marked_elsewhere)}")
    return out


def true_verdict(record: TrialRecord) -> list[str]:
    """(3) No exit 0 unless the training finished; a survivable trial finishes with the uninterrupted result."""
    out = []
    if not record.finished:
        out += [f"invariant 3 (false success): agent on h{a.host} exited 0 but the training did not finish"
                for a in record.agents if a.exit_code == 0]
    if record.must_finish and not record.finished:
        out.append("invariant 3 (not finished): MIN nodes and the store survived but the training did not finish")
    if record.finished and record.digest != record.expected_digest:
        out.append(f"invariant 3 (wrong result): digest {record.digest}, an uninterrupted run gives "
                   f"{record.expected_digest}")
    return out


def no_false_failure(record: TrialRecord) -> list[str]:
    """(4) Where the training finished, only a killed, signalled, frozen or cut-off node exits non-zero."""
    if not record.finished:
        return []
    struck = _struck_hosts(record)
    return [f"invariant 4 (false failure): the training finished but agent on h{a.host} exited {a.exit_code}"
            + _last_line(a.stderr)
            for a in record.agents if a.exit_code not in (0, None) and a.host not in struck]


_ROOT = re.compile(r"Root cause \(first failure\):\n((?:  .*\n?)+)")
_FIELD = re.compile(r"^\s*(\w+)\s*: (.*)$", re.M)


def root_cause_named(record: TrialRecord) -> list[str]:
    """(5) Every report's root cause names the node and rank the fault hit (faults that fail a rank)."""
    out = []
    for hit in record.injected:
        if not CATALOGUE[hit.kind].fails_rank or hit.pid is None:
            continue
        victim_address = next((a.address for a in record.agents if a.host == hit.host), "")
        for agent in record.agents:
            for block in _ROOT.findall(agent.stderr + agent.stdout):
                fields = {m.group(1): m.group(2) for m in _FIELD.finditer(block)}
                node, pid, rank = fields.get("node", ""), fields.get("pid", ""), fields.get("rank", "")
                if victim_address not in node or (pid.strip() != str(hit.pid)
                                                   and not rank.startswith(f"{hit.rank} ")):
                    out.append(f"invariant 5 (root cause): h{agent.host}'s report names {node.strip()} rank "
                               f"{rank.strip()} pid {pid.strip()}, the fault hit h{hit.host} rank {hit.rank} "
                               f"pid {hit.pid}")
    return out


#: A frame of the launching tool's own code (launcher's, or torchrun's torch/distributed/launcher|elastic).
_OWN_FRAME = re.compile(r'^\s*File "[^"]*/(launcher|elastic)/(?!testing/chaos/job\.py)[^"]*", line \d+')
_JOB_FRAME = re.compile(r'^\s*File "[^"]*/testing/chaos/job\.py", line \d+')


def _tracebacks(text: str) -> list[list[str]]:
    """The traceback blocks of ``text``, unprefixed ones only (a worker's under a prefix is its own)."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("Traceback (most recent call last):"):
            current = []
            blocks.append(current)
        elif current is not None and line.startswith((" ", "\t")):
            current.append(line)
        else:
            current = None
    return blocks


def clean_output(record: TrialRecord) -> list[str]:
    """(6) No traceback through launcher's own code in an agent's output, and every line a worker wrote
    before the fault reached its agent's output (except on a host whose agent the fault struck).

    A traceback with a frame of the training job is the worker's own (a single worker's output is not
    prefixed; an exception of the job passes through ``@launcher.recoverable``'s frame): not counted.
    """
    out = []
    for agent in record.agents:
        for block in _tracebacks(agent.stderr):
            own = [line for line in block if _OWN_FRAME.match(line)]
            frames = [line for line in block if line.lstrip().startswith('File "')]
            # Raised in torch and passed up through @launcher.recoverable's wrapper: the job's own.
            through_wrapper = any("/launcher/recovery/worker.py" in line for line in frames) and not (
                frames and _OWN_FRAME.match(frames[-1]))
            if own and not through_wrapper and not any(_JOB_FRAME.match(line) for line in block):
                out.append(f"invariant 6 (traceback): agent on h{agent.host}: {own[-1].strip()}")
                break
    first = min((i.at for i in record.injected), default=None)
    struck = _struck_hosts(record)
    for agent in record.agents:
        if agent.host in struck or first is None:
            continue
        said = agent.stdout + agent.stderr
        missing = [line for t, line in record.progress.get(agent.host, []) if t < first and line not in said]
        if missing:
            out.append(f"invariant 6 (lost output): h{agent.host}: {len(missing)} line(s) written before the fault "
                       f"are not in the agent's output, first: {missing[0]!r}")
    return out


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return f" ({lines[-1].strip()[:200]})" if lines else ""


#: Every invariant, in order.
INVARIANTS: tuple[Callable[[TrialRecord], list[str]], ...] = (
    no_hang, no_leftovers, true_verdict, no_false_failure, root_cause_named, clean_output,
)


def check(record: TrialRecord) -> list[str]:
    """Every violation of ``record``, each prefixed with the trial's seed and number (to replay it)."""
    return [f"[{record.trial.name}, {record.trial.fault_kind}, {record.tool}] {v}"
            for invariant in INVARIANTS for v in invariant(record)]


def report(record: TrialRecord) -> list[str]:
    """What a failing test prints for ``record``: the trial (with how to replay it), each
    violation, and each agent's exit and last stderr lines; empty when it broke no invariant."""
    found = check(record)
    if not found:
        return []
    lines = [record.trial.describe(), *(f"    {v}" for v in found)]
    lines += [f"    h{a.host} exited {a.exit_code}; stderr tail:\n" + "\n".join(
        "      " + line for line in a.stderr.splitlines()[-8:]) for a in record.agents]
    return lines


def invariant_number(violation: str) -> int:
    """The invariant a violation string breaks (1-6)."""
    match = re.search(r"invariant (\d)", violation)
    return int(match.group(1)) if match else 0
