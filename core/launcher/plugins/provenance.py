"""Where a registration came from: the plugin that provided it and that plugin's distribution."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from launcher.plugins.types import Registration

__all__ = ["CORE_DISTRIBUTION", "PluginInfo", "Provided", "is_core_distribution"]

#: The distribution that ships the core (and its built-in plugins); the import package is
#: ``launcher``, but the package index gives that distribution name to an unrelated project.
CORE_DISTRIBUTION = "launcher-core"

R = TypeVar("R", bound=Registration)


def is_core_distribution(name: str | None) -> bool:
    """Whether ``name`` (as a METADATA file spells it: ``launcher_core``, ``Launcher-Core``) is the core's."""
    if name is None:
        return False
    return "-".join(filter(None, name.lower().replace("_", "-").replace(".", "-").split("-"))) == CORE_DISTRIBUTION


@dataclass
class PluginInfo:
    """What is known about one plugin, loaded or not.

    ``group`` says where it was found: ``launcher`` for launcher's own plugins (the core's and
    those of the ``launcher`` entry-point group), or the name of one of torch's groups. ``value``
    is the module (``module:attribute``) it was loaded from.
    """

    name: str
    distribution: str | None
    version: str | None
    group: str
    value: str
    loaded: bool = False
    error: str | None = None
    traceback: str | None = None

    @property
    def builtin(self) -> bool:
        """Whether the core itself provides this plugin."""
        return is_core_distribution(self.distribution)

    def describe(self) -> str:
        """``name (dist version)``, as used in error messages."""
        if self.distribution:
            return f"{self.name!r} ({self.distribution} {self.version})"
        return repr(self.name)


@dataclass(frozen=True)
class Provided(Generic[R]):
    """One registration and the plugin that provided it."""

    registration: R
    plugin: PluginInfo
