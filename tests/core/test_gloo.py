"""Real torch.distributed (gloo) collectives across workers started by launcher."""

from __future__ import annotations

from tests.conftest import run_launcher

ALL_REDUCE = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
expected = sum(range(1, dist.get_world_size() + 1))
assert value.item() == expected, (value.item(), expected)
print(f"rank {dist.get_rank()} all_reduce ok {value.item():.0f}")
dist.barrier()
dist.destroy_process_group()
"""

#: Rank 1 of the first attempt leaves once the group is made: every rank has registered its
#: address in the store by then (gloo connects every pair of ranks while it makes the group).
FAIL_AFTER_JOINING = """import os, sys
if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' and os.environ['RANK'] == '1':
    sys.exit(7)
"""


def test_gloo_all_reduce_four_ranks(write_script):
    result = run_launcher(["--standalone", "--nproc-per-node", "4", write_script("ar.py", ALL_REDUCE)], timeout=180)
    assert result.returncode == 0, result.stderr
    for rank in range(4):
        assert f"[default{rank}]:rank {rank} all_reduce ok 10" in result.stdout


def test_gloo_all_reduce_after_restart(write_script):
    """The second attempt's workers rendezvous on a fresh key prefix of the same agent store."""
    script = write_script(
        "ar_restart.py",
        ALL_REDUCE.replace("value = ", FAIL_AFTER_JOINING + "value = "),
    )
    result = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", script], timeout=180)
    assert result.returncode == 0, result.stderr
    assert "restarting" in result.stderr
    assert "rank 1 all_reduce ok 3" in result.stdout


def test_gloo_after_restart_with_static_backend(write_script):
    """The static backend's store outlives attempts: it must be cleared between them."""
    import socket

    script = write_script(
        "ar_static.py",
        ALL_REDUCE.replace("value = ", FAIL_AFTER_JOINING + "value = "),
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_launcher(["--nproc-per-node", "2", "--master-port", str(port), "--max-restarts", "1", script],
                          timeout=180)
    assert result.returncode == 0, result.stderr
    assert "rank 1 all_reduce ok 3" in result.stdout
