"""torch's own entry-point groups for torchrun, read as launcher registrations.

``torchrun.logs_specs`` maps a name to a LogsSpecs class (loading it may import torch);
``torchrun.handlers`` maps a name to a function returning a rendezvous handler creator, run
through launcher's adapter (which imports torch). Each entry is wrapped so that nothing loads
until it is chosen, and each only fills a name that launcher's own plugins leave free.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from typing import TYPE_CHECKING

from launcher.plugins import entrypoints
from launcher.plugins.provenance import PluginInfo, Provided
from launcher.plugins.types import LogsSpecsLike, LogsSpecsProvider, Registration, RendezvousBackend

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from launcher.rendezvous.api import RendezvousHandler, RendezvousParameters
    from launcher.rendezvous.torch_handlers import EntryPointCreator

__all__ = ["TORCHRUN_GROUPS", "torchrun_registrations"]


class _TorchrunHandler:
    """``create_handler`` for a ``torchrun.handlers`` entry point, loaded on first use."""

    def __init__(self, entry_point: entrypoints.FoundEntryPoint) -> None:
        self._entry_point = entry_point
        self._creator: EntryPointCreator | None = None

    def __call__(self, params: RendezvousParameters) -> RendezvousHandler:
        if self._creator is None:
            from launcher.rendezvous.torch_handlers import EntryPointCreator

            self._creator = EntryPointCreator(self._entry_point)
        return self._creator(params)


def _logs_specs(ep: entrypoints.FoundEntryPoint) -> Registration:
    def load_class() -> type[LogsSpecsLike]:
        loaded = ep.load()
        if not isinstance(loaded, type):
            raise TypeError(f"torchrun.logs_specs entry point {ep.name!r} ({ep.value}) is not a class: {loaded!r}")
        # Only that it is a class can be checked without building it; its members fail where used.
        return loaded

    return LogsSpecsProvider(name=ep.name, load_class=load_class, description=f"torchrun LogsSpecs {ep.value}")


def _handler(ep: entrypoints.FoundEntryPoint) -> Registration:
    return RendezvousBackend(
        name=ep.name, description=f"torchrun rendezvous handler {ep.value}", create_handler=_TorchrunHandler(ep)
    )


#: Each group torch defines for torchrun, and how one of its entries becomes a registration.
TORCHRUN_GROUPS: dict[str, Callable[[entrypoints.FoundEntryPoint], Registration]] = {
    "torchrun.logs_specs": _logs_specs,
    "torchrun.handlers": _handler,
}


def torchrun_registrations(
    block: Container[str], on_failure: Callable[[PluginInfo, BaseException], None]
) -> Iterator[Provided[Registration]]:
    """Every entry of torch's groups not named in ``block``, as a registration and its origin.

    An entry that cannot be wrapped (a malformed name) goes to ``on_failure`` and is skipped.
    """
    for group, wrap in TORCHRUN_GROUPS.items():
        for ep in entrypoints.entry_points(group):
            info = PluginInfo(
                name=ep.name, distribution=ep.distribution, version=ep.version, group=group, value=ep.value, loaded=True
            )
            if info.name in block:
                continue
            try:
                registration = wrap(ep)
            except ValueError as exc:
                on_failure(info, exc)
                continue
            yield Provided(registration, info)
