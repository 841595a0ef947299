"""The distribution, pip-installed into a directory, is found through its entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from webhook_servers import PLUGIN_ROOT, Behaviour, EventServer

CHECK = textwrap.dedent(
    """
    import json, sys
    from launcher.events import SinkContext, create_event_bus
    from launcher.plugins.manager import get_plugin_manager
    from launcher.plugins.types import EventHandler

    manager = get_plugin_manager()
    provided = manager.lookup(EventHandler, "webhook")
    bus = create_event_bus(["webhook"], manager, SinkContext(run_id="installed", node="n1", role="r"))
    bus.emit("job_succeeded", restart_count=0)
    finished = bus.close(timeout=10)
    import launcher_webhook
    print(json.dumps({
        "distribution": provided.plugin.distribution,
        "version": provided.plugin.version,
        "module": launcher_webhook.__file__,
        "finished": finished,
    }))
    """
)


@pytest.mark.slow
def test_pip_install_target_and_entry_point(
    tmp_path: Path, event_server: Callable[[Behaviour], EventServer]
) -> None:
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the shared checkout.
    source = tmp_path / "src"
    shutil.copytree(
        PLUGIN_ROOT, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__")
    )
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--no-deps", "--no-build-isolation", "--no-index", "--target", str(target), str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert list(target.glob("launcher_webhook-*.dist-info"))

    server = event_server(lambda n: (200, 0.0))
    env = {key: value for key, value in os.environ.items() if not key.lower().endswith("_proxy")}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")])),
        LAUNCHER_WEBHOOK_URL=server.url,
        no_proxy="127.0.0.1",
    )
    result = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["distribution"] == "launcher-webhook" and found["version"] == "0.1.0"
    assert found["module"].startswith(str(target))  # the installed copy, not the source tree
    assert found["finished"] is True
    assert [(e["type"], e["run_id"]) for e in server.delivered()] == [("job_succeeded", "installed")]

    # Without the directory on the path the name is unknown, with a hint to install it.
    env["PYTHONPATH"] = ""
    missing = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert missing.returncode != 0
    assert "pip install ./plugins/launcher-webhook" in missing.stderr
