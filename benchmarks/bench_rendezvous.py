"""Rendezvous at scale: N simulated nodes completing one round, launcher's handler vs torch's.

Each measurement runs in its own process group: one process serves a TCPStore on loopback, and
``--procs`` processes (by default 4, or one per 128 nodes) simulate the nodes as threads, each
thread with its own store client and rendezvous handler (``--nnodes N:N``, so the round closes as
soon as the N-th node joins). Several processes keep one interpreter lock from serialising a
thousand nodes, which real nodes never share. The clock starts when every handler is connected
and waiting, and stops when the last ``next_rendezvous`` returns. torch's side is its
``DynamicRendezvousHandler`` over ``C10dRendezvousBackend``, on the same TCPStore and the same
harness. A measurement that passes ``--limit`` seconds is killed and reported as "did not finish".

Usage::

    python benchmarks/bench_rendezvous.py                       # N = 8, 64, 256, 1024, both
    python benchmarks/bench_rendezvous.py --sizes 8,32,64,128,256,512,1024   # the published run
    python benchmarks/bench_rendezvous.py --sizes 8,64 --impl ours

Writes ``benchmarks/results/rendezvous.json`` and plots ``docs/rendezvous-scale.png``
(matplotlib, imported only for the plot).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "rendezvous.json"
PLOT = ROOT / "docs" / "rendezvous-scale.png"
IMPLS = ("ours", "torch")
#: Seconds allowed for connecting every node's client before the clock starts (torch's client
#: does a reverse DNS lookup per connection, which this machine's resolver sometimes drops).
SETUP_LIMIT = 600.0
#: Simulated nodes per process, at most, by default: beyond that, the interpreter lock that
#: the threads of one process share (and real nodes never do) starts to dominate the round.
THREADS_PER_PROCESS = 128


def _raise_fd_limit() -> None:
    # Each simulated node holds one client socket and the server one more: 1024 nodes need
    # over 2,000 descriptors, beyond the usual soft limit of 1,024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _make_ours(port: int, n: int, run_id: str) -> Any:
    import torch.distributed as dist
    from launcher.rendezvous.config import DynamicRendezvousConfig
    from launcher.rendezvous.dynamic import DynamicRendezvousHandler
    from launcher.rendezvous.torch_store import TorchStore

    config = DynamicRendezvousConfig(join_timeout=600, last_call_timeout=30, read_timeout=120)
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    return DynamicRendezvousHandler(
        TorchStore(client),
        run_id=run_id,
        min_nodes=n,
        max_nodes=n,
        config=config,
        local_addr="127.0.0.1",
        master_addr="127.0.0.1",
        master_port=port,
        backend_name="c10d",
    )


def _make_torch(port: int, n: int, run_id: str) -> Any:
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    backend = C10dRendezvousBackend(client, run_id)
    return DynamicRendezvousHandler.from_backend(
        run_id,
        client,
        backend,
        n,
        n,
        local_addr="127.0.0.1",
        timeout=RendezvousTimeout(join=timedelta(seconds=600), last_call=timedelta(seconds=30)),
    )


def _node_process(impl: str, n: int, port: int, first: int, count: int, limit: float) -> None:
    """Simulate nodes ``first .. first + count - 1`` of ``n`` as threads; print their results."""
    import torch.distributed as dist

    _raise_fd_limit()
    logging.disable(logging.CRITICAL)  # torch's handler logs every join; that is not the subject
    # Threads mostly wait on sockets; a small stack keeps hundreds of them cheap.
    threading.stack_size(512 * 1024)
    control = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=SETUP_LIMIT + limit))
    make = _make_ours if impl == "ours" else _make_torch
    # torch's client sometimes stalls for seconds while connecting on this machine: connect
    # many at once so the stalls overlap (connecting is not what is measured).
    with ThreadPoolExecutor(max_workers=min(count, 64)) as pool:
        handlers = list(pool.map(lambda _: make(port, n, "bench"), range(count)))
    go = threading.Event()
    done: list[float] = [0.0] * count
    ranks: list[int] = [-1] * count
    errors: list[str] = []

    def node(i: int) -> None:
        go.wait()
        try:
            info = handlers[i].next_rendezvous()
            ranks[i] = info.group_rank if impl == "ours" else info.rank
        except Exception as exc:  # reported, not raised: the harness must print a result
            errors.append(f"{type(exc).__name__}: {exc}")
        done[i] = time.monotonic()

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    control.add("bench/ready", count)
    control.wait(["bench/go"])
    go.set()
    for thread in threads:
        thread.join()
    print(json.dumps({"done": max(done), "ranks": ranks, "errors": errors[:3]}), flush=True)
    os._exit(0)  # skip joining heartbeat threads and closing hundreds of sockets


def run_one(impl: str, n: int, procs: int, limit: float) -> dict[str, Any]:
    """One measurement: serve the store here, simulate the nodes in ``procs`` child processes."""
    import torch.distributed as dist

    _raise_fd_limit()
    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=limit + 120)
    )
    procs = max(1, min(procs, n))
    shares = [n // procs + (1 if k < n % procs else 0) for k in range(procs)]
    children = []
    first = 0
    t0 = time.monotonic()
    for share in shares:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--nodes-child",
            impl,
            str(n),
            str(server.port),
            str(first),
            str(share),
            "--limit",
            str(limit),
        ]
        children.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        first += share
    # Start the clock once every node is connected and waiting.
    setup_end = t0 + SETUP_LIMIT
    while server.add("bench/ready", 0) < n:
        if any(child.poll() is not None for child in children) or time.monotonic() > setup_end:
            _kill(children)
            return {"impl": impl, "nodes": n, "status": "error", "errors": ["setup failed or took too long"]}
        time.sleep(0.01)
    setup_s = time.monotonic() - t0
    start = time.monotonic()
    server.set("bench/go", "1")
    done: list[float] = []
    ranks: list[int] = []
    errors: list[str] = []
    for child in children:
        try:
            out, _ = child.communicate(timeout=max(0.0, start + limit - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(children)
            return {"impl": impl, "nodes": n, "processes": procs, "status": "did not finish", "round_s": None,
                    "setup_s": round(setup_s, 4), "limit_s": limit}  # fmt: skip
        lines = [line for line in (out or "").splitlines() if line.startswith("{")]
        if child.returncode != 0 or not lines:
            errors.append(f"node process exited with {child.returncode}")
            continue
        part = json.loads(lines[-1])
        done.append(part["done"])
        ranks.extend(part["ranks"])
        errors.extend(part["errors"])
    ok = not errors and sorted(ranks) == list(range(n))
    return {
        "impl": impl,
        "nodes": n,
        "processes": procs,
        "status": "ok" if ok else "error",
        "round_s": round(max(done) - start, 4) if done else None,
        "setup_s": round(setup_s, 4),
        "errors": errors[:3],
    }


def _kill(children: list[subprocess.Popen[str]]) -> None:
    for child in children:
        if child.poll() is None:
            child.kill()
    for child in children:
        child.wait()


def measure(impl: str, n: int, limit: float, procs: int) -> dict[str, Any]:
    """Run one measurement in a child process group; "did not finish" past ``limit`` seconds."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        impl,
        str(n),
        "--limit",
        str(limit),
        "--procs",
        str(procs),
    ]
    env = dict(os.environ)
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # torch's C++ chatter is not the subject either
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "core"), env.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    # Connecting N clients happens before the clock starts; allow time for it on top of the limit.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=SETUP_LIMIT + limit + 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"impl": impl, "nodes": n, "status": "did not finish", "limit_s": limit}
    wall = time.perf_counter() - t0
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"
        return {"impl": impl, "nodes": n, "status": "error", "errors": [tail]}
    result: dict[str, Any] = json.loads(lines[-1])
    if result.get("round_s") is not None and result["round_s"] > limit:
        result["status"] = "did not finish"
    result["process_wall_s"] = round(wall, 3)
    return result


def _child(impl: str, n: int, limit: float, procs: int) -> None:
    print(json.dumps(run_one(impl, n, procs, limit)), flush=True)
    os._exit(0)


def print_table(results: list[dict[str, Any]], sizes: list[int], impls: list[str]) -> None:
    by_key = {(r["impl"], r["nodes"]): r for r in results}
    header = f"{'nodes':>6} " + " ".join(f"{impl + ' (s)':>18}" for impl in impls)
    print(header)
    print("-" * len(header))
    for n in sizes:
        cells = []
        for impl in impls:
            r = by_key.get((impl, n))
            if r is None:
                cells.append(f"{'-':>18}")
            elif r["status"] == "ok":
                cells.append(f"{r['round_s']:>18.3f}")
            elif r["status"] == "did not finish":
                cells.append(f"{'did not finish':>18}")
            else:
                cells.append(f"{'error':>18}")
        print(f"{n:>6} " + " ".join(cells))


def plot(results: list[dict[str, Any]], limit: float, path: Path) -> None:
    """Time against N for each implementation (log-log), "did not finish" drawn at the limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    styles = {
        "ours": ("launcher (core rendezvous, c10d)", "tab:blue", "o"),
        "torch": ("torch DynamicRendezvousHandler (c10d)", "tab:red", "s"),
    }
    for impl, (label, color, marker) in styles.items():
        rows = sorted((r for r in results if r["impl"] == impl), key=lambda r: r["nodes"])
        ok = [(r["nodes"], r["round_s"]) for r in rows if r["status"] == "ok"]
        dnf = [r["nodes"] for r in rows if r["status"] == "did not finish"]
        if ok:
            ax.plot([x for x, _ in ok], [y for _, y in ok], marker=marker, color=color, label=label)
        if dnf:
            ax.scatter(dnf, [limit] * len(dnf), marker="x", s=80, color=color, label=f"{label}: did not finish")
        if impl == "ours" and ok:
            # Linear growth from the smallest N, to compare the slope against.
            n0, t0 = ok[0]
            xs = [n0, max(x for x, _ in ok)]
            ax.plot(xs, [t0 * x / n0 for x in xs], linestyle="--", color=color, alpha=0.4, label="linear growth")
    ax.axhline(limit, color="grey", linestyle=":", linewidth=1)
    ax.text(300, limit * 1.12, f"limit {limit:g} s", color="grey", fontsize=8)
    ax.scatter([1024], [10], marker="_", s=300, color="black", label="target: 1024 nodes in 10 s")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(top=limit * 2.5)
    ax.set_xlabel("simulated nodes (threads in several processes, one TCPStore on loopback)")
    ax.set_ylabel("time to complete one round (s)")
    ax.set_title(f"One rendezvous round: time vs nodes ({os.cpu_count()} cores)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,256,1024", help="comma-separated node counts")
    parser.add_argument("--impl", default="ours,torch", help="ours, torch, or both (comma-separated)")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds before 'did not finish'")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--plot", type=Path, default=PLOT)
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--procs",
        type=int,
        default=0,
        help=f"processes that simulate the nodes (default: 4, or one per {THREADS_PER_PROCESS} nodes)",
    )
    parser.add_argument("--child", nargs=2, metavar=("IMPL", "N"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--nodes-child", nargs=5, metavar=("IMPL", "N", "PORT", "FIRST", "COUNT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.nodes_child:
        impl, n, port, first, count = args.nodes_child
        _node_process(impl, int(n), int(port), int(first), int(count), args.limit)
        return 0
    if args.child:
        _child(args.child[0], int(args.child[1]), args.limit, args.procs)
        return 0
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    impls = [i.strip() for i in args.impl.split(",") if i.strip()]
    for impl in impls:
        if impl not in IMPLS:
            parser.error(f"unknown --impl {impl!r}: choose from {', '.join(IMPLS)}")
    results: list[dict[str, Any]] = []
    for impl in impls:
        gave_up = False
        for n in sizes:
            if gave_up:  # a larger N cannot finish where a smaller one did not
                results.append(
                    {
                        "impl": impl,
                        "nodes": n,
                        "status": "did not finish",
                        "limit_s": args.limit,
                        "note": "not run: a smaller N did not finish",
                    }
                )
                continue
            procs = args.procs or max(4, -(-n // THREADS_PER_PROCESS))
            result = measure(impl, n, args.limit, procs)
            results.append(result)
            print(f"{impl:>5} N={n:<5} {result['status']:<15} {result.get('round_s')}", flush=True)
            gave_up = result["status"] == "did not finish"
    print()
    print_table(results, sizes, impls)
    ours = sorted((r for r in results if r["impl"] == "ours" and r["status"] == "ok"), key=lambda r: r["nodes"])
    growth = None
    if len(ours) >= 2:
        first, last = ours[0], ours[-1]
        growth = (last["round_s"] / first["round_s"]) / (last["nodes"] / first["nodes"])
        ratio = last["round_s"] / first["round_s"]
        print(f"\nours: time grew {ratio:.1f}x for {last['nodes'] / first['nodes']:.0f}x nodes")
    report = {
        "benchmark": "one rendezvous round, N simulated nodes (threads), one TCPStore on loopback",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "limit_s": args.limit,
        "results": results,
        "ours_growth_vs_linear": growth,
    }
    try:
        import torch

        report["machine"]["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        pass
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    if not args.no_plot:
        plot(results, args.limit, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
