"""The built-in topology sources: ``file:PATH``, ``slurm`` and ``nvml`` (see docs/topology.md).

Each is a function of a :class:`~launcher.topology.api.TopologyQuery` giving a
:class:`~launcher.topology.api.NodeLocation`; the parsers are pure functions of text, so that
tests feed them what a site or Slurm writes. Imported only with ``--topology``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.errors import UsageError
from launcher.topology.api import NodeLocation, NoLocation, TopologyQuery
from launcher.values import quote

if TYPE_CHECKING:  # pragma: no cover
    from launcher.health.nvml import NvmlLibrary

__all__ = ["file_location", "nvml_location", "parse_site_file", "slurm_location"]

_EXAMPLE = "'ADDRESS_OR_HOSTNAME SWITCH.PATH', e.g. '10.0.3.7 spine0.leaf12'"


def parse_site_file(text: str, filename: str) -> dict[str, NodeLocation]:
    """A site file's hosts: ``{address or host name (lower case): location}``.

    One host a line, ``ADDRESS_OR_HOSTNAME SWITCH.PATH``; ``#`` starts a comment, blank lines
    are skipped. A host's order in its domain is its line number (the file's own order). A
    malformed line, or a host listed twice, is a one-line :class:`UsageError` naming the file
    and the line.
    """
    hosts: dict[str, NodeLocation] = {}
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"--topology file:{filename}, line {number}"
        fields = line.split()
        if len(fields) != 2:
            raise UsageError(f"{where}: {quote(raw.strip())} is not {_EXAMPLE}")
        name, path = fields[0].lower(), fields[1]
        components = tuple(path.split("."))
        if not all(components):
            raise UsageError(f"{where}: the path {quote(path)} has an empty switch name; write {_EXAMPLE}")
        if name in first_line:
            raise UsageError(f"{where}: {fields[0]} is listed again (first on line {first_line[name]}); "
                             "list each host once")
        first_line[name] = number
        hosts[name] = NodeLocation(components, order=number)
    return hosts


def read_site_file(filename: str) -> dict[str, NodeLocation]:
    """:func:`parse_site_file` of the file ``filename``; one :class:`UsageError` line if unreadable."""
    try:
        with open(filename, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"--topology file:{filename} cannot be read ({reason}): give a readable file of lines "
                         f"{_EXAMPLE}") from None
    return parse_site_file(text, filename)


def file_location(query: TopologyQuery) -> NodeLocation:
    """``file:PATH``: this node's line of the site file (looked up by its address, then its host names)."""
    filename = (query.argument or "").strip()
    if not filename:
        raise UsageError(f"--topology file needs the site file's path: write file:PATH (lines {_EXAMPLE})")
    hosts = read_site_file(filename)
    for name in query.names:
        found = hosts.get(name.lower())
        if found is not None:
            return found
    raise NoLocation(f"{query.describe} has no line in {filename}: add one ({_EXAMPLE})")


_DIGITS = re.compile(r"(\d+)$")


def slurm_location(query: TopologyQuery) -> NodeLocation:
    """``slurm``: the switches above this node from ``SLURM_TOPOLOGY_ADDR`` and its pattern.

    Slurm's topology plugins (tree, block) give each task ``SLURM_TOPOLOGY_ADDR``, the names from
    the top switch down to the node (``s0.s12.gpu017``), and ``SLURM_TOPOLOGY_ADDR_PATTERN``,
    what each is (``switch.switch.node``). The path is every component that is not the node;
    the node's order is the number its name ends with, when it has one.
    """
    environ = query.environ
    address = environ.get("SLURM_TOPOLOGY_ADDR", "").strip()
    pattern = environ.get("SLURM_TOPOLOGY_ADDR_PATTERN", "").strip()
    if not address or not pattern:
        missing = "SLURM_TOPOLOGY_ADDR" if not address else "SLURM_TOPOLOGY_ADDR_PATTERN"
        raise NoLocation(f"{missing} is not set for {query.describe}: not inside a Slurm step (srun)")
    components, kinds = address.split("."), pattern.split(".")
    if len(components) != len(kinds) or not all(components):
        raise NoLocation(f"SLURM_TOPOLOGY_ADDR={quote(address)} does not match "
                         f"SLURM_TOPOLOGY_ADDR_PATTERN={quote(pattern)} for {query.describe}")
    path = tuple(c for c, kind in zip(components, kinds, strict=True) if kind != "node")
    if not path:
        raise NoLocation(f"SLURM_TOPOLOGY_ADDR_PATTERN={quote(pattern)} names no switch for {query.describe}: "
                         "the cluster has no topology plugin (topology/tree or topology/block in slurm.conf)")
    nodes = [c for c, kind in zip(components, kinds, strict=True) if kind == "node"]
    digits = _DIGITS.search(nodes[-1]) if nodes else None
    return NodeLocation(path, order=int(digits.group(1)) if digits else None)


def nvml_location(query: TopologyQuery, load: Callable[[], NvmlLibrary] | None = None) -> NodeLocation:
    """``nvml``: the NVLink domain of this node's GPUs (nvmlDeviceGetGpuFabricInfo).

    The path is the fabric's cluster UUID, then its clique id (both innermost: put ``nvml``
    last in ``--topology slurm,nvml``). Through launcher's NVML binding
    (:mod:`launcher.health.nvml`), which answers from the driver: no CUDA context, no
    ``nvidia-smi``. ``load`` returns the library (tests give recorded answers); every GPU of
    the node must report the same domain.
    """
    from launcher.health.nvml import (
        NVML_GPU_FABRIC_STATE_COMPLETED,
        NVML_SUCCESS,
        CtypesNvml,
        NvmlUnavailable,
        error_name,
    )

    try:
        nvml = load() if load is not None else CtypesNvml()
    except NvmlUnavailable as exc:
        raise NoLocation(f"{query.describe}: {exc}") from None
    code = nvml.init()
    if code != NVML_SUCCESS:
        raise NoLocation(f"{query.describe}: NVML cannot start ({error_name(code)})")
    try:
        code, count = nvml.device_count()
        if code != NVML_SUCCESS or count == 0:
            why = error_name(code) if code != NVML_SUCCESS else "no GPU"
            raise NoLocation(f"{query.describe}: NVML sees no GPU here ({why})")
        domains: dict[tuple[str, int], list[int]] = {}
        for index in range(count):
            code, device = nvml.handle(index)
            if code == NVML_SUCCESS:
                code, (uuid, clique, state, status) = nvml.fabric_info(device)
            if code != NVML_SUCCESS:
                raise NoLocation(f"{query.describe}: GPU {index} reports no NVLink fabric "
                                 f"(nvmlDeviceGetGpuFabricInfo: {error_name(code)})")
            if state != NVML_GPU_FABRIC_STATE_COMPLETED or status != NVML_SUCCESS or not uuid.strip("0-"):
                raise NoLocation(f"{query.describe}: GPU {index} is not registered with an NVLink fabric "
                                 f"(state {state}, status {error_name(status)}): is the fabric manager running?")
            domains.setdefault((uuid, clique), []).append(index)
    finally:
        nvml.shutdown()
    if len(domains) > 1:
        shown = "; ".join(f"GPUs {','.join(map(str, gpus))} in {uuid} clique {clique}"
                          for (uuid, clique), gpus in domains.items())
        raise NoLocation(f"{query.describe}: its GPUs are in different NVLink domains ({shown})")
    ((uuid, clique),) = domains
    return NodeLocation((f"nvl-{uuid}", f"clique-{clique}"))

