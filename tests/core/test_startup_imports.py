"""The CLI, --help and plugin listing never import torch or a plugin's heavy dependency."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import launcher_env

HEAVY = ("torch", "pynvml", "etcd3gw", "numpy")


def _imported_modules(args: list[str]) -> set[str]:
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "launcher", *args],
                            env=launcher_env(), capture_output=True, text=True, timeout=60)
    modules = set()
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            modules.add(line.rsplit("|", 1)[1].strip())
    return modules


@pytest.mark.parametrize("args", [["--help"], ["plugins"], ["plugins", "--json"], ["--nnodes", "0", "x.py"]])
def test_no_heavy_imports(args):
    modules = _imported_modules(args)
    assert "launcher" in modules
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, heavy


def test_standalone_launch_does_not_import_torch_in_the_agent(write_script):
    script = write_script("noop.py", "pass\n")
    modules = _imported_modules(["--standalone", "--nproc-per-node", "2", script])
    assert "launcher.agent.agent" in modules
    assert not [m for m in modules if m.split(".")[0] == "torch"]
