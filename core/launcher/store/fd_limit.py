"""The store host's open-files limit: raised to what its clients need, or said to be too low.

Every client of the store holds one descriptor on the host. A default soft limit of 1,024 would
end a rendezvous of 2,000 nodes with EMFILE at about node 1,020, long after the job started:
the host raises its soft limit (up to the hard one) when it starts serving, and when even the
hard limit cannot hold the clients expected it says so in one line then.
"""

from __future__ import annotations

import contextlib
from typing import Final

__all__ = ["FDS_RESERVED", "raise_open_files"]

#: Descriptors the serving process needs besides one per client: the listener, the wake-up pair,
#: the agent's own files, logs and pipes, a few readers (``launcher status``).
FDS_RESERVED: Final = 64
#: The soft limit asked for at least, whatever the clients expected (as before: cheap, and a
#: store serves more than the rendezvous's agents, e.g. readers).
_FLOOR: Final = 1 << 16


def raise_open_files(clients: int | None = None) -> str | None:
    """Lift this process's soft RLIMIT_NOFILE to what ``clients`` connections need (and at
    least 65,536), never above the hard limit; one line saying what is wrong when the hard
    limit is below what ``clients`` need, else ``None``."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return None
    need = (clients or 0) + FDS_RESERVED
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):  # pragma: no cover - best effort
        return None
    unlimited = resource.RLIM_INFINITY
    target = max(need, _FLOOR) if hard == unlimited else min(hard, max(need, _FLOOR))
    if soft != unlimited and soft < target:
        with contextlib.suppress(OSError, ValueError):  # checked below through what the limit is now
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if clients and soft != unlimited and soft < need:
        fits = max(0, soft - FDS_RESERVED)
        return (
            f"the store host may open only {soft} files (hard limit {'unlimited' if hard == unlimited else hard}, "
            f"ulimit -Hn) but {clients} nodes need about {need}: nodes beyond about {fits} will be refused; "
            "raise the hard limit (ulimit -Hn, LimitNOFILE= for a systemd unit, nofile in "
            "/etc/security/limits.conf) on the node that serves the store"
        )
    return None
