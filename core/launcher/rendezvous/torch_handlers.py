"""torch's ``torchrun.handlers`` entry-point group, usable by name (``--rdzv-backend NAME``).

A distribution that registered a rendezvous handler for torchrun declares, in that group, a
callable returning a creator ``(torch RendezvousParameters) -> torch RendezvousHandler``. The
plugin manager (:mod:`launcher.plugins.manager`) lists the group and makes each entry point a
:class:`~launcher.plugins.types.RendezvousBackend`, so listing backends imports neither torch nor
the plugin. This module is what runs once such a backend is chosen: :class:`EntryPointCreator`
loads the entry point and builds the torch handler, and :class:`TorchHandlerAdapter` makes it
speak launcher's :class:`~launcher.rendezvous.api.RendezvousHandler` protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar, cast, runtime_checkable

from launcher.rendezvous.api import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeoutError,
)
from launcher.rendezvous.torch_store import TorchStore

__all__ = [
    "ENTRY_POINT_GROUP",
    "EntryPointCreator",
    "HandlerCreator",
    "HandlerEntryPoint",
    "TorchHandler",
    "TorchHandlerAdapter",
    "TorchRendezvousInfo",
    "TorchStoreInfo",
]

if TYPE_CHECKING:  # pragma: no cover - torch is imported only once such a backend is chosen
    from torch.distributed.elastic.rendezvous import RendezvousParameters as TorchParameters

#: The group torchrun reads out-of-tree rendezvous handlers from.
ENTRY_POINT_GROUP = "torchrun.handlers"

_T = TypeVar("_T")

# What launcher uses of torch's rendezvous API, as protocols: torch's own classes satisfy them, and
# this module can be imported (and type-checked) without torch.


class TorchStoreInfo(Protocol):
    """torch's ``RendezvousStoreInfo``: where the workers' store is."""

    @property
    def master_addr(self) -> str: ...
    @property
    def master_port(self) -> int: ...


class TorchRendezvousInfo(Protocol):
    """torch's ``RendezvousInfo`` (torch >= 2.4); ``bootstrap_store_info`` is read if present."""

    @property
    def store(self) -> object: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...


class TorchHandler(Protocol):
    """The methods of torch's ``RendezvousHandler`` the adapter calls."""

    def next_rendezvous(self) -> TorchRendezvousInfo | tuple[object, int, int]: ...
    def is_closed(self) -> bool: ...
    def set_closed(self) -> None: ...
    def num_nodes_waiting(self) -> int: ...
    def get_run_id(self) -> str: ...
    def shutdown(self) -> bool: ...


@runtime_checkable
class _AgentStoreAware(Protocol):
    # use_agent_store came with torch 2.4; a handler written before it lacks the property.
    @property
    def use_agent_store(self) -> bool: ...


#: torchrun's creator: torch ``RendezvousParameters`` -> torch ``RendezvousHandler``.
HandlerCreator = Callable[["TorchParameters"], TorchHandler]


class HandlerEntryPoint(Protocol):
    """An entry point of ``torchrun.handlers``.

    An :class:`importlib.metadata.EntryPoint` is one, and so is the plugin manager's
    :class:`~launcher.plugins.entrypoints.FoundEntryPoint`.
    """

    @property
    def name(self) -> str: ...
    @property
    def value(self) -> str: ...
    def load(self) -> object: ...


def _translate(exc: BaseException, backend: str) -> BaseException:
    """torch's rendezvous exceptions as launcher's (matched by class name: no torch import)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = f"{backend} rendezvous: {exc}"
    if "RendezvousClosedError" in names or "RendezvousGracefulExitError" in names:
        return RendezvousClosedError(text)
    if "RendezvousTimeoutError" in names:
        return RendezvousTimeoutError(text)
    if "RendezvousError" in names:
        return RendezvousError(text)
    return exc


class TorchHandlerAdapter:
    """Launcher's rendezvous protocol over a torch ``RendezvousHandler``.

    torch handlers know nothing of lost nodes (``lost_nodes`` is always empty) or of
    participants' names (``participants`` is empty). Rounds are counted here.
    """

    def __init__(self, handler: TorchHandler, params: RendezvousParameters) -> None:
        self.torch_handler = handler
        self._params = params
        self._round = -1

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the torch handler's next round."""
        try:
            result = self.torch_handler.next_rendezvous()
        except Exception as exc:
            raise _translate(exc, self._params.backend) from exc
        bootstrap: TorchStoreInfo | None = None
        if isinstance(result, tuple):  # handlers written before torch 2.4 return a tuple
            store, rank, world_size = result
        else:
            store, rank, world_size = result.store, result.rank, result.world_size
            # A handler's own result class may lack it; then it is built below, as torch does.
            bootstrap = getattr(result, "bootstrap_store_info", None)
        if bootstrap is None:
            # The same fallback torch's agent uses: rank 0 publishes an address and free port.
            from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

            bootstrap = RendezvousStoreInfo.build(rank, store, local_addr=self._params.local_addr)
        self._round += 1
        return RendezvousInfo(
            store=TorchStore(store),
            group_rank=int(rank),
            group_world_size=int(world_size),
            master_addr=str(bootstrap.master_addr),
            master_port=int(bootstrap.master_port),
            use_agent_store=self._uses_agent_store(),
            round=self._round,
        )

    def _uses_agent_store(self) -> bool:
        handler = self.torch_handler
        return isinstance(handler, _AgentStoreAware) and bool(handler.use_agent_store)

    def _call(self, method: Callable[[], _T]) -> _T:
        try:
            return method()
        except Exception as exc:
            raise _translate(exc, self._params.backend) from exc

    def is_closed(self) -> bool:
        """Whether the torch handler says the rendezvous is closed."""
        return bool(self._call(self.torch_handler.is_closed))

    def set_closed(self) -> None:
        """Close the torch handler's rendezvous."""
        self._call(self.torch_handler.set_closed)

    def num_nodes_waiting(self) -> int:
        """The torch handler's count of waiting nodes."""
        return int(self._call(self.torch_handler.num_nodes_waiting))

    def lost_nodes(self) -> list[str]:
        """Always empty: torch handlers do not report lost nodes."""
        return []

    def get_run_id(self) -> str:
        """The torch handler's run id."""
        return str(self._call(self.torch_handler.get_run_id))

    def shutdown(self) -> bool:
        """Shut the torch handler down."""
        return bool(self._call(self.torch_handler.shutdown))


class EntryPointCreator:
    """Loads the entry point on first use; the returned creator is kept for later handlers.

    ``entry_point`` is anything with ``name``, ``value`` and ``load()`` (an
    :class:`importlib.metadata.EntryPoint`, or the plugin manager's own scanner's result).
    """

    def __init__(self, entry_point: HandlerEntryPoint) -> None:
        self.entry_point = entry_point
        self._creator: HandlerCreator | None = None

    def __call__(self, params: RendezvousParameters) -> TorchHandlerAdapter:
        if self._creator is None:
            try:
                # torchrun's contract, which nothing can check before the call: the entry point
                # names a function returning a creator. One that breaks it fails here, as a load error.
                get_creator = cast("Callable[[], HandlerCreator]", self.entry_point.load())
                self._creator = get_creator()
            except Exception as exc:
                raise RendezvousError(
                    f"the torchrun rendezvous handler {self.entry_point.name!r} ({self.entry_point.value}) "
                    f"failed to load: {type(exc).__name__}: {exc}"
                ) from exc
        from torch.distributed.elastic.rendezvous import RendezvousParameters as TorchParameters

        torch_params = TorchParameters(
            backend=params.backend,
            endpoint=params.endpoint,
            run_id=params.run_id,
            min_nodes=params.min_nodes,
            max_nodes=params.max_nodes,
            local_addr=params.local_addr,
            **params.config,
        )
        try:
            handler = self._creator(torch_params)
        except Exception as exc:
            raise _translate(exc, params.backend) from exc
        return TorchHandlerAdapter(handler, params)

