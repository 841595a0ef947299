"""Built-in topology sources: ``file`` (``file:PATH``), ``slurm`` and ``nvml`` (see docs/topology.md).

Registered exactly as a third party's would be; the sources live in
:mod:`launcher.topology.sources`, imported only when ``--topology`` asks one of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from launcher.plugins import hookimpl
from launcher.plugins.types import TopologySource

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from launcher.topology.api import NodeLocation, TopologyQuery


def _file(query: TopologyQuery) -> NodeLocation:
    from launcher.topology.sources import file_location

    return file_location(query)


def _slurm(query: TopologyQuery) -> NodeLocation:
    from launcher.topology.sources import slurm_location

    return slurm_location(query)


def _nvml(query: TopologyQuery) -> NodeLocation:
    from launcher.topology.sources import nvml_location

    return nvml_location(query)


@hookimpl
def launcher_topology_sources() -> Iterator[TopologySource]:
    yield TopologySource(name="file", locate=_file, takes_argument=True,
                         description="file:PATH, a site file of lines 'ADDRESS_OR_HOSTNAME SWITCH.PATH'")
    yield TopologySource(name="slurm", locate=_slurm, auto=True, priority=20,
                         description="Slurm's switches above the node (SLURM_TOPOLOGY_ADDR and its pattern)")
    yield TopologySource(name="nvml", locate=_nvml, auto=True, priority=90,
                         description="The GPUs' NVLink domain through NVML (fabric cluster UUID and clique)")
