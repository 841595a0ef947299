"""What a topology source plugin works with: :class:`TopologyQuery`, :class:`NodeLocation`, :class:`NoLocation`.

A topology source (``launcher_topology_sources``, registered as a
:class:`~launcher.plugins.types.TopologySource`) answers one question for the node it runs on:
where in the network is this node? The answer is a path from the top of the network down to
the innermost domain the node shares with its neighbours (``("spine0", "leaf12")``, with the
NVLink domain innermost when a source knows it), and optionally the node's place inside that
domain. Standard library only: every ``--topology`` launch imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["NoLocation", "NodeLocation", "TopologyQuery", "check_component"]

#: What a path component may hold: no space (the INFO line and the site file separate with
#: spaces) and no '.' (the site file and SLURM_TOPOLOGY_ADDR join components with it).
_COMPONENT = re.compile(r"^[^\s.]+$")


def check_component(component: object) -> str:
    """``component`` if it is a usable path component, else a :class:`ValueError` saying why."""
    if not isinstance(component, str) or not _COMPONENT.match(component):
        raise ValueError(f"path component {component!r} must be non-empty text without spaces or '.'")
    return component


class NoLocation(Exception):
    """The source has no path for this node; the message (one line) says why.

    With ``--topology SOURCE`` the launch stops with that line (exit status 2); with
    ``--topology auto`` the node warns and keeps torchrun's order.
    """


@dataclass(frozen=True)
class TopologyQuery:
    """What a source is asked: this node's names, the environment, the source's argument.

    ``argument`` is what follows the source's name after ``:`` (``file:/etc/topology`` gives
    ``/etc/topology``), ``None`` without one. ``address`` is the node's ``--local-addr`` (how the
    other nodes reach it; ``None`` when not given), ``hostnames`` the host's own names (its short
    name, and its fully qualified name when ``--local-addr`` is not given), ``environ`` the agent's
    environment (not to be changed).
    """

    argument: str | None = None
    address: str | None = None
    hostnames: tuple[str, ...] = ()
    environ: Mapping[str, str] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name of this node a site's inventory may list it under: the address first."""
        return tuple(dict.fromkeys(n for n in (self.address, *self.hostnames) if n))

    @property
    def describe(self) -> str:
        """The node as messages name it: ``10.0.3.7``, ``10.0.3.7 (host gpu17)`` or ``host gpu17``."""
        hosts = [n for n in self.hostnames if n and n != self.address]
        if not self.address:
            return f"host {', '.join(hosts)}" if hosts else "this node"
        return self.address + (f" (host {', '.join(hosts)})" if hosts else "")


@dataclass(frozen=True)
class NodeLocation:
    """Where a node sits: ``path`` from the top of the network down (NVLink domain innermost),
    and ``order``, its place among the nodes of its innermost domain (``None``: by address).

    Nodes whose paths are equal share the innermost domain and get consecutive group ranks;
    components compare with their digits as numbers (``leaf2`` before ``leaf12``).
    """

    path: tuple[str, ...]
    order: int | None = None

    def __post_init__(self) -> None:
        path = tuple(self.path)
        if not path:
            raise ValueError("a node's path needs at least one component")
        for component in path:
            check_component(component)
        object.__setattr__(self, "path", path)
        if self.order is not None and (isinstance(self.order, bool) or not isinstance(self.order, int)):
            raise ValueError(f"order must be an int or None, not {type(self.order).__name__}")

    def __str__(self) -> str:
        return ".".join(self.path)

    def joined(self, inner: NodeLocation) -> NodeLocation:
        """This location with ``inner`` below it (``--topology slurm,nvml``): its path appended,
        its order taken when it has one."""
        return NodeLocation(self.path + inner.path, inner.order if inner.order is not None else self.order)
