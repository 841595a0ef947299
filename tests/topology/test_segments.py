"""--segment N: the closer's choice of whole segments (pure), and the flag's bad input (issue 47)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from launcher.errors import UsageError
from launcher.rendezvous.rounds import sealed_value
from launcher.topology.api import NodeLocation
from launcher.topology.locate import check_segment, parse_segment, parse_topology
from launcher.topology.segments import domain_number, select_segments

from tests.conftest import run_launcher


def node(n: int, path: str | None, *, host: bool = False) -> dict[str, Any]:
    record: dict[str, Any] = {"id": f"10.0.0.{n}_1_0", "addr": f"10.0.0.{n}", "pid": 1, "lid": 0, "host": host,
                              "idx": n}
    if path is not None:
        record["topo"] = {"p": path.split(".")}
    return record


def by_address(record: Any) -> tuple[Any, ...]:
    return (int(record["addr"].rsplit(".", 1)[1]),)


def ids(records: Any) -> list[int]:
    return [int(r["addr"].rsplit(".", 1)[1]) for r in records]


def test_whole_segments_of_one_domain_only_up_to_max() -> None:
    # leaf1 has 5 nodes (2 segments of 2 and one left over), leaf2 3 (one segment), leaf10 1 (none).
    nodes = [node(1, "s.leaf1"), node(2, "s.leaf2"), node(3, "s.leaf1"), node(4, "s.leaf10"), node(5, "s.leaf1"),
             node(6, "s.leaf2"), node(7, "s.leaf1"), node(8, "s.leaf2"), node(9, "s.leaf1")]
    assert ids(select_segments(nodes, 2, 2, 6, by_address)) == [1, 3, 5, 7, 2, 6]
    assert ids(select_segments(nodes, 2, 2, 2, by_address)) == [1, 3]
    assert ids(select_segments(nodes, 2, 2, 8, by_address)) == [1, 3, 5, 7, 2, 6]  # all there is: 3 segments
    # Segments of one domain hold consecutive ranks, domains in path order (leaf2 before leaf10).
    assert ids(select_segments(nodes, 3, 3, 9, by_address)) == [1, 3, 5, 2, 6, 8]


def test_not_enough_whole_segments_for_min() -> None:
    nodes = [node(1, "s.a"), node(2, "s.b"), node(3, "s.a"), node(4, "s.b"), node(5, "s.c")]
    assert select_segments(nodes, 2, 6, 6, by_address) is None  # 5 nodes, but only 2 segments of 2
    assert select_segments(nodes, 3, 3, 3, by_address) is None  # no domain has 3
    assert select_segments([node(1, None), node(2, None)], 1, 1, 2, by_address) is None  # no path: never placed
    value = sealed_value(nodes, 5, 3, stable_rank0=False, closer="x", segment=3, max_nodes=3)
    assert value["state"] == "aborted" and "whole segments of 3" in value["reason"]


def test_a_re_form_keeps_the_survivors_and_takes_a_spare_of_the_lost_nodes_domain() -> None:
    # Round before: 5 and 6 (leaf b) trained; 6 was lost. Spares: 1 and 2 (leaf a), 7 (leaf b).
    nodes = [node(5, "s.b"), node(1, "s.a"), node(2, "s.a"), node(7, "s.b")]
    assert ids(select_segments(nodes, 2, 2, 2, by_address)) == [1, 2]  # a fresh round: path order
    assert ids(select_segments(nodes, 2, 2, 2, by_address, previous={"10.0.0.5_1_0", "10.0.0.6_1_0"})) == [5, 7]
    # Inside a domain too, the survivors stay and the spares fill up: 8 and 9 in, not 3.
    nodes = [node(3, "s.a"), node(8, "s.a"), node(9, "s.a")]
    assert ids(select_segments(nodes, 2, 2, 2, by_address, previous={"10.0.0.8_1_0", "10.0.0.4_1_0"})) == [3, 8]
    nodes = [node(3, "s.a"), node(8, "s.a"), node(9, "s.a"), node(4, "s.a")]
    chosen = select_segments(nodes, 2, 2, 2, by_address, previous={"10.0.0.8_1_0", "10.0.0.9_1_0"})
    assert ids(chosen) == [8, 9]


def test_the_stores_host_keeps_its_domain_in_the_job() -> None:
    nodes = [node(1, "s.a"), node(2, "s.a"), node(3, "s.b", host=True), node(4, "s.b")]
    assert ids(select_segments(nodes, 2, 2, 2, by_address, host=lambda n: n["host"])) == [3, 4]
    both = select_segments(nodes, 2, 4, 4, by_address, host=lambda n: n["host"], host_first=True)
    assert ids(both) == [3, 4, 1, 2]  # stable_rank0: the host's domain first


def test_sealed_value_places_segments_and_leaves_the_rest_out() -> None:
    nodes = [node(1, "s.a"), node(2, "s.b"), node(3, "s.a"), node(4, "s.b"), node(5, "s.b")]
    value = sealed_value(nodes, 5, 2, stable_rank0=False, closer="x", segment=2, max_nodes=2)
    assert value["state"] == "sealed" and value["idx"] == [1, 3] and value["paths"] == ["s.a", "s.a"]
    # Without --segment, nothing changes: every record, ordered by path.
    plain = sealed_value(nodes, 5, 2, stable_rank0=False, closer="x")
    assert plain["idx"] == [1, 3, 2, 4, 5]


def test_domain_numbers_are_stable_and_tell_domains_apart() -> None:
    assert domain_number(("s", "a")) == domain_number(("s", "a")) != domain_number(("s", "b"))
    assert domain_number(("s.a",)) != domain_number(("s", "a"))
    assert 0 < domain_number(("x",)) < 1 << 56


def test_forms_and_the_job_size() -> None:
    assert parse_segment(None) is None and parse_segment(" ") is None and parse_segment("4") == 4
    for bad in ("0", "-2", "two", "1.5"):
        with pytest.raises(UsageError, match="is not a number of nodes"):
            parse_segment(bad)
    settings = parse_topology("slurm")._replace(segment=4)  # type: ignore[union-attr]
    here = NodeLocation(("s", "a"))
    check_segment(settings, 8, 16, "c10d", here)
    with pytest.raises(UsageError) as caught:
        check_segment(settings, 6, 18, "c10d", here)
    assert str(caught.value) == ("--segment 4 needs --nnodes MIN and MAX that are multiples of 4, not 6:18: "
                                 "e.g. --nnodes 8:16")
    with pytest.raises(UsageError, match=r"e\.g\. --nnodes 4$"):
        check_segment(settings, 1, 3, "c10d", here)
    with pytest.raises(UsageError, match="with the static rendezvous backend"):
        check_segment(settings, 4, 4, "static", here)
    with pytest.raises(UsageError, match="with the acme rendezvous backend .* use --rdzv-backend c10d"):
        check_segment(settings, 4, 4, "acme", here, core_rounds=False)
    with pytest.raises(UsageError, match="placed this node nowhere"):
        check_segment(settings, 4, 4, "c10d", None)


@pytest.mark.parametrize("case", ["no-topology", "not-a-number", "nnodes", "variable"])
def test_bad_input_exits_2_in_one_line_before_any_worker(case: str, tmp_path: Path) -> None:
    marker = tmp_path / "worker-ran"
    script = tmp_path / "job.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    site = tmp_path / "site.txt"
    site.write_text("127.0.0.1 spine0.leaf1\n")
    topology = ["--topology", f"file:{site}"]
    args, env = {
        "no-topology": (["--segment", "2"], {}),
        "not-a-number": ([*topology, "--segment", "two"], {}),
        "nnodes": ([*topology, "--segment", "2"], {}),
        "variable": (topology, {"PET_SEGMENT": "2"}),
    }[case]
    result = run_launcher(["--standalone", "--local-addr", "127.0.0.1", *args, str(script)], env=env, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    expected = {
        "no-topology": "--segment 2 needs --topology SOURCE",
        "not-a-number": "--segment 'two' is not a number of nodes",
        "nnodes": "--segment 2 needs --nnodes MIN and MAX that are multiples of 2, not 1:1: e.g. --nnodes 2",
        "variable": "PET_SEGMENT 2 needs --nnodes MIN and MAX",
    }[case]
    assert expected in lines[0], lines[0]
    assert not marker.exists()
