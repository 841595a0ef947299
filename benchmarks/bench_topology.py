"""How many hops of the rank-order ring cross a leaf switch: torchrun's order against ``--topology``.

NCCL builds its rings in rank order and does not look at the network (NVIDIA/nccl#1340): every
hop between ranks on different leaf switches goes through the spine. A job of ``--nodes`` nodes
(64) spread evenly over ``--leaves`` leaves (8) joins in a random order; the figure is how many
of the ring's N hops (rank i to i + 1, the last back to 0) join nodes of two leaves. The minimum,
when every leaf's nodes are adjacent, is the number of leaves.

No processes: each node's participant record is what its agent writes (with ``--topology``, its
path, as ``file:PATH`` gives it), and the ranks are what the rendezvous's closer computes from
them (:func:`launcher.rendezvous.rounds.sealed_value`), so the figures are the product's own
ordering. torchrun's c10d orders its participants by address the same way (``_NodeDesc``: addr,
pid, local id; addresses compared as text, so ``10.20.0.100`` sorts before ``10.20.0.2``), so
its figure is launcher's without ``--topology``. How addresses relate to
leaves decides torchrun's figure, so three layouts are measured:

- ``random``: addresses unrelated to the leaves (DHCP, a cloud's placement);
- ``interleaved``: consecutive addresses on alternating leaves (racks cabled round-robin);
- ``by-leaf``: each leaf a contiguous block of addresses (torchrun's best case).

Each layout is averaged over ``--trials`` seeds. Also times (CPU) the closer's ordering of one round
with and without paths. Writes ``benchmarks/results/topology.json``.

Usage::

    .tox/py3/bin/python benchmarks/bench_topology.py [--nodes 64] [--leaves 8] [--trials 200]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from launcher.rendezvous.rounds import sealed_value
from launcher.topology.order import location_record, ring_crossings

RESULTS = Path(__file__).resolve().parent / "results" / "topology.json"


def _records(nodes: int, leaves: int, layout: str, rng: random.Random, placed: bool) -> tuple[list[dict[str, Any]],
                                                                                              dict[str, str]]:
    """The participant records of one round, in join order; and each node id's leaf."""
    per_leaf = nodes // leaves
    leaf_of_slot = [f"leaf{slot // per_leaf}" for slot in range(nodes)]  # by-leaf: slot order is leaf order
    if layout == "interleaved":
        leaf_of_slot = [f"leaf{slot % leaves}" for slot in range(nodes)]
    addresses = [str(ipaddress.IPv4Address("10.20.0.0") + 1 + slot) for slot in range(nodes)]
    if layout == "random":
        rng.shuffle(addresses)
    records, leaf_of = [], {}
    for slot in range(nodes):
        node = {"id": f"{addresses[slot]}_4242_0", "addr": addresses[slot], "pid": 4242, "lid": 0, "lws": 8}
        if placed:
            node["topo"] = location_record(("spine0", leaf_of_slot[slot]), None)
        records.append(node)
        leaf_of[node["id"]] = leaf_of_slot[slot]
    rng.shuffle(records)  # the order the nodes joined in
    for index, node in enumerate(records, start=1):
        node["idx"] = index
    return records, leaf_of


def crossings(nodes: int, leaves: int, layout: str, seed: int, placed: bool) -> int:
    """Leaf crossings of the ring in the group-rank order the closer gives one round."""
    rng = random.Random(seed)
    records, leaf_of = _records(nodes, leaves, layout, rng, placed)
    value = sealed_value(records, nodes, nodes, stable_rank0=False, closer=records[0]["id"])
    return ring_crossings([leaf_of[node] for node in value["ids"]])


def closer_seconds(nodes: int, leaves: int, placed: bool, repeat: int = 20) -> float:
    """Median CPU seconds of the closer's ordering of one round."""
    times = []
    for seed in range(repeat):
        records, _ = _records(nodes, leaves, "random", random.Random(seed), placed)
        start = time.process_time()  # CPU time: the machine may be busy
        sealed_value(records, nodes, nodes, stable_rank0=False, closer="x")
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--leaves", type=int, default=8)
    parser.add_argument("--trials", type=int, default=200)
    args = parser.parse_args()
    if args.nodes % args.leaves:
        parser.error("--nodes must be a multiple of --leaves")
    result: dict[str, Any] = {"nodes": args.nodes, "leaves": args.leaves, "trials": args.trials,
                              "minimum": args.leaves, "layouts": {}}
    print(f"{args.nodes} nodes over {args.leaves} leaves, random join order, {args.trials} trials a layout; "
          f"ring hops that cross a leaf (minimum {args.leaves}):")
    print(f"{'layout':<12} {'torchrun (by address)':>26} {'launcher --topology':>22}")
    for layout in ("random", "interleaved", "by-leaf"):
        plain = [crossings(args.nodes, args.leaves, layout, seed, False) for seed in range(args.trials)]
        placed = [crossings(args.nodes, args.leaves, layout, seed, True) for seed in range(args.trials)]
        result["layouts"][layout] = {
            "torchrun": {"mean": statistics.mean(plain), "min": min(plain), "max": max(plain)},
            "topology": {"mean": statistics.mean(placed), "min": min(placed), "max": max(placed)},
        }
        print(f"{layout:<12} {statistics.mean(plain):>12.1f} (min {min(plain):>2}, max {max(plain):>2})"
              f" {statistics.mean(placed):>8.1f} (min {min(placed)}, max {max(placed)})")
    timing = {}
    for nodes in (args.nodes, 4096):
        leaves = max(args.leaves, nodes // 64)
        plain_s, placed_s = closer_seconds(nodes, leaves, False), closer_seconds(nodes, leaves, True)
        timing[str(nodes)] = {"plain_ms": plain_s * 1e3, "topology_ms": placed_s * 1e3}
        print(f"closer's ordering of {nodes} nodes: {plain_s * 1e3:.2f} ms plain, {placed_s * 1e3:.2f} ms with paths")
    result["closer"] = timing
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
