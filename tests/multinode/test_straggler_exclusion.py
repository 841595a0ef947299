"""``--straggler-action exclude`` across namespace hosts: a real gloo DDP job with one rank's compute 30%
slower. With ``--nnodes 2:3`` its node is put out (exit 69, one line why) and the other two finish in
the next round, both naming it; with ``--nnodes 2:2`` it is only reported, with one line why not."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from launcher.stragglers.exclusion import EXIT_NODE_EXCLUDED

from tests.multinode.harness import wait_all

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
