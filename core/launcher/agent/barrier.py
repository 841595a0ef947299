"""The exit barrier: every node waits for the others to finish before it closes the rendezvous.

Two phases: every node waits until all have finished (``done``), closes the rendezvous, and
says it is leaving (``left``); a node then waits, briefly, until every node has left the store
alone, so the node that serves the store never shuts it down under a peer that is still using
it. A node that sees the job ended elsewhere meanwhile (closed without every node done) says
why and leaves at once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

from launcher.rendezvous.api import RendezvousError
from launcher.store.api import StoreError, StoreTimeoutError

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.reporting import NodeReporter
    from launcher.rendezvous.api import RendezvousHandler, RendezvousInfo
    from launcher.store.api import KeyValueStore

__all__ = ["exit_barrier"]

log = logging.getLogger("launcher.agent")


def exit_barrier(info: RendezvousInfo, handler: RendezvousHandler, reporter: NodeReporter, *,
                 run_id: str, timeout: float) -> None:
    """Wait (``timeout`` seconds at most) for every node to finish, then close the rendezvous."""
    if info.group_world_size == 1 or info.store is None:
        with contextlib.suppress(StoreError, RendezvousError, OSError):
            handler.set_closed()
        return
    store = info.store
    key = f"launcher/{run_id}/exit/{info.round}"
    try:
        if store.add(f"{key}/count", 1) == info.group_world_size:
            store.set(f"{key}/done", b"1")
        if not _await_done(store, f"{key}/done", timeout, info, handler, reporter):
            return
        handler.set_closed()
        if store.add(f"{key}/left", 1) == info.group_world_size:
            store.set(f"{key}/all_left", b"1")
    except (StoreError, RendezvousError, OSError) as exc:
        # Every worker here succeeded; a peer or the store going away now does not undo that.
        log.warning("exit barrier: not every node finished within %.0fs (%s); exiting anyway", timeout, exc)
        return
    try:
        store.wait([f"{key}/all_left"], timeout=min(timeout, 30.0))
    except (StoreError, RendezvousError, OSError) as exc:
        # Expected on every node but the store's host: the host may shut the store down the
        # moment the last node has said it is leaving.
        log.debug("exit barrier: store gone after every node left (%s)", exc)


def _await_done(store: KeyValueStore, done: str, timeout: float, info: RendezvousInfo,
                handler: RendezvousHandler, reporter: NodeReporter) -> bool:
    """Wait for every node to finish; False when another node ended the job meanwhile
    (closed without every node done): then say why, and leave the barrier at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            store.wait([done], timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            return True
        except StoreTimeoutError:
            if time.monotonic() >= deadline:
                raise
        if handler.is_closed() and not store.check([done]):
            # This node's record tells a failing node it need not wait for us.
            reporter.publish(info, handler, reporter.outcome(info))
            others = reporter.gather(info, handler, closer=False)
            causes = [
                f"{o.label}: " + (f"rank {o.root.get('rank')} {o.root.get('exit')}" if o.root else str(o.reason))
                for g, o in sorted(others.items()) if g != info.group_rank and (o.root or o.reason)
            ]
            log.warning("every worker of this node succeeded, but the job ended on another node%s",
                        f" ({'; '.join(causes)})" if causes else "")
            return False
