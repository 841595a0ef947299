"""``--topology SOURCE[,SOURCE]`` and ``--segment N``: declared here, read by :mod:`launcher.topology.locate`.

Every launch declares the flags (``--help`` lists them); a launch without them never imports the
reader (the group's ``unset`` stands for "off"), so a plain run's start is unchanged.
"""

# No "from __future__ import annotations" and nothing but the declaration: every launch imports this.

from launcher.flags import Flag, FlagGroup

__all__ = ["FLAGS"]

FLAGS: "FlagGroup[object]" = FlagGroup(
    name="topology",
    title="topology",
    read="launcher.topology.locate:read_topology",
    unset=None,
    flags=(
        Flag("--topology", default=None,
             help="Give nodes that share a switch or NVLink domain consecutive group ranks: sources, outermost first "
             "(file:PATH, slurm, nvml, a plugin's), comma list, or auto (what the environment offers). "
             "Default: off, torchrun's order."),
        Flag("--segment", default=None,
             help="With --topology: only whole segments of N nodes of one domain (the innermost switch or NVLink "
             "domain) train, the other nodes wait as spares; --nnodes MIN and MAX must be multiples of N. "
             "Default: off."),
    ),
)
