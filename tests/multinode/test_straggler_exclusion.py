"""``--straggler-action exclude`` across namespace hosts: a real gloo DDP job with one rank's compute 30%
slower. With ``--nnodes 2:3`` its node is put out (exit 69, one line why) and the other two finish in
the next round, both naming it; with ``--nnodes 2:2`` it is only reported, with one line why not,
unless a spare waits: then the spare takes its place, and once the spare is used up a straggler of
the new round is only reported."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from launcher.stragglers.exclusion import EXIT_NODE_EXCLUDED

from tests.multinode.harness import wait_all, wait_until
from tests.multinode.test_spares import SECRET, SPARE_LINE

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
]

DDP_JOB = str(Path(__file__).resolve().parents[1] / "stragglers" / "scripts" / "ddp_job.py")
RDZV_PORT = 29400
NAMED = re.compile(r"^launcher: straggler: rank (\d+) \(node (\S+), local rank 0\) is ([\d.]+)x slower", re.M)
EXCLUDED = re.compile(r"^launcher: straggler excluded: node (\S+) was put out of the job \(rank (\d+) "
                      r"\(local rank 0\) ([\d.]+)x slower than the median rank: .*\); the job goes on without it$",
                      re.M)
NOT_EXCLUDED = re.compile(r"^launcher: straggler not excluded: node (\S+) \(rank (\d+), [\d.]+x slower than the "
                          r"median rank\) stays in the job: (.*)$", re.M)


def _args(net, run_id: str, nnodes: str) -> list[str]:
    return [
        "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", net[0].endpoint(RDZV_PORT), "--rdzv-id", run_id,
        # A full round forms at once; with fewer, the last call waits long enough for an agent slow to start.
        "--rdzv-conf", "join_timeout=60,last_call_timeout=4,close_timeout=10",
        "--monitor-interval", "0.2", "--shutdown-timeout", "3", "--max-restarts", "0",
        "--straggler-detection", "--straggler-interval", "1", "--straggler-action", "exclude",
        "--event-log-handler", "jsonl",
    ]


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(180)
def test_the_straggler_node_is_put_out_and_the_others_finish(make_network, start_agent, tmp_path):
    net = make_network(3)
    # One rank a node: global rank 2 is on node 1 or 2 (the store's host, node 0, is group rank 0). With
    # three ranks it runs until put out (60 s at most); the re-formed pair has no rank 2 and runs 3 s.
    job = [DDP_JOB, "--seconds", "3", "--seconds-at-world", "3=60", "--compute", "0.05", "--slow-rank", "2",
           "--factor", "1.3"]
    agents = [start_agent(net[i], [*_args(net, "st-exclude", "2:3"), "--local-addr", net[i].addr, *job],
                          env={"TMPDIR": str(tmp_path), "LAUNCHER_EVENTS_FILE": str(tmp_path / f"events{i}.jsonl")})
              for i in range(3)]
    codes = wait_all(agents, 150, expect=None)
    detail = "\n".join(a.describe(60) for a in agents)
    assert sorted(codes) == [0, 0, EXIT_NODE_EXCLUDED] and codes[0] == 0, detail
    out = codes.index(EXIT_NODE_EXCLUDED)
    named = NAMED.findall(agents[0].stderr)
    assert named and named[0][0] == "2", detail
    node = named[0][1]
    assert node.startswith(f"{net[out].addr}_"), detail  # rank 2's node is the one put out
    # The node put out says why, once, and stopped its workers (its agent waited for them).
    why = [line for line in agents[out].stderr.splitlines() if "was put out of the job as a straggler" in line]
    assert len(why) == 1 and f"node {node} was put out of the job as a straggler (rank 2 (local rank 0) " in why[0]
    assert f"(exit status {EXIT_NODE_EXCLUDED})" in why[0], detail
    for i in (i for i in range(3) if i != out):
        excluded = EXCLUDED.findall(agents[i].stderr)
        assert [(n, r) for n, r, _ in excluded] == [(node, "2")] and float(excluded[0][2]) >= 1.15, detail
        assert f"launcher: nodes put out of this job as stragglers: node {node} (straggler: rank 2" in agents[i].stderr
        events = _events(tmp_path / f"events{i}.jsonl")
        out_events = [e["data"] for e in events if e["type"] == "node_excluded"]
        assert [(e["excluded_node"], e["check"]) for e in out_events] == [(node, "straggler")], detail
        rounds = [e["data"]["group_world_size"] for e in events if e["type"] == "rendezvous_completed"]
        assert rounds[0] == 3 and rounds[-1] == 2, detail  # finished in a round without it
        done = [e["data"] for e in events if e["type"] == "job_succeeded"]
        assert [d["restart_count"] for d in done] == [0], detail  # re-forming without it costs no restart
        assert "not excluded" not in agents[i].stderr and "lost contact" not in agents[i].stderr, detail
        assert f"node(s) {node} (straggler: rank 2" in agents[i].stderr, detail  # "...put out of the job; re-forming"


@pytest.mark.timeout(120)
def test_never_below_the_minimum_only_reported(make_network, start_agent, tmp_path):
    net = make_network(2)
    job = [DDP_JOB, "--seconds", "16", "--compute", "0.05", "--slow-rank", "1", "--factor", "1.3"]
    agents = [start_agent(net[i], [*_args(net, "st-not-excluded", "2:2"), "--local-addr", net[i].addr, *job],
                          env={"TMPDIR": str(tmp_path), "LAUNCHER_EVENTS_FILE": str(tmp_path / f"events{i}.jsonl")})
              for i in range(2)]
    wait_all(agents, 100)
    detail = "\n".join(a.describe(60) for a in agents)
    for i, agent in enumerate(agents):
        named = NAMED.findall(agent.stderr)
        assert named and named[0][0] == "1" and named[0][1].startswith(f"{net[1].addr}_"), detail
        # Both nodes say why, once: the decider (node 0) and the straggler's node reach the same answer.
        why = NOT_EXCLUDED.findall(agent.stderr)
        assert why == [(named[0][1], "1", "the job would fall below its 2 nodes minimum and no spare waits")], detail
        assert "straggler excluded" not in agent.stderr, detail
        events = _events(tmp_path / f"events{i}.jsonl")
        assert not [e for e in events if e["type"] == "node_excluded"], detail
        assert len([e for e in events if e["type"] == "rendezvous_completed"]) == 1, detail  # never re-formed


@pytest.mark.timeout(180)
def test_a_spare_takes_the_place_of_the_straggler_node(make_network, start_agent, tmp_path):
    """``--nnodes 2:2`` and a third agent waiting as a spare: the straggler's node is put out
    (exit 69), the spare is called and the job finishes in the new round. There the spare holds
    the slow global rank in turn, and with no spare left it is only reported, one line why."""
    net = make_network(3)
    # Global rank 1 is slow: node 1 in round 0 (node 0 serves the store and is group rank 0), the
    # spare in round 1. The pair runs until put out (60 s at most); ranks stop once any wants to
    # (a MAX all-reduce), so the spare's shorter --seconds ends round 1: long enough for a verdict.
    job = [DDP_JOB, "--compute", "0.05", "--slow-rank", "1", "--factor", "1.3"]
    env = [{**SECRET, "TMPDIR": str(tmp_path), "LAUNCHER_EVENTS_FILE": str(tmp_path / f"events{i}.jsonl")}
           for i in range(3)]

    def start(i: int, seconds: str):
        return start_agent(net[i], [*_args(net, "st-spare", "2:2"), "--local-addr", net[i].addr, *job,
                                    "--seconds", seconds], env=env[i])

    agents = [start(0, "60"), start(1, "60")]
    # The spare arrives once round 0 is sealed (the secret lets it wait inside the store), well
    # before the first verdict: that needs the workers up, then four intervals and two windows.
    wait_until(lambda: all("round 0 formed" in a.stderr for a in agents), 60, "round 0 to form",
               on_timeout=lambda: "\n".join(a.describe(60) for a in agents))
    agents.append(start(2, "10"))
    wait_until(lambda: SPARE_LINE in agents[2].stderr, 30, "node 2 to say it waits as a spare",
               on_timeout=lambda: "\n".join(a.describe(60) for a in agents))
    codes = wait_all(agents, 150, expect=None)
    detail = "\n".join(a.describe(60) for a in agents)
    assert codes == [0, EXIT_NODE_EXCLUDED, 0], detail
    events = [_events(tmp_path / f"events{i}.jsonl") for i in range(3)]
    named = NAMED.findall(agents[0].stderr)
    assert named and named[0][0] == "1" and named[0][1].startswith(f"{net[1].addr}_"), detail
    node = named[0][1]
    why = [line for line in agents[1].stderr.splitlines() if "was put out of the job as a straggler" in line]
    assert len(why) == 1 and f"node {node} was put out of the job as a straggler (rank 1 (local rank 0) " in why[0]
    assert why[0].endswith(f"(exit status {EXIT_NODE_EXCLUDED})"), detail
    assert not [e for e in events[1] if e["type"] == "job_succeeded"], detail
    # The spare is called and forms round 1 with node 0, in place of the node put out.
    assert "this spare is called" in agents[2].stderr, detail
    spare = [e["data"] for e in events[2] if e["type"] == "rendezvous_completed"]
    assert [(d["round"], d["group_world_size"]) for d in spare] == [(1, 2)] and node not in spare[0]["participants"]
    spare_node = spare[0]["participants"][spare[0]["group_rank"]]
    for i in (0, 2):
        # Both nodes of the new round say which node was put out and why.
        excluded = EXCLUDED.findall(agents[i].stderr)
        assert [(n, r) for n, r, _ in excluded] == [(node, "1")] and float(excluded[0][2]) >= 1.15, detail
        assert f"launcher: nodes put out of this job as stragglers: node {node} (straggler: rank 1" in agents[i].stderr
        assert [(e["data"]["excluded_node"], e["data"]["check"]) for e in events[i]
                if e["type"] == "node_excluded"] == [(node, "straggler")], detail
        rounds = [e["data"] for e in events[i] if e["type"] == "rendezvous_completed"]
        assert rounds[-1]["round"] == 1 and rounds[-1]["participants"] == spare[0]["participants"], detail
        done = [e["data"] for e in events[i] if e["type"] == "job_succeeded"]
        assert [d["restart_count"] for d in done] == [0], detail  # a re-form for a node put out is no restart
        # Round 1: global rank 1 (the spare's, or node 0's if the spare took group rank 0) is slow
        # again, and with no spare left and MIN reached it stays, one line why on each node.
        second = NOT_EXCLUDED.findall(agents[i].stderr)
        assert len(second) == 1 and second[0][1] == "1", detail
        if spare[0]["group_rank"] == 1:
            assert second[0][0] == spare_node, detail
            assert second[0][2] == "the job would fall below its 2 nodes minimum and no spare waits", detail
    # The spare says the node it replaces and why once it is called, not while it waits.
    assert agents[2].stderr.index("this spare is called") < agents[2].stderr.index("straggler excluded"), detail
    # From the verdict (every node's, same interval) and from node 0 reading the departure, to the
    # spare's workers started.
    verdict_at = next(e["timestamp"] for e in events[0] if e["type"] == "straggler_detected")
    put_out_at = next(e["timestamp"] for e in events[0] if e["type"] == "node_excluded")
    started_at = next(e["timestamp"] for e in events[2] if e["type"] == "workers_started")
    assert started_at > verdict_at, detail  # the spare started no worker before it was called
    print(f"the spare's workers started {started_at - verdict_at:.2f} s after the verdict, "
          f"{started_at - put_out_at:.2f} s after node 0 read the exclusion")
