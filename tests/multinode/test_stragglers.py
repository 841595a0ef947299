"""A straggler across namespace hosts: a real gloo DDP job, one rank's compute 30% slower; both nodes name it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.multinode.harness import wait_all

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
]

DDP_JOB = str(Path(__file__).resolve().parents[1] / "stragglers" / "scripts" / "ddp_job.py")
RDZV_PORT = 29400
NAMED = re.compile(r"^launcher: straggler: rank (\d+) \(node (\S+), local rank (\d+)\) is ([\d.]+)x slower", re.M)


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(150)
def test_a_rank_30_percent_slower_is_named_by_both_nodes(make_network, start_agent, tmp_path):
    net = make_network(2)
    args = [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", net[0].endpoint(RDZV_PORT), "--rdzv-id", "mn-straggler", "--rdzv-conf", "join_timeout=60",
        "--straggler-detection", "--straggler-interval", "1", "--event-log-handler", "jsonl",
    ]
    # Global rank 3 is node B's second worker (node B has group rank 1 and ranks 2-3).
    job = [DDP_JOB, "--seconds", "15", "--compute", "0.05", "--slow-rank", "3", "--factor", "1.3"]
    agents = [start_agent(net[i], [*args, "--local-addr", net[i].addr, *job],
                          env={"TMPDIR": str(tmp_path), "LAUNCHER_EVENTS_FILE": str(tmp_path / f"events{i}.jsonl")})
              for i in (0, 1)]
    wait_all(agents, 120)
    detail = "\n".join(a.describe(60) for a in agents)
    verdicts = []
    for i, agent in enumerate(agents):
        named = NAMED.findall(agent.stderr)
        assert named, detail
        rank, node, local_rank, ratio = named[0]
        assert (rank, local_rank) == ("3", "1") and node.startswith(f"{net[1].addr}_"), detail
        assert 1.15 <= float(ratio) <= 1.4, detail
        assert "waited" in agent.stderr and "(threshold 1.15x)" in agent.stderr, detail
        assert re.search(r"^launcher: stragglers seen during this job: rank 3 \(node ", agent.stderr, re.M), detail
        verdicts.append([(r, n) for r, n, _, _ in named])
        events = _events(tmp_path / f"events{i}.jsonl")
        started = next(e["timestamp"] for e in events if e["type"] == "workers_started")
        detected = [e for e in events if e["type"] == "straggler_detected"]
        assert detected and [s["rank"] for s in detected[0]["data"]["stragglers"]] == [3], detail
        assert detected[0]["timestamp"] - started < 60, detail
    assert verdicts[0] == verdicts[1], detail  # the same verdict on both nodes, change for change
