"""What the agent's status publisher and ``launcher status`` agree on (names, keys, intervals),
and the ``--metrics-port`` flag: declared, parsed and checked here (``settings["metrics"]``)."""

# No "from __future__ import annotations": typing.NamedTuple would compile every field's
# annotation string at import, which every launch pays.

from typing import Any, NamedTuple

from launcher.flags import Flag, FlagGroup, FlagValues
from launcher.values import parse_int

#: The version of the status documents (the node file, the store record and ``--json``).
SCHEMA_VERSION = 1
#: The agent's status, in its run log directory (replaced atomically at each publish).
STATUS_FILE = "status.json"
#: Seconds between two publishes. Each costs a few /proc reads per rank, one small file write and,
#: on a multi-node job, one store write per node: a store of a thousand nodes sees 500 small
#: writes a second, which it serves in well under a millisecond each.
PUBLISH_INTERVAL = 2.0
#: How long ``launcher status`` samples /proc for CPU % (like ``top``'s first screen).
CPU_SAMPLE_S = 0.25


#: The key of a node's record in the rendezvous store, below its round's agent keys
#: (``launcher/rdzv/<run id>/<round>/agent/``: :meth:`RendezvousKeys.agent`).
RENDEZVOUS_STATUS_KEY = "status/{group_rank}"


def store_key(run_id: str, group_rank: int) -> str:
    """The key under which the node of ``group_rank`` publishes its status in the workers' store."""
    return f"launcher/status/{run_id}/node/{group_rank}"


class MetricsSettings(NamedTuple):
    """``--metrics-port``: the port to serve Prometheus metrics on (0: any free one), ``None``: off."""

    port: "int | None" = None


def parse_metrics_port(value: Any, name: str = "--metrics-port") -> "int | None":
    """A port (0: any free one), or ``None`` when unset or empty (no metrics)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return parse_int(value, name, 0, 65535)


def metrics_settings(port: Any = None, name: str = "--metrics-port") -> MetricsSettings:
    """The settings for ``port``, checked: a number from 0 to 65535 that can be listened on now
    (a port in use is one line, exit status 2, before anything starts). The Python API's way:
    ``LaunchConfig(settings={"metrics": metrics_settings(9400)})``."""
    number = parse_metrics_port(port, name)
    if number:
        from launcher.status.metrics import check_port  # sockets: only when the flag is given

        check_port(number, name)
    return MetricsSettings(number)


def read_metrics(values: FlagValues) -> MetricsSettings:
    """``--metrics-port``, checked."""
    return metrics_settings(values["metrics_port"], values.source("metrics_port"))


FLAGS: FlagGroup[MetricsSettings] = FlagGroup(
    name="metrics",
    title="metrics and status",
    read=read_metrics,
    flags=(
        Flag("--metrics-port", default=None,
             help="Serve this node's state in Prometheus's text format on http://HOST:PORT/metrics, labels job, "
             "node and rank; 0 picks a free port and logs it (default: off)."),
    ),
)
