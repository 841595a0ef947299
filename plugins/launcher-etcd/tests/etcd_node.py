"""One simulated node in its own process, for tests that SIGKILL a node.

Usage: ``python etcd_node.py ENDPOINT RUN_ID NNODES [key=value ...]``. Prints one JSON line with
its place in the round once the round forms, then keeps heartbeating until killed.
"""

from __future__ import annotations

import json
import sys
import time

from etcd_helpers import node_params
from launcher_etcd.backend import create_handler


def main() -> None:
    endpoint, run_id, nnodes, *pairs = sys.argv[1:]
    conf = dict(pair.split("=", 1) for pair in pairs)
    handler = create_handler(node_params(endpoint, run_id, nnodes, **conf))
    info = handler.next_rendezvous()
    node = handler.node
    print(json.dumps({"id": node.id, "rank": info.group_rank, "round": info.round, "size": info.group_world_size}))
    sys.stdout.flush()
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
