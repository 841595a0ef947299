"""The ``--cluster`` flag: which scheduler's environment fills the flags left out.

Declared here (:data:`FLAGS`). The filling itself happens on the parsed flags before any group
is read (:func:`launcher.clusters.apply.apply_cluster`); :func:`read_cluster` gives the choice as
one :class:`ClusterSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.flags import Flag, FlagGroup, FlagValues

__all__ = ["FLAGS", "ClusterSettings", "read_cluster"]


@dataclass(frozen=True)
class ClusterSettings:
    """``auto``, ``none`` or a cluster environment's name (checked when the environment is detected)."""

    choice: str = "auto"


def read_cluster(values: FlagValues) -> ClusterSettings:
    """``--cluster``, as given (:func:`launcher.clusters.apply.detect` checks the name against the plugins)."""
    return ClusterSettings((values["cluster"] or "auto").strip().lower())


FLAGS: FlagGroup[ClusterSettings] = FlagGroup(
    name="clusters",
    title="cluster environments",
    read=read_cluster,
    flags=(
        Flag("--cluster", default="auto", underscore=False,
             help="Fill missing flags from a scheduler's environment: auto (default), none (torchrun's "
             "behaviour), or a cluster environment's name (slurm, openmpi, mpich, pmix, lsf, kubeflow)."),
    ),
)
