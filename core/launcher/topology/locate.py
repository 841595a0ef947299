"""Reading ``--topology`` and finding this node's location with the sources it names.

:func:`read_topology` checks the flag's text (:class:`TopologySettings`);
:func:`locate_node` asks each source, when the plan is built, so that an unknown source, an
unreadable file or a node a source cannot place is one line (exit status 2) before anything
starts. With ``auto``, a source that cannot place the node is left out, and a node no source
places warns and keeps torchrun's order.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from launcher.errors import UsageError
from launcher.topology.api import NodeLocation, NoLocation, TopologyQuery
from launcher.values import quote

if TYPE_CHECKING:  # pragma: no cover
    from launcher.flags import FlagValues
    from launcher.plugins.manager import LauncherPluginManager

__all__ = ["AUTO", "TopologySettings", "check_segment", "locate_node", "parse_segment", "parse_topology",
           "read_topology"]

log = logging.getLogger("launcher.topology")

AUTO = "auto"


class TopologySettings(NamedTuple):
    """``--topology``: the sources in order (each ``(name, argument or None)``), or ``auto``;
    ``flag`` names where the value came from (``--topology`` or ``PET_TOPOLOGY``), for messages.
    ``segment``: ``--segment N`` (``None``: off), given as ``segment_flag``."""

    sources: tuple[tuple[str, str | None], ...] = ()
    auto: bool = False
    flag: str = "--topology"
    segment: int | None = None
    segment_flag: str = "--segment"


def parse_topology(value: str | None, flag: str = "--topology") -> TopologySettings | None:
    """``None`` when unset or empty (off); else the sources, checked for form (not for existence)."""
    if value is None or not value.strip():
        return None
    items = [item.strip() for item in value.split(",")]
    if not all(items):
        raise UsageError(f"{flag} {quote(value)} has an empty source: give names like slurm,nvml or file:PATH")
    if [item.lower() for item in items] == [AUTO]:
        return TopologySettings(auto=True, flag=flag)
    if AUTO in (item.lower() for item in items):
        raise UsageError(f"{flag} {quote(value)}: auto picks the sources itself and goes alone")
    sources = []
    for item in items:
        name, colon, argument = item.partition(":")
        if colon and not argument.strip():
            raise UsageError(f"{flag} {quote(value)}: {quote(item)} has nothing after ':' (write file:PATH)")
        sources.append((name.strip().lower(), argument.strip() if colon else None))
    return TopologySettings(tuple(sources), flag=flag)


def parse_segment(value: str | None, flag: str = "--segment") -> int | None:
    """``--segment N``: N, a whole number of nodes, 1 or more (``None`` when unset or empty)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise UsageError(f"{flag} {quote(value)} is not a number of nodes: give a whole number, 1 or more, "
                         "e.g. --segment 4")
    return int(text)


def read_topology(values: FlagValues) -> TopologySettings | None:
    """The flag group's reader."""
    topology = parse_topology(values["topology"], values.source("topology"))
    segment_flag = values.source("segment")
    segment = parse_segment(values["segment"], segment_flag)
    if segment is None:
        return topology
    if topology is None:
        raise UsageError(f"{segment_flag} {segment} needs --topology SOURCE to know each node's domain, "
                         "e.g. --topology file:PATH or --topology slurm")
    return topology._replace(segment=segment, segment_flag=segment_flag)


def check_segment(settings: TopologySettings, min_nodes: int, max_nodes: int, backend: str,
                  location: NodeLocation | None, *, core_rounds: bool = True) -> None:
    """``--segment N`` against the job: MIN and MAX multiples of N, a backend whose rounds
    launcher's closer forms (``core_rounds``: c10d, or a store-only plugin such as etcd; not
    ``static`` nor a plugin with a handler of its own), and this node placed. A one-line
    :class:`UsageError` otherwise."""
    size = settings.segment
    if size is None:
        return
    flag = settings.segment_flag
    if min_nodes % size or max_nodes % size:
        lo = -(-min_nodes // size) * size  # MIN rounded up, MAX down (never below it)
        hi = max(lo, max_nodes - max_nodes % size)
        right = str(lo) if lo == hi else f"{lo}:{hi}"
        raise UsageError(f"{flag} {size} needs --nnodes MIN and MAX that are multiples of {size}, not "
                         f"{min_nodes}:{max_nodes}: e.g. --nnodes {right}")
    if backend == "static" or not core_rounds:
        raise UsageError(f"{flag} {size} does not work with the {backend} rendezvous backend (it gives group ranks "
                         "itself): use --rdzv-backend c10d, or a store-only backend such as etcd")
    if location is None:
        raise UsageError(f"{flag} {size}: {settings.flag} auto placed this node nowhere, so it could never train in "
                         "a segment: name a source that places it (file:PATH, slurm, nvml)")


def _query(argument: str | None, address: str | None, environ: Mapping[str, str]) -> TopologyQuery:
    names = [socket.gethostname()]
    if not address:  # the name the rendezvous announces then (a resolver's wait otherwise for nothing)
        names.append(socket.getfqdn())
    return TopologyQuery(argument=argument, address=address or None,
                         hostnames=tuple(dict.fromkeys(n for n in names if n)), environ=environ)


def locate_node(settings: TopologySettings | None, manager: LauncherPluginManager, address: str | None,
                environ: Mapping[str, str] | None = None) -> NodeLocation | None:
    """This node's location from the sources ``settings`` names (``None``: off, or ``auto`` found none).

    Sources given by name: an unknown name, a wrong argument or a source that cannot place this
    node is a one-line :class:`UsageError`. ``auto``: every source that offers itself for it
    (``TopologySource.auto``), outermost first; those that cannot place this node are left out.
    """
    from launcher.plugins.types import TopologySource

    if settings is None:
        return None
    env = os.environ if environ is None else environ
    if settings.auto:
        found: NodeLocation | None = None
        reasons = []
        candidates = sorted((p.registration for p in manager.unique_registrations(TopologySource)
                             if p.registration.auto and not p.registration.takes_argument),
                            key=lambda reg: (reg.priority, reg.name))
        for reg in candidates:
            try:
                location = reg.locate(_query(None, address, env))
            except NoLocation as exc:
                reasons.append(f"{reg.name}: {exc}")
                continue
            found = location if found is None else found.joined(location)
        if found is None:
            log.warning("%s auto: no source places this node (%s); keeping torchrun's order",
                        settings.flag, "; ".join(reasons) or "no source offers itself")
        return found
    located: NodeLocation | None = None
    flag = settings.flag
    for name, argument in settings.sources:
        reg = manager.get(TopologySource, name)
        if reg.takes_argument and argument is None:
            raise UsageError(f"{flag} {name} needs an argument: write {name}:VALUE (file:PATH for the site file)")
        if not reg.takes_argument and argument is not None:
            raise UsageError(f"{flag} {name} takes no argument: write {name}, not {name}:{argument}")
        try:
            location = reg.locate(_query(argument, address, env))
        except NoLocation as exc:
            raise UsageError(f"{flag} {name} has no path for this node: {exc}") from None
        if not isinstance(location, NodeLocation):
            raise UsageError(f"{flag} {name}: the source returned {type(location).__name__}, not a NodeLocation")
        located = location if located is None else located.joined(location)
    return located
