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

from typing import Any

from launcher.rendezvous.api import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousTimeoutError,
)
from launcher.rendezvous.torch_store import TorchStore

__all__ = ["ENTRY_POINT_GROUP", "EntryPointCreator", "TorchHandlerAdapter"]

#: The group torchrun reads out-of-tree rendezvous handlers from.
ENTRY_POINT_GROUP = "torchrun.handlers"


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

    def __init__(self, handler: Any, params: RendezvousParameters) -> None:
        self.torch_handler = handler
        self._params = params
        self._round = -1

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the torch handler's next round."""
        try:
            result = self.torch_handler.next_rendezvous()
        except Exception as exc:
            raise _translate(exc, self._params.backend) from exc
        bootstrap = None
        if isinstance(result, tuple):  # handlers written before torch 2.4 return a tuple
            store, rank, world_size = result
        else:
            store, rank, world_size = result.store, result.rank, result.world_size
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
            use_agent_store=bool(getattr(self.torch_handler, "use_agent_store", False)),
            round=self._round,
        )

    def _call(self, name: str) -> Any:
        try:
            return getattr(self.torch_handler, name)()
        except Exception as exc:
            raise _translate(exc, self._params.backend) from exc

    def is_closed(self) -> bool:
        """Whether the torch handler says the rendezvous is closed."""
        return bool(self._call("is_closed"))

    def set_closed(self) -> None:
        """Close the torch handler's rendezvous."""
        self._call("set_closed")

    def num_nodes_waiting(self) -> int:
        """The torch handler's count of waiting nodes."""
        return int(self._call("num_nodes_waiting"))

    def lost_nodes(self) -> list[str]:
        """Always empty: torch handlers do not report lost nodes."""
        return []

    def get_run_id(self) -> str:
        """The torch handler's run id."""
        return str(self._call("get_run_id"))

    def shutdown(self) -> bool:
        """Shut the torch handler down."""
        return bool(self._call("shutdown"))


class EntryPointCreator:
    """Loads the entry point on first use; the returned creator is kept for later handlers.

    ``entry_point`` is anything with ``name``, ``value`` and ``load()`` (an
    :class:`importlib.metadata.EntryPoint`, or the plugin manager's own scanner's result).
    """

    def __init__(self, entry_point: Any) -> None:
        self.entry_point = entry_point
        self._creator: Any = None

    def __call__(self, params: RendezvousParameters) -> TorchHandlerAdapter:
        if self._creator is None:
            try:
                get_creator = self.entry_point.load()
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

