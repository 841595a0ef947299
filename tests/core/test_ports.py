"""Concurrent standalone jobs never collide, and the agent's store listens on loopback only."""

from __future__ import annotations

import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

from tests.conftest import LAUNCHER, launcher_env

STORE_CHECK = """
import os, socket, sys, time
from launcher.store.client import TCPStoreClient

port = int(os.environ["MASTER_PORT"])
client = TCPStoreClient(os.environ["MASTER_ADDR"], port, timeout=30)
# Every worker of this job adds 1 under the job's run id: the total proves the store is ours alone.
key = "count/" + os.environ["TORCHELASTIC_RUN_ID"]
client.add(key, 1)
live_from = time.monotonic()  # the store answered: it listens from before here (one clock for all jobs)
client.wait(["done/" + os.environ["TORCHELASTIC_RUN_ID"]] if os.environ["RANK"] != "0" else [], timeout=30)
if os.environ["RANK"] == "0":
    import time
    while client.add(key, 0) < int(os.environ["WORLD_SIZE"]):
        time.sleep(0.01)
    assert client.num_keys() >= 1
    client.set("done/" + os.environ["TORCHELASTIC_RUN_ID"], b"1")
count = client.add(key, 0)
print("port", port, "count", count, "live", live_from, time.monotonic())
# Reachable only through loopback: connecting through another local address must fail.
others = [a for a in sys.argv[1:] if not a.startswith("127.")]
for address in others:
    with socket.socket() as probe:
        probe.settimeout(2)
        assert probe.connect_ex((address, port)) != 0, f"store reachable on {address}"
"""


def _non_loopback_addresses() -> list[str]:
    addresses = set()
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            addresses.add(str(info[4][0]))
    except OSError:
        pass
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            addresses.add(parts[parts.index("inet") + 1].split("/")[0])
    return sorted(a for a in addresses if not a.startswith("127."))


def test_twenty_concurrent_standalone_jobs(write_script):
    script = write_script("store_check.py", STORE_CHECK)
    addresses = _non_loopback_addresses()

    def one_job(_: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*LAUNCHER, "--standalone", "--nproc-per-node", "2", script, *addresses],
                              env=launcher_env(), capture_output=True, text=True, timeout=240)

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(one_job, range(20)))
    failures = [r.stderr for r in results if r.returncode != 0]
    assert not failures, failures[0]
    stores = []
    for result in results:
        lines = [line.split() for line in result.stdout.splitlines() if "port" in line]
        assert len(lines) == 2, result.stdout
        assert all(words[3] == "2" for words in lines), result.stdout
        port = lines[0][1]
        stores.append((port, min(float(w[5]) for w in lines), max(float(w[6]) for w in lines)))
    # Two stores on one port at the same time would be one store shared by two jobs. The same
    # port at different times is no collision: under load one job can end before another starts,
    # and the kernel may hand its port out again.
    for i, (port, start, end) in enumerate(stores):
        for other, other_start, other_end in stores[i + 1:]:
            assert port != other or end < other_start or other_end < start, stores
