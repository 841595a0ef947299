"""Real workers: ``init_process_group("gloo", init_method="env://")`` over our server, as the
agent runs it (``TORCHELASTIC_USE_AGENT_STORE=True``: every rank is a client)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from launcher.store.server import StoreServer

from .conftest import has_ipv6_loopback

pytestmark = pytest.mark.timeout(120)

WORKER = textwrap.dedent(
    """
    import datetime, os
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    assert t.item() == expected, (t.item(), expected)
    dist.barrier()
    print(f"rank {rank} ok {t.item()}", flush=True)
    dist.destroy_process_group()
    """
)


def _run_workers(server: StoreServer, master_addr: str, tmp_path: Path, world_size: int = 4) -> None:
    pytest.importorskip("torch.distributed")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "PET_"))}
    base.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(server.port),
        WORLD_SIZE=str(world_size),
        TORCHELASTIC_USE_AGENT_STORE="True",
        OMP_NUM_THREADS="1",
    )
    if Path("/sys/class/net/lo").exists():
        base["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo on loopback whatever the host's NICs
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world_size)
    ]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=90)
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{out}"
        assert f"rank {rank} ok {world_size * (world_size + 1) / 2}" in out
    # Every rank registered through torch's "init/" counter on our store.
    assert server.store.num_keys() > 0


def test_gloo_all_reduce_over_our_store(tmp_path: Path) -> None:
    with StoreServer("127.0.0.1", 0) as server:
        _run_workers(server, "127.0.0.1", tmp_path)


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_gloo_init_over_ipv6_store(tmp_path: Path) -> None:
    # Only the store rendezvous is over IPv6 here; gloo's own pairs use the loopback interface.
    with StoreServer("::1", 0) as server:
        _run_workers(server, "::1", tmp_path, world_size=2)
