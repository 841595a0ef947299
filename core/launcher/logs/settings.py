"""The log flags: where worker output goes (``--log-dir``, ``-r/--redirects``, ``-t/--tee``, filters, ``--logs-specs``).

Declared, parsed and checked here (:data:`FLAGS`); :func:`read_logs` gives one
:class:`LogSettings`. The value parsers are shared with the Python API's
:class:`~launcher.config.LaunchConfig`, which checks its fields with them.
"""

# No "from __future__ import annotations": typing.NamedTuple would compile every field's
# annotation string at import, which every launch pays.

from collections.abc import Sequence
from typing import NamedTuple

from launcher.errors import UsageError
from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import MAX_NPROC, parse_int, quote, read_int

__all__ = [
    "FLAGS",
    "STD_ALL",
    "STD_ERR",
    "STD_NONE",
    "STD_OUT",
    "LogSettings",
    "StdSpec",
    "check_std",
    "parse_filters",
    "parse_ranks_filter",
    "parse_std",
    "read_logs",
]

#: Std bitmask values, as torchrun's ``Std``: which streams go to files.
STD_NONE, STD_OUT, STD_ERR, STD_ALL = 0, 1, 2, 3

StdSpec = int | dict[int, int]


class LogSettings(NamedTuple):
    """The log flags, checked (local ranks against this node's worker count)."""

    log_dir: str | None
    redirects: StdSpec
    tee: StdSpec
    local_ranks_filter: frozenset[int] | None
    duplicate_stdout_filters: tuple[str, ...]
    duplicate_stderr_filters: tuple[str, ...]
    #: A LogsSpecs plugin's name (resolved when the plan is built), or ``None``.
    logs_specs: str | None


def check_std(spec: StdSpec, flag: str, nproc: int) -> None:
    """``--redirects``/``--tee`` values are 0-3, keyed (if at all) by local ranks below ``nproc``."""
    values = spec.values() if isinstance(spec, dict) else [spec]
    for value in values:
        if isinstance(value, bool) or value not in (0, 1, 2, 3):
            raise UsageError(f"{flag} values must be 0, 1, 2 or 3, got {quote(value)}")
    if isinstance(spec, dict):
        for rank in spec:
            parse_int(rank, f"{flag} local rank", 0, nproc - 1)


def parse_std(value: str, flag: str) -> StdSpec:
    """torchrun's Std format: ``3`` for every rank, or ``0:1,1:2`` per local rank."""
    text = value
    hint = f"{flag} {quote(value)} is invalid: use 0-3 for every rank, or LOCAL_RANK:0-3 pairs like 0:1,1:2"
    if text == "":
        return STD_NONE
    if ":" not in text:
        if text not in ("0", "1", "2", "3"):
            raise UsageError(hint)
        return int(text)
    mapping: dict[int, int] = {}
    for item in text.split(","):
        rank_text, sep, std = item.partition(":")
        rank = read_int(rank_text)
        if not sep or rank is None or std not in ("0", "1", "2", "3"):
            raise UsageError(hint)
        if rank in mapping:
            raise UsageError(f"{flag} {quote(value)} names local rank {rank} twice")
        mapping[rank] = int(std)
    return mapping


def parse_ranks_filter(value: str, name: str = "--local-ranks-filter") -> set[int] | None:
    """Comma list of local ranks (``0,2``); empty means every rank."""
    text = value
    if not text:
        return None
    ranks = set()
    for item in text.split(","):
        rank = read_int(item)
        if rank is None or not 0 <= rank < MAX_NPROC:
            raise UsageError(
                f"{name} {quote(value)} is invalid: use a comma list of local ranks from 0 to {MAX_NPROC - 1}, "
                "e.g. 0,1,2"
            )
        ranks.add(rank)
    return ranks


def check_ranks_filter(ranks: set[int] | frozenset[int] | None, nproc: int) -> None:
    """Every rank ``--local-ranks-filter`` names is a local rank of this node."""
    for rank in ranks or ():
        parse_int(rank, "--local-ranks-filter rank", 0, nproc - 1)


def parse_filters(value: str | Sequence[str]) -> list[str]:
    """Comma list where ``,,`` stands for a literal comma."""
    if not isinstance(value, str):
        return list(value)
    placeholder = "\x00"
    items = value.replace(",,", placeholder).split(",")
    return [item.replace(placeholder, ",") for item in items if item]


def _std(values: FlagValues, dest: str, nproc: int) -> StdSpec:
    spec = parse_std(values[dest], values.source(dest))
    check_std(spec, values.source(dest), nproc)
    return spec


def read_logs(values: FlagValues) -> LogSettings:
    """The log flags, checked; per-rank settings against ``--nproc-per-node``."""
    nproc: int = values.settings("workers").nproc_per_node
    redirects, tee = _std(values, "redirects", nproc), _std(values, "tee", nproc)
    ranks = parse_ranks_filter(values["local_ranks_filter"], values.source("local_ranks_filter"))
    check_ranks_filter(ranks, nproc)
    return LogSettings(
        log_dir=values["log_dir"] or None,
        redirects=redirects,
        tee=tee,
        local_ranks_filter=None if ranks is None else frozenset(ranks),
        duplicate_stdout_filters=tuple(parse_filters(values["duplicate_stdout_filters"])),
        duplicate_stderr_filters=tuple(parse_filters(values["duplicate_stderr_filters"])),
        logs_specs=values["logs_specs"],
    )


FLAGS: FlagGroup[LogSettings] = FlagGroup(
    name="logs",
    title="logs (where worker output goes)",
    read=read_logs,
    flags=(
        Flag("--log-dir", default=None, torchrun=True,
             help="Base directory for worker logs; a job directory is created inside it per run."),
        Flag("--redirects", short="-r", default="0", torchrun=True,
             help="Send streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both; or per local rank "
             "(0:1,1:2)."),
        Flag("--tee", short="-t", default="0", torchrun=True,
             help="Send streams to log files and the console (same format as --redirects)."),
        Flag("--local-ranks-filter", default="", torchrun=True,
             help="Comma list of local ranks whose output the console shows (files keep every rank)."),
        Flag("--duplicate-stdout-filters", default="", torchrun=True,
             help="Comma list of strings; stdout lines containing any also go to filtered_stdout.log "
             "(',,' escapes a comma)."),
        Flag("--duplicate-stderr-filters", default="", torchrun=True,
             help="Comma list of strings; stderr lines containing any also go to filtered_stderr.log."),
        Flag("--logs-specs", default=None, env=False, torchrun=True, help="Name of a LogsSpecs plugin."),
    ),
)
