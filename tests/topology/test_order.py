"""The closer's order with --topology (pure functions over participant records) and the ring figure."""

from __future__ import annotations

import random

from launcher.rendezvous.membership import NodeDescriptor, decode
from launcher.rendezvous.rounds import _placement_line, sealed_value
from launcher.topology.order import location_record, natural_key, placement_key, ring_crossings


def _record(addr: str, path: tuple[str, ...] | None = None, order: int | None = None, **extra: object) -> dict:
    node = {"id": f"{addr}_1_0", "addr": addr, "pid": 1, "lid": 0, **extra}
    if path is not None:
        node["topo"] = location_record(path, order)
    return node


def _seal(nodes: list[dict], *, stable: bool = False) -> dict:
    for index, node in enumerate(nodes, start=1):
        node["idx"] = index
    return sealed_value(nodes, len(nodes), 1, stable_rank0=stable, closer="x")


def _interleaved() -> list[dict]:
    """Four hosts whose addresses alternate between two leaves."""
    return [_record(f"10.213.0.{i}", ("spine0", "leaf-a" if i % 2 else "leaf-b")) for i in (4, 3, 2, 1)]


def test_nodes_of_a_leaf_are_consecutive() -> None:
    value = _seal(_interleaved())
    assert value["ids"] == ["10.213.0.1_1_0", "10.213.0.3_1_0", "10.213.0.2_1_0", "10.213.0.4_1_0"]
    assert value["paths"] == ["spine0.leaf-a", "spine0.leaf-a", "spine0.leaf-b", "spine0.leaf-b"]
    assert len(value["idx"]) == 4 and sorted(value["idx"]) == [1, 2, 3, 4]


def test_without_topology_the_order_and_record_are_torchruns() -> None:
    nodes = [_record(f"10.213.0.{i}") for i in (4, 3, 2, 1)]
    value = _seal(nodes)
    assert value["ids"] == [f"10.213.0.{i}_1_0" for i in (1, 2, 3, 4)]
    assert "paths" not in value


def test_the_sources_own_order_inside_a_domain_then_the_address() -> None:
    nodes = [_record("10.0.0.1", ("leaf1",), order=9), _record("10.0.0.2", ("leaf1",), order=3),
             _record("10.0.0.3", ("leaf1",)), _record("10.0.0.0", ("leaf1",))]
    assert _seal(nodes)["ids"] == ["10.0.0.2_1_0", "10.0.0.1_1_0", "10.0.0.0_1_0", "10.0.0.3_1_0"]


def test_nodes_without_a_path_follow_in_address_order() -> None:
    nodes = [_record("10.0.0.1"), _record("10.0.0.9", ("leaf1",)), _record("10.0.0.0")]
    value = _seal(nodes)
    assert value["ids"] == ["10.0.0.9_1_0", "10.0.0.0_1_0", "10.0.0.1_1_0"]
    assert value["paths"] == ["leaf1", None, None]


def test_stable_rank0_keeps_the_store_host_first() -> None:
    nodes = _interleaved()
    nodes[0]["host"] = True  # 10.213.0.4, on leaf-b
    assert _seal(nodes, stable=True)["ids"][0] == "10.213.0.4_1_0"


def test_numbers_in_names_sort_as_numbers() -> None:
    assert sorted(["leaf12", "leaf2", "leaf1a"], key=natural_key) == ["leaf1a", "leaf2", "leaf12"]
    assert placement_key({"topo": {"p": ["s", "leaf2"]}}) < placement_key({"topo": {"p": ["s", "leaf12"]}})
    assert placement_key({"topo": {"p": "bad"}}) == (1,)  # a record this launcher cannot read: no path


def test_the_join_record_carries_the_location() -> None:
    node = NodeDescriptor("10.0.0.1", 7, 0)
    plain = decode(node.record(is_host=False, was_rank0=False, local_world_size=2))
    assert "topo" not in plain
    placed = decode(node.record(is_host=False, was_rank0=False, local_world_size=2,
                                topo=location_record(("spine0", "leaf1"), 4)))
    assert placed["topo"] == {"p": ["spine0", "leaf1"], "o": 4}


def test_placement_line_is_short_for_big_rounds() -> None:
    nodes = [_record(f"10.0.{i // 250}.{i % 250}", (f"leaf{i % 8}",)) for i in range(300)]
    line = _placement_line(_seal(nodes))
    assert line.startswith("0 10.0.0.0_1_0 at leaf0, ") and line.endswith(" and 44 more")
    assert line.count(" at ") == 256


def test_ring_crossings() -> None:
    assert ring_crossings([]) == 0 and ring_crossings(["a"]) == 0
    assert ring_crossings(["a", "a", "b", "b"]) == 2
    assert ring_crossings(["a", "b", "a", "b"]) == 4


def test_64_nodes_over_8_leaves_cross_8_times_in_any_join_order() -> None:
    rng = random.Random(47)
    for _ in range(5):
        leaves = [f"leaf{rng.randrange(8)}" for _ in range(64)]
        nodes = [_record(f"10.1.{i // 200}.{i % 200 + 1}", ("spine0", leaf)) for i, leaf in enumerate(leaves)]
        rng.shuffle(nodes)
        paths = _seal(nodes)["paths"]
        assert ring_crossings(paths) == len(set(leaves))
