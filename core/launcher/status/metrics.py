"""``--metrics-port``: this node's state in Prometheus's text format, on ``/metrics``.

Opt-in. The agent checks the port while it plans (a port in use is bad input: one line, exit
status 2, before any worker starts), and serves it from a daemon thread started with the status
publisher, once the first workers run: nothing of it is on the path to the first worker. Each
scrape renders the publisher's latest record (at most one interval old; heartbeat ages are
brought up to the scrape's time), so scraping costs the job nothing more than the publisher
already does, however often Prometheus comes. The standard library's ``http.server`` serves it:
``prometheus_client`` would add its import (tens of milliseconds) to an agent that needs four
metric families written as text.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from launcher.errors import UsageError

log = logging.getLogger("launcher.status")

#: Prometheus's text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def listen(port: int) -> socket.socket:
    """A listening socket on ``port`` on every address (IPv4 and, where the host has it, IPv6)."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


def check_port(port: int, name: str = "--metrics-port") -> None:
    """A :class:`UsageError` now if ``port`` cannot be listened on (in use, or privileged)."""
    if port == 0:
        return
    try:
        listen(port).close()
    except OSError as exc:
        reason = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be listened on ({exc.strerror or exc})"
        raise UsageError(f"{name} {port} {reason}: give a free port, or 0 for any free one") from None


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """Integers as integers (a byte count must not lose digits to an exponent), others in full."""
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


def render(doc: dict[str, Any] | None, hangs_seen: int, now: float | None = None) -> str:
    """The text exposition of one status record (see :mod:`launcher.status.publisher`)."""
    if doc is None:
        return ""
    now = time.time() if now is None else now
    age = max(0.0, now - float(doc["updated_at"]))
    node = f'job="{_label(doc["run_id"])}",node="{_label(doc["node"])}"'
    ranks = doc["ranks"]
    families: list[tuple[str, str, str, list[tuple[str, float]]]] = [
        ("launcher_workers_alive", "gauge", "Workers of this node that are running.",
         [(node, sum(r["state"] in ("running", "hung") for r in ranks))]),
        ("launcher_restarts_total", "counter", "Restarts of the worker group this node used after a failure.",
         [(node, doc["restarts_used"])]),
        ("launcher_recoveries_in_place_total", "counter",
         "Of those restarts, the ones that recovered in place (survivors kept).",
         [(node, doc.get("recoveries_in_place", 0))]),
        ("launcher_restarts_left", "gauge", "Restarts this node has left.", [(node, doc["restarts_left"])]),
        ("launcher_max_restarts", "gauge", "The restart budget (--max-restarts).", [(node, doc["max_restarts"])]),
        ("launcher_round", "gauge", "The rendezvous round the workers run in.", [(node, doc["round"])]),
        ("launcher_hangs_total", "counter", "Hangs this node's agent diagnosed.", [(node, hangs_seen)]),
    ]
    timeouts = doc.get("hang_timeouts")
    if timeouts:  # only phases with a value: a timeout not learned yet is no number
        families.append(("launcher_hang_timeout_seconds", "gauge",
                         "The hang timeout in force per phase (--hang-timeout; auto: as learned).",
                         [(f'{node},phase="{_label(phase)}"', seconds) for phase, seconds in timeouts.items()
                          if seconds is not None]))
    slow = set(doc.get("slow_ranks", ()))
    if doc.get("straggler_detection"):  # without detection "no straggler" would be a made-up 0
        families.append(("launcher_stragglers", "gauge", "Ranks of the job straggler detection names slow now.",
                         [(node, len(slow))]))
    if doc.get("spares_waiting") is not None:  # launcher's own dynamic rendezvous only: others cannot tell
        families.append(("launcher_spares_waiting", "gauge",
                         "Spare nodes waiting to take the place of the first node to leave, as this node last saw.",
                         [(node, doc["spares_waiting"])]))
    if doc.get("kept_out") is not None:  # where the rendezvous lends a store for the records
        families.append(("launcher_kept_out_node", "gauge",
                         "1 for each node a health check kept out of the job (as this node read the records).",
                         [(f'{node},kept_out="{_label(out["node"])}",check="{_label(out["check"])}"', 1)
                          for out in doc["kept_out"]]))
    per_rank: dict[str, tuple[str, str, Callable[[dict[str, Any]], float | None]]] = {
        "launcher_rank_up": ("gauge", "1 while the rank's worker runs.",
                             lambda r: float(r["state"] in ("running", "hung"))),
        "launcher_rank_hung": ("gauge", "1 while the rank is past its --hang-timeout.",
                               lambda r: float(r["state"] == "hung")),
        "launcher_rank_heartbeat_age_seconds": ("gauge", "Seconds since the rank's last launcher.heartbeat().",
                                                lambda r: None if r["heartbeat_age_s"] is None
                                                else r["heartbeat_age_s"] + age),
        "launcher_rank_no_heartbeat_yet_seconds": ("gauge", "Seconds since the rank started without any "
                                                   "launcher.heartbeat() (with --hang-timeout).",
                                                   lambda r: None if r.get("no_heartbeat_yet_s") is None
                                                   else r["no_heartbeat_yet_s"] + age),
        "launcher_rank_steps_per_second": ("gauge", "launcher.heartbeat(step) calls per second "
                                           "(with --straggler-detection), else optimizer steps per second "
                                           "(with --hang-timeout).", lambda r: r.get("steps_per_s")),
        "launcher_rank_slow": ("gauge", "1 while straggler detection names the rank slow.",
                               lambda r: float(r["rank"] in slow) if doc.get("straggler_detection") else None),
        "launcher_rank_output_lines_per_second": ("gauge", "Output lines per second.", lambda r: r["lines_per_s"]),
        "launcher_rank_cpu_percent": ("gauge", "CPU % of the rank's worker process.", lambda r: r["cpu_percent"]),
        "launcher_rank_resident_bytes": ("gauge", "Resident memory of the rank's worker process.",
                                         lambda r: r["rss_bytes"]),
        "launcher_rank_gpu_utilization_percent": ("gauge", "Utilisation of the rank's GPU (NVML, the device's).",
                                                  lambda r: r.get("gpu_util_percent")),
        "launcher_rank_gpu_memory_bytes": ("gauge", "GPU memory the rank's processes hold (NVML).",
                                           lambda r: r.get("gpu_memory_bytes")),
    }
    for name, (kind, help_text, read) in per_rank.items():
        samples = []
        for rank in ranks:
            value = read(rank)
            if value is not None:
                samples.append((f'{node},rank="{rank["rank"]}",local_rank="{rank["local_rank"]}"', value))
        families.append((name, kind, help_text, samples))
    lines = []
    for name, kind, help_text, family_samples in families:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{labels}}} {_number(value)}" for labels, value in family_samples]
    return "\n".join(lines) + "\n"


class MetricsServer:
    """Serves :func:`render` of ``latest()`` on ``/metrics`` from a daemon thread."""

    def __init__(self, port: int, latest: Callable[[], dict[str, Any] | None], hangs_seen: Callable[[], int]) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics is here")
                    return
                body = render(latest(), hangs_seen()).encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
                pass  # one line per scrape would flood the job's console

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def server_bind(self) -> None:  # the socket listen() made (dual-stack where it can)
                self.socket.close()
                self.socket = listen(port)
                self.server_address = self.socket.getsockname()[:2]

            def server_activate(self) -> None:
                pass  # listen() already listens

        self._server = Server(("", port), Handler)
        # serve_forever() notices shutdown() at its next poll: 0.1 s is what the job's end may wait.
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="launcher-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
