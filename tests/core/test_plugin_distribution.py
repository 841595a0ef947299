"""A plugin distribution built and pip-installed inside the test, used by the real command."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import run_launcher


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    source = tmp_path_factory.mktemp("src")
    (source / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "launcher-tripledev"
        version = "0.4.2"

        [project.entry-points.launcher]
        tripledev = "launcher_tripledev"
    """))
    (source / "launcher_tripledev.py").write_text(textwrap.dedent('''
        """A device-count provider for a fictional accelerator with three devices."""
        from launcher.plugins import hookimpl
        from launcher.plugins.types import DeviceProvider

        @hookimpl
        def launcher_device_providers():
            yield DeviceProvider(
                name="tripledev",
                description="three fictional devices",
                count_devices=lambda: 3,
                visible_devices_env="TRIPLE_VISIBLE_DEVICES",
            )
    '''))
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(source)],
        check=True, timeout=300, capture_output=True,
    )
    return str(target)


def test_installed_plugin_provides_nproc_per_node(installed_plugin, write_script, tmp_path):
    out = tmp_path / "ranks"
    out.mkdir()
    script = write_script("r.py", f"import os; open(os.path.join({str(out)!r}, os.environ['RANK']), 'w').close()\n")
    result = run_launcher(["--standalone", "--nproc-per-node", "tripledev", script],
                          env={"PYTHONPATH": installed_plugin})
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out)) == ["0", "1", "2"]


def test_installed_plugin_is_listed(installed_plugin):
    import json

    result = run_launcher(["plugins", "--json"], env={"PYTHONPATH": installed_plugin})
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    row = next(r for r in rows if r["name"] == "tripledev")
    assert (row["kind"], row["distribution"], row["version"], row["loaded"]) == (
        "device provider", "launcher-tripledev", "0.4.2", True)
    table = run_launcher(["plugins"], env={"PYTHONPATH": installed_plugin}).stdout
    assert "tripledev" in table and "launcher-tripledev 0.4.2" in table


def test_virtual_local_rank_uses_the_providers_variable(installed_plugin, write_script, tmp_path):
    out = tmp_path / "vis"
    out.mkdir()
    script = write_script(
        "v.py",
        f"import os; open(os.path.join({str(out)!r}, os.environ['RANK']), 'w')"
        ".write(os.environ['LOCAL_RANK'] + ' ' + os.environ['TRIPLE_VISIBLE_DEVICES'])\n",
    )
    result = run_launcher(["--standalone", "--nproc-per-node", "tripledev", "--virtual-local-rank", script],
                          env={"PYTHONPATH": installed_plugin})
    assert result.returncode == 0, result.stderr
    assert {p: (out / p).read_text() for p in os.listdir(out)} == {"0": "0 0", "1": "0 1", "2": "0 2"}


def test_disabling_autoload_hides_it(installed_plugin, write_script):
    script = write_script("n.py", "pass\n")
    result = run_launcher(["--standalone", "--nproc-per-node", "tripledev", script],
                          env={"PYTHONPATH": installed_plugin, "LAUNCHER_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert result.returncode == 2
    assert "tripledev" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert os.path.isdir(installed_plugin)
