"""The collectives' own record at a hang: which rank did not enter collective #N, who waits in it.

PyTorch's flight recorder (``TORCH_FR_BUFFER_SIZE`` entries per process, ring buffer) records
every collective a rank enters: its process group, its sequence number in that group
(``collective_seq_id``), the op (``gloo:all_reduce``, ``nccl:all_reduce``), the tensor sizes,
and whether it completed. With ``--hang-timeout`` the agent sets the buffer in the workers'
environment (:func:`arm_environment`, unless the user set it) and, at a hang, asks each worker
for its record through a named pipe its start-up hook serves (:mod:`launcher.hangs.flightrec_worker`,
:func:`request`). Each node reduces its ranks' records to a few fields per process group
(:func:`summarise`), carried in its hang summary; the node that builds the joined report
compares them (:func:`analyse`, a pure function):

* in each process group, collective #N is the latest any member entered;
* members whose last entered collective is below N did not enter it: they are what the others
  wait for;
* members that entered N and have not completed it are inside it.

A rank that did not enter a collective others wait in, and is not itself inside an unfinished
collective of any group, is *blamed*: it is doing something else (a data loader, a sleep, a
different code path), and every other rank waits for it. The hang report, ``launcher status``
and the failure report's root cause name it.

The same parser reads gloo's records and NCCL's (``nccl:`` ops, ``pg_config`` with members,
``started``/``completed`` states): see ``tests/hangs/data/``.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import json
import os
import time
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.hangs.flightrec_worker import FILE_ENV, REQUEST_ENV
from launcher.hangs.stacks import STOPPED_NOTE, is_stopped_state, native_state

#: The variable torch reads (2.13); the older name it still reads when this one is unset.
BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
LEGACY_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
#: Entries each process keeps (per process, all its groups together) when the user sets none.
DEFAULT_BUFFER = 2000
#: The default group's name in torch (``process_group`` ``["0", "default_pg"]``).
DEFAULT_GROUP = "0"


def arm_environment(env: MutableMapping[str, str], request: str, out: str) -> bool:
    """Make the worker started with ``env`` record its collectives and serve dumps: ``request``
    is the named pipe made here, ``out`` where the worker writes its record. The buffer is set
    only when the user set neither of torch's variables; ``False`` when the pipe cannot be made."""
    if BUFFER_ENV not in env and LEGACY_BUFFER_ENV not in env:
        env[BUFFER_ENV] = str(DEFAULT_BUFFER)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(request)
    try:
        os.mkfifo(request, 0o600)
    except OSError:
        env.pop(REQUEST_ENV, None)
        return False
    env[REQUEST_ENV] = request
    env[FILE_ENV] = out
    return True


def request(targets: Sequence[tuple[int, str, str]], timeout: float = 3.0,
            pids: Mapping[int, int] | None = None) -> dict[int, dict[str, Any]]:
    """Ask each worker of ``targets`` (``(local_rank, pipe, out file)``) for its record at once;
    the records read within ``timeout`` seconds. A rank whose worker cannot answer gets
    ``{"launcher_note": why}``. ``pids``: each local rank's worker pid, to tell a stopped worker
    (state T, which cannot answer) from one that serves no dumps."""
    def stopped(local_rank: int) -> bool:
        pid = (pids or {}).get(local_rank)
        return pid is not None and is_stopped_state(native_state(pid))

    found: dict[int, dict[str, Any]] = {}
    pending: dict[int, str] = {}
    for local_rank, pipe, out in targets:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out)
        if stopped(local_rank):  # its serving thread is stopped too: no reader on the pipe
            found[local_rank] = {"launcher_note": STOPPED_NOTE}
            continue
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            why = ("its start-up hook serves no flight-recorder dumps (an interpreter started with -I, -S or -E, "
                   "or a program that is not Python)" if exc.errno in (errno.ENXIO, errno.ENOENT)
                   else f"cannot ask it: {exc.strerror or exc}")
            found[local_rank] = {"launcher_note": why}
            continue
        try:
            os.write(fd, b"d")
        finally:
            os.close(fd)
        pending[local_rank] = out
    deadline = time.monotonic() + timeout
    while pending:
        for local_rank, out in list(pending.items()):
            try:
                with open(out, encoding="utf-8") as handle:
                    found[local_rank] = dict(json.load(handle))
            except FileNotFoundError:
                continue
            except (OSError, ValueError, TypeError) as exc:
                found[local_rank] = {"launcher_note": f"unreadable record: {exc}"}
            del pending[local_rank]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    for local_rank in pending:  # stopped while asked, or busy
        why = STOPPED_NOTE if stopped(local_rank) else f"no record within {timeout:g} s"
        found[local_rank] = {"launcher_note": why}
    return found


# -- one rank's record, reduced ----------------------------------------------------------------


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _members(value: Any) -> list[int] | None:
    """``[0, 1]`` from torch's ``pg_config`` ``ranks`` (a string ``"[0, 1]"`` in its dumps)."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return None
    if not isinstance(value, (list, tuple)) or not value:
        return None
    try:
        return sorted(int(rank) for rank in value)
    except (TypeError, ValueError):
        return None


def summarise(dump: Mapping[str, Any]) -> dict[str, Any]:
    """One rank's record reduced to what :func:`analyse` needs, per process group (by name)::

        {"rank": 1, "groups": {"0": {"desc": "default_pg", "ranks": [0, 1], "entered": 5,
                                     "completed": 5, "op": "gloo:all_reduce", "sizes": [[4]]}}}

    ``entered``: the highest collective sequence number recorded; ``completed``: the highest
    known complete (``-1``: none). Point-to-point entries are left out (they have their own
    numbering). ``note`` instead of ``groups`` when the rank has no record.
    """
    rank = dump.get("launcher_rank")
    out: dict[str, Any] = {"rank": None if rank is None else _int(rank)}
    if dump.get("launcher_note"):
        out["note"] = str(dump["launcher_note"])
        return out
    config = dump.get("pg_config") or {}
    declared = dump.get("launcher_pg_ranks") or {}
    groups: dict[str, dict[str, Any]] = {}
    names_by_id: dict[str, str] = {}
    for entry in dump.get("entries") or []:
        if entry.get("is_p2p"):
            continue
        group = entry.get("process_group") or ["", ""]
        name, desc = str(group[0]), str(group[1]) if len(group) > 1 else ""
        names_by_id[str(entry.get("pg_id"))] = name
        seq = _int(entry.get("collective_seq_id"), 0)
        state = groups.setdefault(name, {"desc": desc, "ranks": None, "entered": 0, "completed": -1, "op": "",
                                         "sizes": []})
        if seq >= state["entered"]:
            # Coalesced ops share a number: the last entry of the number (torch's ``coalesced``) stands.
            state["entered"] = seq
            state["op"] = str(entry.get("profiling_name") or "")
            state["sizes"] = entry.get("input_sizes") or []
        if entry.get("retired") or entry.get("state") == "completed":
            state["completed"] = max(state["completed"], seq)
    for pg_id, status in (dump.get("pg_status") or {}).items():
        known = names_by_id.get(str(pg_id))
        if known is None or not isinstance(status, Mapping):
            continue
        state = groups[known]
        state["completed"] = max(state["completed"], _int(status.get("last_completed_collective")))
    for name, state in groups.items():
        state["ranks"] = _members(declared.get(name)) or _members((config.get(name) or {}).get("ranks"))
    out["groups"] = groups
    return out


# -- every rank's records, compared ------------------------------------------------------------


@dataclass
class Verdict:
    """One process group's unfinished collective: who did not enter it, who is inside."""

    group: str
    desc: str
    seq: int
    op: str
    sizes: Any
    #: Members that did not enter it: rank -> the last collective number it entered (0: none).
    behind: dict[int, int] = field(default_factory=dict)
    #: Members inside it (entered, not complete).
    inside: list[int] = field(default_factory=list)
    #: Members without a record (another node's that did not answer, a rank that exited).
    unknown: list[int] = field(default_factory=list)
    #: Members inside it that disagree on the op or the sizes, in one line (empty when none do).
    mismatch: str = ""

    def group_label(self) -> str:
        desc = f" ({self.desc})" if self.desc and self.desc != "undefined" else ""
        return f"process group {self.group}{desc}"

    def collective_label(self) -> str:
        sizes = f", sizes {json.dumps(self.sizes, separators=(',', ':'))}" if self.sizes else ""
        return f"collective #{self.seq} {self.op or '(unnamed op)'}{sizes}"

    def lines(self) -> list[str]:
        from launcher.hangs.report import rank_ranges

        parts = []
        if self.behind:
            lasts = sorted(set(self.behind.values()))
            last = (f"last entered #{lasts[0]}" if len(lasts) == 1 else
                    "last entered " + ", ".join(f"#{n}" for n in lasts))
            parts.append(f"not entered by {_ranks_label(self.behind, rank_ranges)} ({last})")
        if self.inside:
            parts.append(f"{_ranks_label(self.inside, rank_ranges)} inside it")
        if self.unknown:
            parts.append(f"no record from {_ranks_label(self.unknown, rank_ranges)}")
        text = f"{self.group_label()}, {self.collective_label()}: " + "; ".join(parts)
        return [text] + ([f"  ranks disagree on it: {self.mismatch}"] if self.mismatch else [])

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "desc": self.desc, "seq": self.seq, "op": self.op, "sizes": self.sizes,
                "behind": {str(rank): last for rank, last in sorted(self.behind.items())},
                "inside": list(self.inside), "unknown": list(self.unknown), "mismatch": self.mismatch or None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(group=str(data.get("group", "")), desc=str(data.get("desc") or ""), seq=_int(data.get("seq"), 0),
                   op=str(data.get("op") or ""), sizes=data.get("sizes") or [],
                   behind={int(rank): _int(last, 0) for rank, last in (data.get("behind") or {}).items()},
                   inside=[int(rank) for rank in data.get("inside") or []],
                   unknown=[int(rank) for rank in data.get("unknown") or []], mismatch=str(data.get("mismatch") or ""))


def _ranks_label(ranks: Iterable[int], rank_ranges: Any) -> str:
    ranks = sorted(set(ranks))
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"


@dataclass
class Analysis:
    """What the flight records of every rank say (see the module docstring)."""

    verdicts: list[Verdict] = field(default_factory=list)
    #: Ranks the records blame, in rank order (empty when they blame none).
    blamed: list[int] = field(default_factory=list)
    #: Ranks without a record, and why.
    no_record: dict[int, str] = field(default_factory=dict)

    def blame_text(self, rank: int) -> str:
        """``did not enter collective #6 gloo:all_reduce of process group 0 (default_pg)``."""
        for verdict in self.verdicts:
            if rank in verdict.behind and verdict.inside:
                return f"did not enter {verdict.collective_label()} of {verdict.group_label()}"
        return "blamed by the flight recorder"

    def lines(self) -> list[str]:
        """The report's lines (none when there is nothing to say)."""
        from launcher.hangs.report import rank_ranges

        lines = []
        for verdict in self.verdicts:
            lines += verdict.lines()
        if self.blamed:
            lines.append(f"blamed: {_ranks_label(self.blamed, rank_ranges)} (not in a collective the others wait in)")
        notes: dict[str, list[int]] = {}
        for rank, why in self.no_record.items():
            notes.setdefault(why, []).append(rank)
        for why, ranks in sorted(notes.items(), key=lambda item: min(item[1])):
            lines.append(f"no record from {_ranks_label(ranks, rank_ranges)}: {why}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"verdicts": [verdict.to_dict() for verdict in self.verdicts], "blamed": list(self.blamed),
                "no_record": {str(rank): why for rank, why in sorted(self.no_record.items())}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Analysis:
        return cls(verdicts=[Verdict.from_dict(item) for item in data.get("verdicts") or []],
                   blamed=[int(rank) for rank in data.get("blamed") or []],
                   no_record={int(rank): str(why) for rank, why in (data.get("no_record") or {}).items()})


def analyse(records: Mapping[int, Mapping[str, Any]], world_size: int | None = None) -> Analysis:
    """Compare every rank's :func:`summarise`\\ d record (keyed by global rank).

    ``world_size``: members of the default group without a record count as unknown. A group's
    members are those its records declare; where none do (an old dump), every rank that recorded
    the group, and every rank for the default group.
    """
    analysis = Analysis()
    groups: dict[str, dict[int, Mapping[str, Any]]] = {}
    declared: dict[str, set[int]] = {}
    descs: dict[str, str] = {}
    for rank, record in records.items():
        if record.get("note"):
            analysis.no_record[rank] = str(record["note"])
            continue
        for name, state in (record.get("groups") or {}).items():
            groups.setdefault(name, {})[rank] = state
            declared.setdefault(name, set()).update(state.get("ranks") or ())
            descs.setdefault(name, str(state.get("desc") or ""))
    everyone = set(records) | set(range(world_size or 0))
    with_record = {rank for rank, record in records.items() if not record.get("note")}
    for name in sorted(groups, key=lambda n: (n != DEFAULT_GROUP, _int(n, 1 << 30), n)):
        seen = groups[name]
        members = declared[name] or (everyone if name == DEFAULT_GROUP or descs[name] == "default_pg" else set(seen))
        latest = max(_int(state.get("entered"), 0) for state in seen.values())
        if latest <= 0:
            continue
        at_latest = {rank: state for rank, state in seen.items() if _int(state.get("entered"), 0) == latest}
        behind = {rank: _int(seen[rank].get("entered"), 0) if rank in seen else 0
                  for rank in members if rank in with_record and rank not in at_latest}
        inside = sorted(rank for rank, state in at_latest.items() if _int(state.get("completed")) < latest)
        if not inside:
            # Nobody waits in it: finished wherever entered (a member "behind" here only lost the
            # group's entries to its ring buffer's newer ones).
            continue
        sample = at_latest[min(at_latest)]
        kinds: dict[str, list[int]] = {}
        for rank, state in sorted(at_latest.items()):
            kinds.setdefault(f"{state.get('op')} {json.dumps(state.get('sizes') or [])}", []).append(rank)
        mismatch = "; ".join(f"{key} on ranks {','.join(map(str, ranks))}" for key, ranks in kinds.items()) \
            if len(kinds) > 1 else ""
        analysis.verdicts.append(Verdict(
            group=name, desc=descs[name], seq=latest, op=str(sample.get("op") or ""), sizes=sample.get("sizes") or [],
            behind=behind, inside=inside, unknown=sorted(members - with_record), mismatch=mismatch,
        ))
    # Ranks others wait for, that wait in no unfinished collective themselves.
    waiting = {rank for verdict in analysis.verdicts for rank in verdict.inside}
    late = {rank for verdict in analysis.verdicts if verdict.inside for rank in verdict.behind}
    analysis.blamed = sorted(late - waiting) or sorted(late)
    return analysis
