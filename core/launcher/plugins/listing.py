"""What ``launcher plugins`` lists: every registration once, and every plugin that failed."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from launcher.plugins.types import REGISTRATION_CLASSES

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from launcher.plugins.manager import LauncherPluginManager

__all__ = ["RegistrationRow", "registration_rows"]


@dataclass(frozen=True)
class RegistrationRow:
    """One line of ``launcher plugins``: a registration, or a plugin that failed to load
    (``loaded`` false, ``kind`` and ``name`` ``None``, ``error`` saying why)."""

    kind: str | None
    name: str | None
    aliases: tuple[str, ...]
    description: str
    plugin: str
    group: str
    distribution: str | None
    version: str | None
    loaded: bool
    error: str | None

    def as_json(self) -> dict[str, object]:
        """The row as a JSON object (``launcher plugins --json``)."""
        row = asdict(self)
        row["aliases"] = list(self.aliases)
        return row


def registration_rows(manager: LauncherPluginManager) -> list[RegistrationRow]:
    """One row per registration and per failed plugin, for ``launcher plugins``."""
    rows: list[RegistrationRow] = []
    for cls in REGISTRATION_CLASSES:
        for provided in manager.unique_registrations(cls):
            reg, plugin = provided.registration, provided.plugin
            rows.append(
                RegistrationRow(
                    kind=cls.kind,
                    name=reg.name,
                    aliases=tuple(reg.aliases),
                    description=reg.description,
                    plugin=plugin.name,
                    group=plugin.group,
                    distribution=plugin.distribution,
                    version=plugin.version,
                    loaded=True,
                    error=None,
                )
            )
    for failed in manager.failures:
        rows.append(
            RegistrationRow(
                kind=None,
                name=None,
                aliases=(),
                description="",
                plugin=failed.name,
                group=failed.group,
                distribution=failed.distribution,
                version=failed.version,
                loaded=False,
                error=failed.error,
            )
        )
    return rows
