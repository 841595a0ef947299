"""What the agent's status publisher and ``launcher status`` agree on: names, keys, intervals."""

from __future__ import annotations

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


def store_key(run_id: str, group_rank: int) -> str:
    """The key under which the node of ``group_rank`` publishes its status in the workers' store."""
    return f"launcher/status/{run_id}/node/{group_rank}"
