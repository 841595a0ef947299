"""Helpers for the launcher-torchx tests: worker scripts, clean environments, running TorchX's CLI.

This directory is deliberately not a package (the repository's top-level ``tests`` package would
clash with it); test files and this module have names no other test directory uses. Importing this
module puts the plugin's source on ``sys.path``, so the unit tests run against it without an
install; the TorchX runs use a real install (see ``conftest.py``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PLUGIN_ROOT = Path(__file__).resolve().parents[1]
if str(PLUGIN_ROOT) not in sys.path:
    sys.path.insert(0, str(PLUGIN_ROOT))

#: Each worker joins a gloo group, all-reduces (rank + 1), checks the sum and prints one RESULT line.
ALLREDUCE_SCRIPT = textwrap.dedent(
    """
    import json, os
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    assert value.item() == world * (world + 1) / 2, value
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        agent = [a.decode() for a in f.read().split(b"\\0") if a]
    print("RESULT " + json.dumps({
        "rank": rank,
        "world": world,
        "sum": value.item(),
        "env_rank": int(os.environ["RANK"]),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "master_addr": os.environ["MASTER_ADDR"],
        "master_port": int(os.environ["MASTER_PORT"]),
        "run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
        "role": os.environ.get("ROLE_NAME"),
        "agent": agent[:3],
    }), flush=True)
    dist.destroy_process_group()
    """
)

#: Rank 1 raises; rank 0 exits normally.
FAILING_SCRIPT = textwrap.dedent(
    """
    import os
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank one gives up: launcher-torchx failure test")
    """
)

_RESULT = re.compile(r"RESULT (\{.*\})")


def results(output: str) -> list[dict[str, Any]]:
    """The RESULT records in ``output``, whatever prefixes TorchX and the launcher put before them."""
    return [json.loads(match.group(1)) for match in _RESULT.finditer(output)]


def free_port() -> int:
    """A TCP port free on this host right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without launcher, torchrun or TorchX settings that would leak in."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_", "TORCHX_"))
        and key not in ("OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def python_shim(directory: Path) -> Path:
    """A ``bin`` directory whose ``python`` runs this interpreter (the components start ``python``)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "python"
    # A script, not a symlink: a symlinked venv interpreter would lose its venv.
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def run_torchx(
    args: Sequence[str],
    *,
    site: Path,
    bin_dir: Path,
    cwd: Path,
    timeout: float = 90,
) -> subprocess.CompletedProcess[str]:
    """``torchx ARGS`` (TorchX's CLI, this interpreter) with the installed plugin on the path."""
    env = clean_env(
        {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
            "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
