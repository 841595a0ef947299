"""The etcd backend's death notice: run by a dead agent's watchdog, it reports the node gone at once.

etcd sees no connection close when an agent dies: its lease lives on until its TTL runs out, and
its heartbeat stops only as the ring sees it, a heartbeat timeout later. The agent's watchdog
(``launcher.containment.watchdog``), which notices the agent's death at once, runs this module with the
node's last round: it publishes the departure (``agent process died``) through the core's one
record of departures (``launcher.rendezvous.departures``) and revokes the dead agent's lease, so
that its keys go too. The survivors re-form at their next membership check, and a spare takes
the dead node's place.

``python -m launcher_etcd.death_notice JSON``: the rendezvous parameters (``backend``,
``endpoint``, ``run_id``, ``min``, ``max``, ``config``), the ``round``, the ``node`` id, its
``rank`` and the ``lease`` to revoke. Credentials come from the environment the agent had, as
they did for the agent; nothing secret is on the command line that was not on the agent's.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

log = logging.getLogger("launcher.rendezvous")

__all__ = ["notice_argv", "main"]


def notice_argv(params: Any, r: int, node: str, rank: int, lease: int | None) -> list[str]:
    """The command that reports ``node`` (group rank ``rank`` of round ``r``) gone."""
    spec = {
        "backend": params.backend,
        "endpoint": params.endpoint,
        "run_id": params.run_id,
        "min": params.min_nodes,
        "max": params.max_nodes,
        "config": dict(params.config),
        "round": r,
        "node": node,
        "rank": rank,
        "lease": lease,
    }
    return [sys.executable, "-m", "launcher_etcd.death_notice", json.dumps(spec, separators=(",", ":"))]


def report(spec: dict[str, Any]) -> str:
    """Publish the departure ``spec`` describes (unless the node left, or the round is over); what was done."""
    from launcher.rendezvous.api import RendezvousParameters
    from launcher.rendezvous.departures import AGENT_DIED, report_departure
    from launcher.rendezvous.keys import RendezvousKeys
    from launcher.rendezvous.store_ops import StoreOps

    from launcher_etcd.backend import connect, owned_by_node
    from launcher_etcd.settings import EtcdSettings, rendezvous_config
    from launcher_etcd.store import EtcdStore

    params = RendezvousParameters(
        backend=spec["backend"], endpoint=spec["endpoint"], run_id=spec["run_id"],
        min_nodes=int(spec["min"]), max_nodes=int(spec["max"]), config=dict(spec["config"]),
    )
    config = rendezvous_config(params)
    settings = EtcdSettings.from_parameters(params, config)
    client = connect(settings, params.run_id)
    store = EtcdStore(client, settings.prefix, lease_ttl=settings.lease_ttl, timeout=config.read_timeout,
                      owned=owned_by_node)
    try:
        ops, keys = StoreOps(store, params.run_id, config.read_timeout), RendezvousKeys(params.run_id)
        r, node = int(spec["round"]), str(spec["node"])
        done = "nothing to report"
        # Only reads here: a counter read (add 0) would attach a key to a lease of this process.
        if ops.check([keys.closed]) or ops.compare_set(keys.current, b"", b"0") != str(r).encode():
            pass  # the job ended, or the round is over (the node was re-forming when it died)
        else:
            report_departure(ops, keys, r, node, AGENT_DIED)
            done = f"reported {node} gone from round {r}: {AGENT_DIED}"
        if spec.get("lease"):
            client.revoke_lease(int(spec["lease"]))  # the dead agent's keys go now, not a TTL later
        return done
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        spec = json.loads(args[0])
        done = report(spec)
    except Exception as exc:  # the agent is dead: say why on its stderr, the heartbeat timeout remains
        print(f"[launcher] WARNING: the death notice could not report this node: {exc}", file=sys.stderr)
        return 1
    print(f"[launcher] INFO: death notice: {done}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
