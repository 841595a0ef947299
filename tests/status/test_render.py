"""The text forms: Prometheus's exposition of a record, and the status table's header lines."""

from __future__ import annotations

import re
from typing import Any

from launcher.status.metrics import render as metrics
from launcher.status.render import render as table


def record(**changes: Any) -> dict[str, Any]:
    rank = {"rank": 0, "local_rank": 0, "pid": 4242, "state": "running", "exit_code": None, "restarts": 1,
            "heartbeat_age_s": 1.5, "lines_per_s": 2.5, "cpu_percent": 99.5, "rss_bytes": 12_345_678_901}
    doc = {"run_id": 'job"1\\x\n', "node": "10.0.0.1_77_0", "round": 3, "restarts_used": 1, "restarts_left": 2,
           "max_restarts": 3, "recoveries_in_place": 1,
           "updated_at": 1000.0, "ranks": [rank, {**rank, "rank": 1, "local_rank": 1, "pid": 4243, "state": "hung",
                                                  "heartbeat_age_s": None, "no_heartbeat_yet_s": 7.0,
                                                  "cpu_percent": None}]}
    doc.update(changes)
    return doc


def test_metrics_escape_labels_keep_every_digit_and_age_heartbeats_to_the_scrape():
    text = metrics(record(), hangs_seen=2, now=1003.0)
    labels = 'job="job\\"1\\\\x\\n",node="10.0.0.1_77_0"'
    assert f"launcher_workers_alive{{{labels}}} 2" in text.splitlines()
    assert f"launcher_hangs_total{{{labels}}} 2" in text.splitlines()
    assert f"launcher_recoveries_in_place_total{{{labels}}} 1" in text.splitlines()
    assert f'launcher_rank_resident_bytes{{{labels},rank="0",local_rank="0"}} 12345678901' in text.splitlines()
    # Read 3 s after the record was written: the age has grown by as much.
    assert f'launcher_rank_heartbeat_age_seconds{{{labels},rank="0",local_rank="0"}} 4.5' in text.splitlines()
    # A rank without a heartbeat has no sample, rather than a made-up 0.
    assert 'launcher_rank_heartbeat_age_seconds{' + labels + ',rank="1"' not in text
    # ... but how long it has gone without one since it started, aged to the scrape too.
    assert f'launcher_rank_no_heartbeat_yet_seconds{{{labels},rank="1",local_rank="1"}} 10' in text.splitlines()
    assert 'launcher_rank_no_heartbeat_yet_seconds{' + labels + ',rank="0"' not in text
    assert f'launcher_rank_hung{{{labels},rank="1",local_rank="1"}} 1' in text.splitlines()
    # Every sample line is `name{labels} number`, every family has HELP and TYPE.
    for line in text.splitlines():
        assert line.startswith("# ") or re.fullmatch(r"[a-z_]+\{.*\} -?[0-9.e+]+", line), line
    assert text.count("# TYPE ") == text.count("# HELP ") == 18
    assert f"launcher_max_restarts{{{labels}}} 3" in text.splitlines()
    # Straggler detection off: no straggler count, no per-rank flag (a made-up 0 would say "none").
    assert "launcher_stragglers{" not in text and "launcher_rank_slow{" not in text
    slow = metrics(record(straggler_detection=True, slow_ranks=[1]), hangs_seen=0, now=1003.0).splitlines()
    assert f"launcher_stragglers{{{labels}}} 1" in slow
    assert f'launcher_rank_slow{{{labels},rank="0",local_rank="0"}} 0' in slow
    assert f'launcher_rank_slow{{{labels},rank="1",local_rank="1"}} 1' in slow
    steps = metrics(record(ranks=[{**record()["ranks"][0], "steps_per_s": 12.5}]), hangs_seen=0).splitlines()
    assert f'launcher_rank_steps_per_second{{{labels},rank="0",local_rank="0"}} 12.5' in steps
    assert metrics(None, 0) == ""


def test_spares_and_kept_out_nodes_only_where_the_rendezvous_can_tell():
    labels = 'job="job\\"1\\\\x\\n",node="10.0.0.1_77_0"'
    # A rendezvous without spares or health records (static, single node): no made-up 0, no family.
    plain = metrics(record(spares_waiting=None, kept_out=None), hangs_seen=0)
    assert "launcher_spares_waiting" not in plain and "launcher_kept_out_node" not in plain
    lines = metrics(record(spares_waiting=0, kept_out=[]), hangs_seen=0).splitlines()
    assert f"launcher_spares_waiting{{{labels}}} 0" in lines
    assert "# TYPE launcher_kept_out_node gauge" in lines  # known, and none kept out: no sample
    assert not [line for line in lines if line.startswith("launcher_kept_out_node{")]
    out = [{"node": 'gpu-c (10.0.0.3)', "check": "command"}, {"node": "gpu-d", "check": 'gpu "0"'}]
    lines = metrics(record(spares_waiting=2, kept_out=out), hangs_seen=0).splitlines()
    assert f"launcher_spares_waiting{{{labels}}} 2" in lines
    assert f'launcher_kept_out_node{{{labels},kept_out="gpu-c (10.0.0.3)",check="command"}} 1' in lines
    assert f'launcher_kept_out_node{{{labels},kept_out="gpu-d",check="gpu \\"0\\""}} 1' in lines


def test_the_table_names_missing_nodes_and_failed_ranks():
    status = {
        "job": {"run_id": "j", "nodes": 3, "world_size": None, "round": 2, "restarts_used": 1, "restarts_left": 0,
                "elapsed_s": 3725.0, "hung_ranks": [], "failed_ranks": [1], "slow_ranks": [0]},
        "nodes": [{"node": "a"}], "missing_nodes": [1, 2], "store_problem": "cannot reach the job's store",
        "ranks": [{"node": "a", "rank": 0, "local_rank": 0, "pid": 9, "state": "running", "exit_code": None,
                   "restarts": 1, "heartbeat_age_s": None, "steps_per_s": 3.5, "lines_per_s": None,
                   "cpu_percent": 1.0, "rss_bytes": 3 << 20, "gpu": 1, "gpu_util_percent": 87,
                   "gpu_memory_bytes": 2 << 30},
                  {"node": "a", "rank": 1, "local_rank": 1, "pid": 10, "state": "failed", "exit_code": 3,
                   "restarts": 1, "heartbeat_age_s": None, "lines_per_s": None, "cpu_percent": None,
                   "rss_bytes": None}],
    }
    lines = table(status).splitlines()
    assert lines[0] == "job j: 1 of 3 node(s), world size 2+, round 2, restarts 1 used / 0 left, elapsed 1:02:05"
    assert lines[1] == "slow ranks (stragglers): 0"
    assert lines[2] == "failed ranks: 1"
    assert lines[3] == "no status yet from the node(s) with group rank 1, 2 (cannot reach the job's store)"
    assert lines[4].split()[6:8] == ["HEARTBEAT", "STEPS/S"], lines[4]
    assert lines[5].split() == ["a", "0", "0", "9", "running", "1", "-", "3.5", "-", "1", "3.0", "MiB", "1",
                                 "87", "2.0", "GiB"]
    assert lines[6].split() == ["a", "1", "1", "10", "failed", "(3)", "1", "-", "-", "-", "-", "-", "-", "-", "-"]


def test_the_table_shows_each_nodes_group_rank_and_path_with_topology():
    def rank(node: str, group: int, number: int) -> dict[str, object]:
        return {"node": node, "group_rank": group, "rank": number, "local_rank": 0, "pid": 20 + number,
                "state": "running", "exit_code": None, "restarts": 0, "heartbeat_age_s": None, "lines_per_s": None,
                "cpu_percent": None, "rss_bytes": None}

    status = {
        "job": {"run_id": "j", "nodes": 3, "world_size": 3, "round": 0, "restarts_used": 0, "restarts_left": 0,
                "elapsed_s": 5.0, "hung_ranks": [], "failed_ranks": []},
        "nodes": [{"node": "10.0.0.3_7_0", "group_rank": 0, "topology": "spine0.leaf-a"},
                  {"node": "10.0.0.1_7_0", "group_rank": 1, "topology": "spine0.leaf-a"},
                  {"node": "10.0.0.2_7_0", "group_rank": 2, "topology": None}],
        "missing_nodes": [], "store_problem": None,
        "ranks": [rank("10.0.0.3_7_0", 0, 0), rank("10.0.0.1_7_0", 1, 1), rank("10.0.0.2_7_0", 2, 2)],
    }
    lines = table(status).splitlines()
    assert lines[1].split()[:5] == ["NODE", "GROUP", "PATH", "RANK", "LOCAL"], lines
    assert [line.split()[:4] for line in lines[2:]] == [
        ["10.0.0.3_7_0", "0", "spine0.leaf-a", "0"], ["10.0.0.1_7_0", "1", "spine0.leaf-a", "1"],
        ["10.0.0.2_7_0", "2", "-", "2"]], lines  # a node auto placed nowhere: no path
    # Without --topology no node has a path: the table is as before, no empty columns.
    for node in status["nodes"]:
        node["topology"] = None
    assert table(status).splitlines()[1].split()[:3] == ["NODE", "RANK", "LOCAL"]
