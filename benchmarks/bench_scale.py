"""Rendezvous at scale: one c10d round and the steady load of N nodes on the store's host.

The store's host runs in a process of its own: launcher's pure-Python server (what the c10d
backend's host serves), or torch's TCPStore (libuv backend, ``is_master=True``) for comparison.
The nodes are :class:`launcher.testing.crowd.Crowd`s: coroutines in a few processes, one real
socket each, sending the requests a real node sends under the real key names (the CI test
``tests/rendezvous/test_crowd.py`` has them form rounds with real handlers). Per size it prints:

* the round: from "go" until the last node knows its rank and the workers' store;
* the store host's CPU seconds during the round, and its RSS after it;
* the bytes of the round's records that one node reads (``sealed`` and its ``place``: the same
  at every size), the size of the round's ``roster`` (which only the closer and the nodes that
  need it read), and what reading its records costs one real node (decode them and find its
  rank; on a cluster every node does that on its own CPU, in parallel; here it is timed once);
* at ``--steady`` sizes, for ``--steady-s`` seconds of the per-interval load (the heartbeat ring,
  status records, aggregated straggler summaries; :class:`~launcher.testing.crowd.SteadyLoad`):
  the host's CPU (cores) and RSS, requests per second, and each request's p50/p99 latency as
  one more node in the benchmark's own (idle) process sees it, and as the crowd saw it (its
  event loop's delays included: on a 2-core machine the crowd, not the host, is then busy);
* the per-exchange figures of ``benchmarks/bench_exchanges.py``, when that file exists
  (:func:`exchange_figures`).

With ``--base REV`` a third host, ``base``, is launcher's server of revision ``REV`` (its
``core/`` extracted with ``git archive``; the crowd stays this checkout's, so both get the same
requests): a before/after in one run. With ``--repeat K`` every size runs K times, the hosts
taking turns (each turn every size, and every host at each size: ours, base, torch, ...) so
that a change in the machine's load hits them alike; the tables give each host's median and
its fastest round.

The crowd runs in as many processes at every size (``--procs``; default: one per core, 2 to 4):
on a shared machine their share of the cores then does not change with the size (one process at
1,024 nodes and four at 4,096 gave 4,096 nodes a larger share of a loaded machine than 1,024).

Usage::

    python benchmarks/bench_scale.py                                   # 64, 256, 1024, 4096; both hosts
    python benchmarks/bench_scale.py --sizes 1024,2048,4096 --hosts ours --steady 0
    python benchmarks/bench_scale.py --sizes 64,256,1024,2048,4096 --hosts both --base 02ae38d --repeat 3 --steady 0
    python benchmarks/bench_scale.py --sizes 1024 --hosts ours --steady 0 --domains 16 --segment 4 --repeat 5
    python benchmarks/bench_scale.py --sizes 1024,4096 --hosts ours --steady 0 --domains 16 --segment 4 --repeat 7 \
        --no-exchanges --out benchmarks/results/scale_topology.json

``--domains D`` adds rounds whose nodes carry a ``--topology`` path (D domains), and ``--segment N``
rounds formed of whole segments (docs/topology.md), taking turns with the plain ones.

Writes ``benchmarks/results/scale.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "scale.json"
HOSTS = ("ours", "base", "torch")
RUN_ID = "scale"

OUR_HOST = """
import sys
from launcher.store.server import StoreServer
server = StoreServer("127.0.0.1", 0, clients=int(sys.argv[1])).start()
print(server.port, flush=True)
sys.stdin.read()
"""

TORCH_HOST = """
import resource, sys
from datetime import timedelta
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False,
                      timeout=timedelta(seconds=600))
print(store.port, flush=True)
sys.stdin.read()
"""


#: Where ``--base``'s revision was extracted (its ``core/`` serves the ``base`` host).
BASE_TREE: Path | None = None


def _env(tree: Path = ROOT) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree / "core"), env.get("PYTHONPATH", "")]))
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return env


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- the store host's process -------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` so far (system: the kernel's share, on
    loopback most of it TCP, the peer's receiving included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """``VmRSS`` (or ``VmHWM``, the peak) of process ``pid`` in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_host(kind: str, n: int) -> tuple[subprocess.Popen[str], int]:
    """The store host's process and its port."""
    script = TORCH_HOST if kind == "torch" else OUR_HOST
    tree = ROOT
    if kind == "base":
        if BASE_TREE is None:
            raise RuntimeError("the base host needs --base REV")
        tree = BASE_TREE
    proc = subprocess.Popen([sys.executable, "-c", script, str(n + 16)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=_env(tree))
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


# -- the nodes' processes -----------------------------------------------------------------------


def _crowd_main(port: int, nodes: int, first: int, count: int, wait_slice: float | None,
                domains: int = 0, segment: int | None = None) -> None:
    """A crowd process: connect, say ``ready``; on ``go`` join; on ``steady S`` load; print JSON."""
    from launcher.testing.crowd import Crowd

    _raise_fd_limit()

    async def main() -> None:
        crowd = Crowd("127.0.0.1", port, RUN_ID, nodes=nodes, first=first, count=count, wait_slice=wait_slice,
                      domains=domains, segment=segment)
        await crowd.connect()
        loop = asyncio.get_running_loop()
        print("ready", flush=True)
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if line.strip() == "go":
                done = await crowd.join()
                print(json.dumps({"done": done, "ranks": crowd.ranks, "marks": crowd.marks}), flush=True)
            elif line.startswith("steady"):
                if not crowd.ranks:
                    crowd.assume_round()
                latencies = await crowd.steady(float(line.split()[1]))
                print(json.dumps({k: [round(x * 1e6) for x in v] for k, v in latencies.items()}), flush=True)
            else:
                break
        crowd.close()

    asyncio.run(main())


def _crowds(port: int, n: int, procs: int, wait_slice: float | None,
            placement: tuple[int, int | None] = (0, None)) -> list[subprocess.Popen[str]]:
    shares = [n // procs + (1 if k < n % procs else 0) for k in range(procs)]
    children, first = [], 0
    for share in shares:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--crowd", str(port), str(n), str(first), str(share)]
        if wait_slice is not None:
            cmd += ["--wait-slice", str(wait_slice)]
        domains, segment = placement
        if domains:
            cmd += ["--domains", str(domains)] + (["--segment", str(segment)] if segment else [])
        children.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env()))
        first += share
    return children


def _tell(children: list[subprocess.Popen[str]], line: str) -> None:
    for child in children:
        assert child.stdin is not None
        child.stdin.write(line + "\n")
        child.stdin.flush()


def _read(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        raise RuntimeError(f"a crowd process ended early (exit {child.wait()})")
    return line


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def sealed_read_cost(port: int) -> dict[str, float]:
    """What the round's records cost one real node: the bytes it reads (``sealed`` and the
    place of its join index, the last one here), the ``roster``'s size (KB), and decoding what
    it reads to find its rank (ms, best of several)."""
    from launcher.rendezvous.keys import RendezvousKeys
    from launcher.rendezvous.membership import decode
    from launcher.store.client import TCPStoreClient

    keys = RendezvousKeys(RUN_ID)
    with TCPStoreClient("127.0.0.1", port, timeout=60) as client:
        sealed = client.get(keys.sealed(0))
        count = int(decode(sealed)["count"])
        place = client.get(keys.place(0, count))
        roster = client.get(keys.roster(0))
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        decode(sealed)
        int(decode(place)["rank"])
        best = min(best, time.perf_counter() - start)
    return {"node_bytes": len(sealed) + len(place), "roster_kb": round(len(roster) / 1024, 1),
            "node_read_ms": round(best * 1e3, 3)}


def measure(kind: str, n: int, procs: int, limit: float,
            placement: tuple[int, int | None] = (0, None)) -> dict[str, Any]:
    """One round of ``n`` nodes on a ``kind`` store host; everything is killed (and reported)
    past ``limit`` seconds. ``placement``: the nodes' domains (0: no ``--topology``) and
    ``--segment`` (``None``: off)."""
    host, port = start_host(kind, n)
    # Both hosts get the same requests: waits in the rendezvous's own slices (a slice that ends
    # costs a CANCEL_WAIT and a new WAIT; torch's server answers those as launcher's does, see
    # docs/rendezvous.md and tests/rendezvous/test_crowd.py).
    children = _crowds(port, n, procs, None, placement)
    result: dict[str, Any] = {"host": kind, "nodes": n, "processes": procs, "placement": _placement_name(placement)}
    guard = threading.Timer(limit, lambda: [c.kill() for c in children if c.poll() is None])
    try:
        for child in children:
            assert _read(child).strip() == "ready"
        guard.start()  # connecting thousands of clients is not part of the limit
        idle_rss = rss_mb(host.pid)
        user0, sys0 = cpu_split(host.pid)
        crowd0 = sum(cpu_seconds(child.pid) for child in children)
        start = time.monotonic()
        _tell(children, "go")
        parts = [json.loads(_read(child)) for child in children]
        # The simulated nodes' CPU, all processes together (on a cluster: every node its own).
        result["crowd_cpu_s"] = round(sum(cpu_seconds(child.pid) for child in children) - crowd0, 3)
        result["round_s"] = round(max(p["done"] for p in parts) - start, 3)
        marks: dict[str, float] = {}
        for p in parts:
            for name, at in p["marks"].items():
                marks[name] = max(marks.get(name, 0.0), at)
        result["timeline_s"] = {name: round(at - start, 3) for name, at in sorted(marks.items(), key=lambda m: m[1])}
        if "closer_start" in marks and "sealed" in marks:
            # The closer's part alone (read the records, choose, write): the one phase in which
            # the placements' protocols differ; steadier than the round on a shared machine.
            result["closer_s"] = round(marks["sealed"] - marks["closer_start"], 4)
        user1, sys1 = cpu_split(host.pid)
        # max(): a difference of equal tick counts can come out as -0.0 in floating point.
        result["host_user_s"], result["host_sys_s"] = max(0.0, round(user1 - user0, 3)), max(0.0, round(sys1 - sys0, 3))
        result["host_cpu_round_s"] = round(result["host_user_s"] + result["host_sys_s"], 3)
        ranks = sorted(r for p in parts for r in p["ranks"])
        result["ranks_ok"] = ranks == list(range(n))
        result["host_rss_mb"] = round(rss_mb(host.pid), 1)
        result["host_rss_idle_mb"] = round(idle_rss, 1)
        result.update(sealed_read_cost(port))
        _tell(children, "end")
        for child in children:
            child.wait(60)
        result["status"] = "ok" if result["ranks_ok"] else "error"
    except Exception as exc:  # reported in the table; the other sizes still run
        result["status"] = "error"
        result["error"] = f"{type(exc).__name__}: {exc}"
        if guard.finished.is_set():  # the guard fired: the children were killed
            result["error"] = f"did not finish within {limit:g} s"
    finally:
        _stop(guard, children, host)
    return result


def _placement_name(placement: tuple[int, int | None]) -> str:
    domains, segment = placement
    if not domains:
        return "plain"
    return f"topology/{domains}" + (f" segment {segment}" if segment else "")


def measure_steady(kind: str, n: int, procs: int, seconds: float, limit: float) -> dict[str, Any]:
    """``seconds`` of the steady load of ``n`` nodes (ranks taken, no round formed) on a fresh
    ``kind`` store host: its CPU and memory, and each request's latency."""
    host, port = start_host(kind, n)
    children = _crowds(port, n, procs, None)
    result: dict[str, Any] = {"host": kind, "nodes": n, "processes": procs}
    guard = threading.Timer(limit + seconds, lambda: [c.kill() for c in children if c.poll() is None])
    try:
        for child in children:
            assert _read(child).strip() == "ready"
        guard.start()  # connecting thousands of clients is not part of the limit
        result["host_rss_idle_mb"] = round(rss_mb(host.pid), 1)
        cpu0, t0 = cpu_seconds(host.pid), time.monotonic()
        _tell(children, f"steady {seconds}")
        stop = threading.Event()
        probed: dict[str, list[float]] = {}
        probe = threading.Thread(target=_probe, args=(port, n, stop, probed), daemon=True)
        probe.start()
        latencies: dict[str, list[float]] = {}
        for child in children:
            for name, values in json.loads(_read(child)).items():
                latencies.setdefault(name, []).extend(v / 1e3 for v in values)
        elapsed = time.monotonic() - t0
        stop.set()
        probe.join(30)
        result.update({
            "seconds": round(elapsed, 1),
            "host_cpu_cores": round((cpu_seconds(host.pid) - cpu0) / elapsed, 3),
            "host_rss_mb": round(rss_mb(host.pid), 1),
            "host_peak_rss_mb": round(rss_mb(host.pid, "VmHWM"), 1),
            "requests_per_s": round(sum(len(v) for v in latencies.values()) / elapsed),
            "latency_ms": _summary(latencies),
            "probe_latency_ms": _summary(probed),
            "status": "ok",
        })
        _tell(children, "end")
        for child in children:
            child.wait(60)
    except Exception as exc:  # reported in the table
        result["status"] = "error"
        failed = f"{type(exc).__name__}: {exc}"
        result["error"] = f"did not finish in {limit:g} s" if guard.finished.is_set() else failed
    finally:
        _stop(guard, children, host)
    return result


def _summary(latencies: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        name: {"n": len(v), "p50": round(_percentile(v, 0.5), 3), "p99": round(_percentile(v, 0.99), 3)}
        for name, v in sorted(latencies.items())
    }


def _probe(port: int, n: int, stop: threading.Event, latencies: dict[str, list[float]]) -> None:
    """One more node in this (otherwise idle) process: the steady load's requests in turn, 20 a
    second, timed (ms). The crowd's own figures include its event loop's delays when its
    processes are busy; this one's are the store host's answer under that load."""
    from launcher.rendezvous.keys import RendezvousKeys
    from launcher.store.api import StoreError
    from launcher.store.client import TCPStoreClient

    keys = RendezvousKeys(RUN_ID)
    agent = keys.agent(0)
    requests = [
        ("add", lambda c: c.add(keys.heartbeat(0, 0), 0)),
        ("set", lambda c: c.set(f"{agent}status/{n}", b"s" * 1500)),
        ("check", lambda c: c.check([f"{agent}stragglers/verdict"])),
        ("add", lambda c: c.add(keys.heartbeat(0, n), 1)),
        ("get", lambda c: c.get(f"{agent}stragglers/verdict")),
    ]
    with TCPStoreClient("127.0.0.1", port, timeout=60) as client:
        client.set(f"{agent}stragglers/verdict", b"v" * 200)
        turn = 0
        while not stop.wait(0.05):
            name, request = requests[turn % len(requests)]
            start = time.perf_counter()
            try:
                request(client)
            except StoreError:  # the host went away (the measurement failed): nothing more to time
                return
            latencies.setdefault(name, []).append((time.perf_counter() - start) * 1e3)
            turn += 1


def exchange_figures(n: int) -> dict[str, Any] | None:
    """Store requests and bytes per node per interval of each cross-node exchange at ``n`` nodes,
    with this tree's algorithm, from ``benchmarks/bench_exchanges.py`` (its ``figures(n)``; main's
    algorithm, the "before", is in that benchmark's own run);
    ``None`` while that benchmark does not exist."""
    path = ROOT / "benchmarks" / "bench_exchanges.py"
    if not path.exists():
        return None
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and 2 * n + 256 > hard:
        # Its harness holds the store's side and every node's side of each connection in one process.
        print(f"  N={n:<6} exchanges not measured: one process would need {2 * n} descriptors "
              f"(open-files hard limit {hard})", flush=True)
        return None
    sys.path.insert(0, str(path.parent))
    try:
        import bench_exchanges  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    figures = getattr(bench_exchanges, "figures", None)
    return figures(n) if callable(figures) else None


def _stop(guard: Any, children: list[subprocess.Popen], host: subprocess.Popen) -> None:
    """After a measurement: cancel its guard, kill the simulated nodes left, and end the store host
    (its stdin closing tells it to)."""
    guard.cancel()
    for child in children:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert host.stdin is not None
    host.stdin.close()
    host.wait(30)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} {five:.1f} {fifteen:.1f}"


def medians(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per host and size, the median of the rounds that formed (round time, the host's CPU,
    its user and system parts), the fastest round (on a shared machine the steadier figure: the
    one least slowed by other work), how many formed, and the load averages they ran at."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in results:
        if r.get("kind") == "round":
            groups.setdefault((r["host"], r["nodes"], r.get("placement", "plain")), []).append(r)
    table = []
    for (host, n, placement), runs in groups.items():
        ok = [r for r in runs if r.get("status") == "ok"]
        row: dict[str, Any] = {"host": host, "nodes": n, "placement": placement, "runs": len(runs), "ok": len(ok),
                               "load_averages": [r.get("load_average") for r in runs]}
        for name in ("round_s", "closer_s", "host_cpu_round_s", "host_user_s", "host_sys_s", "crowd_cpu_s",
                     "host_rss_mb", "node_bytes", "roster_kb", "node_read_ms"):
            values = [r[name] for r in ok if name in r]
            if values:
                row[name] = round(statistics.median(values), 3)
        if ok:
            row["round_best_s"] = min(r["round_s"] for r in ok)
        else:
            row["error"] = runs[-1].get("error", "error")
        table.append(row)
    return table


def print_tables(results: list[dict[str, Any]]) -> None:
    print(f"{'host':>6} {'nodes':>6} {'round s':>8} {'best s':>7} {'closer s':>8} {'host CPU s':>10} "
          f"{'user/sys s':>10} {'crowd CPU s':>11} {'host RSS MB':>11} {'node B':>6} {'roster KB':>9} "
          f"{'node read ms':>12} {'runs ok':>7}  placement")
    for r in medians(results):
        if not r["ok"]:
            print(f"{r['host']:>6} {r['nodes']:>6} {r.get('error', 'error')}")
            continue
        split = f"{r.get('host_user_s', 0):.2f}/{r.get('host_sys_s', 0):.2f}"
        print(f"{r['host']:>6} {r['nodes']:>6} {r['round_s']:>8.2f} {r['round_best_s']:>7.2f} "
              f"{r.get('closer_s', 0):>8.3f} {r['host_cpu_round_s']:>10.2f} {split:>10} "
              f"{r.get('crowd_cpu_s', 0):>11.2f} "
              f"{r['host_rss_mb']:>11.1f} {r['node_bytes']:>6.0f} {r['roster_kb']:>9.1f} {r['node_read_ms']:>12.3f} "
              f"{r['ok']:>3}/{r['runs']:<3}  {r['placement']}")
    for s in (r for r in results if "latency_ms" in r):
        print(f"\nsteady state, {s['nodes']} nodes, {s['host']} host, {s['seconds']} s: "
              f"{s['host_cpu_cores']:.3f} cores, RSS {s['host_rss_mb']:.0f} MB (peak {s['host_peak_rss_mb']:.0f}, "
              f"idle {s['host_rss_idle_mb']:.0f}), {s['requests_per_s']} requests/s")
        for name, lat in s["probe_latency_ms"].items():
            print(f"  {name:>12}: p50 {lat['p50']:.2f} ms  p99 {lat['p99']:.2f} ms  ({lat['n']} requests of the probe)")
        for name, lat in s["latency_ms"].items():
            print(f"  {name:>12}: p50 {lat['p50']:.2f} ms  p99 {lat['p99']:.2f} ms  ({lat['n']} requests, "
                  "as the crowd saw them)")
    for s in (r for r in results if r.get("kind") == "steady" and r.get("status") != "ok"):
        print(f"\nsteady state, {s['nodes']} nodes, {s['host']} host: {s.get('error')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256,1024,4096", help="comma-separated node counts")
    parser.add_argument("--hosts", default="ours,torch", help="store hosts: ours, torch, or both")
    parser.add_argument("--base", help="also time launcher's server of this git revision (host 'base')")
    parser.add_argument("--repeat", type=int, default=1, help="rounds per size and host, the hosts taking turns")
    parser.add_argument("--steady", default="4096", help="sizes that also run the steady load (0: none)")
    parser.add_argument("--steady-s", type=float, default=20.0, help="seconds of steady load")
    parser.add_argument("--procs", type=int, default=0, help="crowd processes at every size (default: one per "
                        "core, 2 to 4)")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds before a measurement is given up")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--domains", type=int, default=0,
                        help="--topology: also rounds of nodes spread over this many domains, taking turns with "
                        "plain ones (0: plain only)")
    parser.add_argument("--segment", type=int, default=0, help="with --domains: also rounds with --segment N")
    parser.add_argument("--no-exchanges", action="store_true",
                        help="leave out bench_exchanges.py's per-exchange figures (rounds only)")
    parser.add_argument("--crowd", nargs=4, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--wait-slice", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.crowd:
        _crowd_main(*args.crowd, args.wait_slice, args.domains, args.segment or None)
        return 0
    placements: list[tuple[int, int | None]] = [(0, None)]
    if args.domains:
        placements += [(args.domains, None)] + ([(args.domains, args.segment)] if args.segment else [])
    _raise_fd_limit()
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        steady = {int(s) for s in args.steady.split(",") if s.strip()}
    except ValueError:
        parser.error("--sizes and --steady take comma-separated whole numbers, e.g. 64,256,1024")
    hosts = [h.strip() for h in args.hosts.replace("both", "ours,torch").split(",") if h.strip()]
    for kind in hosts:
        if kind not in HOSTS or kind == "base":
            parser.error(f"unknown store host {kind!r}: choose from ours, torch, both")
    if args.base:
        global BASE_TREE
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from revisions import commit_of, extract

        base_dir = tempfile.TemporaryDirectory(prefix="bench-scale-base-")
        BASE_TREE = extract(args.base, Path(base_dir.name))
        hosts.insert(hosts.index("ours") + 1 if "ours" in hosts else 0, "base")
    procs = args.procs or max(2, min(4, os.cpu_count() or 2))
    print(f"{os.cpu_count()} CPUs, load average {_load()} at the start; {procs} crowd processes", flush=True)
    results = []
    # Turn by turn, every size and host once: a change in the machine's load then falls on every
    # size alike, and the growth from one size to the next is not the load's.
    for turn in range(args.repeat):
        for n in sizes:
            pairs = [(k, p) for k in hosts for p in placements]
            # Each turn starts one later in the list: no host or placement always runs last (on a
            # shared machine the order in a turn shows in the times: the last ran 5-10% slower).
            shift = turn % len(pairs)
            for kind, placement in pairs[shift:] + pairs[:shift]:
                result = measure(kind, n, procs, args.limit, placement)
                result.update(kind="round", load_average=_load(), turn=turn)
                results.append(result)
                print(f"{kind:>6} N={n:<6} {result['placement']}: {result.get('status')} "
                      f"round {result.get('round_s')} s "
                      f"host CPU {result.get('host_cpu_round_s')} s (load {result['load_average']})", flush=True)
    for n in sizes:
        for kind in hosts if n in steady else ():
            result = measure_steady(kind, n, procs, args.steady_s, args.limit)
            result.update(kind="steady", load_average=_load())
            results.append(result)
            print(f"{kind:>6} N={n:<6} steady {result.get('status')} {result.get('host_cpu_cores')} cores "
                  f"(load {result['load_average']})", flush=True)
        figures = None if args.no_exchanges else exchange_figures(n)
        if figures is not None:
            results.append({"nodes": n, "kind": "exchanges", "exchanges": figures})
            for name, figure in figures.items():
                if figure is None:
                    print(f"  N={n:<6} {name}: not measured within its limit", flush=True)
                else:
                    print(f"  N={n:<6} {name}: {figure['node_requests']:.1f} requests and "
                          f"{figure['node_bytes'] / 1024:.1f} KB per node "
                          f"(store host {figure['total_bytes'] / 1e6:.1f} MB)",
                          flush=True)
    print()
    print_tables(results)
    table = medians(results)
    growth: dict[str, list[dict[str, Any]]] = {}
    for kind in hosts:
        ok = sorted((r for r in table if r["host"] == kind and r["ok"]), key=lambda r: r["nodes"])
        growth[kind] = [
            {"from": a["nodes"], "to": b["nodes"], "time_ratio": round(b["round_s"] / a["round_s"], 2)}
            for a, b in zip(ok, ok[1:], strict=False)
            if a["round_s"] > 0
        ]
        for g in growth[kind]:
            print(f"{kind}: {g['from']} -> {g['to']} nodes: {g['time_ratio']}x the time (medians)")
    report = {
        "benchmark": "one c10d round and the steady load of N simulated nodes (asyncio crowds), one store host",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_average_end": _load()},
        "crowd_processes": procs,
        "base": {"revision": args.base, "commit": commit_of(args.base)} if args.base else None,
        "medians": table,
        "results": results,
        "growth": growth,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
