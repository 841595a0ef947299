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


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["plugins"], ["plugins", "--json"],
                                  ["--nnodes", "0", "x.py"]])
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


#: Modules a plain launch needs only once its workers run, or never: loading them before the
#: first worker starts costs every launch time (see benchmarks/bench_floor.py).
OFF_THE_START_PATH = (
    "json", "glob", "encodings.idna", "launcher.plugins.listing", "launcher.clusters.api",
    "launcher.agent.barrier", "launcher.agent.membership", "launcher.failures.report",
    "launcher.failures.oom", "launcher.hangs.monitor", "torch",
    # tempfile imports shutil, and shutil bz2, lzma and fnmatch (launcher.private_dirs; the
    # options' help formatter); the preloading machinery is for --preload only.
    "tempfile", "shutil", "bz2", "lzma", "launcher.preload.preload",
    # Parsed only once a peer connects to the store or join ranges are configured.
    "ipaddress",
    # The gpu check loads NVML (and ctypes) only on a node with an NVIDIA driver; the python
    # check starts no interpreter when the workers' is the agent's own (docs/health.md).
    "ctypes", "launcher.health.nvml",
    # Installed plugins declare their names cheaply: etcd's --rdzv-conf table loads when the
    # backend is chosen, nodecheck's checks when a site configures them, the webhook flags'
    # reader when one of them is used.
    "launcher_etcd.settings", "launcher_nodecheck.checks", "launcher_webhook.settings",
    # The Python API's input: the command line builds its plan from the flag groups' settings.
    "launcher.config",
    # --topology's reader, sources and order: only a launch that gives the flag loads them.
    "launcher.topology.locate", "launcher.topology.sources", "launcher.topology.order", "launcher.topology.api",
    "launcher.topology.segments",
)

#: Plugin distributions installed for the plain launch below (their source directories and an
#: entry point each, as pip would leave them): a plain launch loads their plugin modules only.
PLUGINS = {"launcher-etcd": ("launcher_etcd", "etcd"), "launcher-nodecheck": ("launcher_nodecheck", "nodecheck"),
           "launcher-webhook": ("launcher_webhook", "webhook")}


def _with_plugins(site) -> dict[str, str]:
    """``launcher_env()`` with :data:`PLUGINS` installed: a ``.dist-info`` each in ``site``, their
    packages from this checkout."""
    from pathlib import Path

    plugins = Path(__file__).resolve().parents[2] / "plugins"
    paths = [str(site)]
    for distribution, (package, name) in PLUGINS.items():
        info = site / f"{distribution.replace('-', '_')}-0.1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1.0\n\n")
        (info / "entry_points.txt").write_text(f"[launcher]\n{name} = {package}.plugin\n")
        paths.append(str(plugins / distribution))
    return launcher_env({"PYTHONPATH": ":".join(paths)})

_MODULES_AT_FIRST_START = """
import json, sys
script, out = sys.argv[1], sys.argv[2]
seen = []
def hook(event, args):
    if event == "subprocess.Popen" and script in args[1] and not seen:
        seen.append(sorted(sys.modules))
sys.addaudithook(hook)
base = set(sys.modules)
from launcher.cli import main
try:
    main(["--standalone", "--nproc-per-node", "2", script])
finally:
    with open(out, "w") as handle:
        json.dump(sorted(set(seen[0]) - base) if seen else None, handle)
"""


def test_modules_loaded_before_the_first_worker_starts(write_script, tmp_path):
    import json

    script = write_script("noop.py", "pass\n")
    out = tmp_path / "modules.json"
    result = subprocess.run([sys.executable, "-c", _MODULES_AT_FIRST_START, script, str(out)],
                            env=_with_plugins(tmp_path / "site"), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    modules = json.loads(out.read_text())
    assert modules is not None, "no worker was started"
    assert "launcher.agent.group" in modules
    assert {f"{package}.plugin" for package, _ in PLUGINS.values()} <= set(modules), "the plugins were not loaded"
    early = [name for name in OFF_THE_START_PATH if name in modules]
    assert not early, f"loaded before the first worker starts: {early}"
