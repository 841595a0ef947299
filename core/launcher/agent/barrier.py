"""The exit barrier: every node waits for the others to finish before it closes the rendezvous.

Two phases: every node waits until all have finished (``done``), closes the rendezvous, and
says it is leaving (``left``); a node then waits, briefly, until every node has left the store
alone, so the node that serves the store never shuts it down under a peer that is still using
it. A node that sees the job ended elsewhere meanwhile (closed without every node done) says
why and leaves at once.

The waits poll (short ``check`` calls, pauses in between) rather than block on the store: the
connection is shared with this node's heartbeat thread, which must keep beating while the node
waits here, or the others would call it lost (``launcher.rendezvous.store_ops``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

from launcher.rendezvous.api import RendezvousError
from launcher.rendezvous.store_ops import POLL_MAX, poll_until
from launcher.store.api import StoreError

if TYPE_CHECKING:  # pragma: no cover
    from launcher.agent.reporting import NodeReporter
    from launcher.rendezvous.api import RendezvousHandler, RendezvousInfo
    from launcher.store.api import KeyValueStore

__all__ = ["exit_barrier", "finished_nodes"]

log = logging.getLogger("launcher.agent")

class _NotAllFinished(Exception):
    """The barrier's timeout passed before every node had finished."""


def _key(run_id: str, round_: int) -> str:
    return f"launcher/{run_id}/exit/{round_}"


def finished_nodes(info: RendezvousInfo, run_id: str) -> int:
    """How many nodes of ``info``'s round have reached the exit barrier (all their workers
    succeeded); 0 when that cannot be read. Such a node will not join another round."""
    if info.store is None or info.group_world_size == 1:
        return 0
    try:
        return max(0, info.store.add(f"{_key(run_id, info.round)}/count", 0))
    except (StoreError, RendezvousError, OSError):
        return 0


def exit_barrier(info: RendezvousInfo, handler: RendezvousHandler, reporter: NodeReporter, *,
                 run_id: str, timeout: float) -> None:
    """Wait (``timeout`` seconds at most) for every node to finish, then close the rendezvous."""
    if info.group_world_size == 1 or info.store is None:
        with contextlib.suppress(StoreError, RendezvousError, OSError):
            handler.set_closed()
        return
    store = info.store
    key = _key(run_id, info.round)
    try:
        if store.add(f"{key}/count", 1) == info.group_world_size:
            store.set(f"{key}/done", b"1")
        if not _await_done(store, f"{key}/done", timeout, info, handler, reporter):
            return
        handler.set_closed()
        if store.add(f"{key}/left", 1) == info.group_world_size:
            store.set(f"{key}/all_left", b"1")
    except _NotAllFinished:
        # Every worker here succeeded; a peer that never finishes does not undo that.
        log.warning("exit barrier: not every node finished within %g s (--exit-barrier-timeout); exiting anyway",
                    timeout)
        return
    except (StoreError, RendezvousError, OSError) as exc:
        # Nor does the store going away (its host died, or ended the job and stopped serving).
        log.warning("exit barrier: the rendezvous store stopped answering while this node waited for the others "
                    "to finish (%s); every worker of this node succeeded, exiting anyway", exc)
        return
    try:
        if not poll_until(lambda: store.check([f"{key}/all_left"]), min(timeout, 30.0)):
            log.debug("exit barrier: not every node said it was leaving within %.0f s", min(timeout, 30.0))
    except (StoreError, RendezvousError, OSError) as exc:
        # Expected on every node but the store's host: the host may shut the store down the
        # moment the last node has said it is leaving.
        log.debug("exit barrier: store gone after every node left (%s)", exc)


def _await_done(store: KeyValueStore, done: str, timeout: float, info: RendezvousInfo,
                handler: RendezvousHandler, reporter: NodeReporter) -> bool:
    """Wait for every node to finish; False when another node ended the job meanwhile
    (closed without every node done): then say why, and leave the barrier at once."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    next_look = time.monotonic() + 1.0  # once a second: did the job end elsewhere?
    while True:
        # Checks, not a blocking wait: see the module's docstring.
        if store.check([done]):
            return True
        now = time.monotonic()
        if now >= deadline:
            raise _NotAllFinished
        if now < next_look:
            time.sleep(min(pause, deadline - now, next_look - now))
            pause = min(pause * 2, POLL_MAX)
            continue
        next_look = now + 1.0
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
