"""A plugin distribution built and pip-installed inside the test, used by the real command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import run_launcher


def install_distribution(
    tmp_path_factory: pytest.TempPathFactory, name: str, version: str, modules: dict[str, str],
    entry_points: dict[str, str],
) -> str:
    """Build a distribution from ``modules`` (``{module: source}``) declaring ``entry_points`` in the
    ``launcher`` group, pip-install it into a directory of its own, and return that directory."""
    source = tmp_path_factory.mktemp("src")
    declared = "\n".join(f"{key} = {json.dumps(value)}" for key, value in entry_points.items())
    (source / "pyproject.toml").write_text(
        textwrap.dedent(f"""
            [build-system]
            requires = ["setuptools>=64"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{name}"
            version = "{version}"

            [tool.setuptools]
            py-modules = {json.dumps(sorted(modules))}

            [project.entry-points.launcher]
        """) + declared + "\n"
    )
    for module, code in modules.items():
        (source / f"{module}.py").write_text(textwrap.dedent(code))
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(source)],
        check=True, timeout=300, capture_output=True,
    )
    return str(target)


TRIPLEDEV = '''
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
'''


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    return install_distribution(tmp_path_factory, "launcher-tripledev", "0.4.2",
                                {"launcher_tripledev": TRIPLEDEV}, {"tripledev": "launcher_tripledev"})


def test_installed_plugin_provides_nproc_per_node(installed_plugin, write_script, tmp_path):
    out = tmp_path / "ranks"
    out.mkdir()
    script = write_script("r.py", f"import os; open(os.path.join({str(out)!r}, os.environ['RANK']), 'w').close()\n")
    result = run_launcher(["--standalone", "--nproc-per-node", "tripledev", script],
                          env={"PYTHONPATH": installed_plugin})
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out)) == ["0", "1", "2"]


def test_installed_plugin_is_listed(installed_plugin):
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


MISSPELLED = """
    from launcher.plugins import hookimpl
    from launcher.plugins.types import RendezvousBackend

    @hookimpl
    def launcher_rendezvous_backend():  # the hook is launcher_rendezvous_backends
        yield RendezvousBackend(name="typo", create_handler=lambda params: None)
"""


@pytest.fixture(scope="module")
def misspelled_plugin(tmp_path_factory):
    return install_distribution(tmp_path_factory, "my-dist", "1.0", {"my_typo_plugin": MISSPELLED},
                                {"my-plugin": "my_typo_plugin"})


def test_a_misspelled_hook_stops_every_command_before_anything_starts(misspelled_plugin, write_script, tmp_path):
    started = tmp_path / "started"
    script = write_script("x.py", f"open({str(started)!r}, 'w').close()\n")
    expected = [
        "launcher: error: plugin 'my-plugin' (my-dist 1.0) implements unknown hook "
        "'launcher_rendezvous_backend': did you mean launcher_rendezvous_backends?"
    ]
    for args in (["plugins"], ["plugins", "--json"], ["--standalone", "--nproc-per-node", "1", script]):
        result = run_launcher(args, env={"PYTHONPATH": misspelled_plugin})
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.strip().splitlines() == expected, args
        assert result.stdout == ""
    assert not started.exists()


HIDE_STATIC = """
    # Wraps the core's rendezvous hook: no 'static', and c10d described by the site.
    import dataclasses

    from launcher.plugins import hookimpl

    @hookimpl(wrapper=True)
    def launcher_rendezvous_backends():
        results = yield
        return [
            [
                dataclasses.replace(reg, description="c10d, as this site runs it") if reg.name == "c10d" else reg
                for reg in registrations
                if reg.name != "static"
            ]
            for registrations in results
        ]
"""


def test_a_hook_wrapper_from_a_distribution_is_honoured(tmp_path_factory, write_script):
    site = install_distribution(tmp_path_factory, "site-policy", "2.1", {"site_policy": HIDE_STATIC},
                                {"site-policy": "site_policy"})
    listed = run_launcher(["plugins", "--json"], env={"PYTHONPATH": site})
    assert listed.returncode == 0, listed.stderr
    backends = {row["name"]: row for row in json.loads(listed.stdout) if row["kind"] == "rendezvous backend"}
    assert set(backends) == {"c10d"}
    assert backends["c10d"]["description"] == "c10d, as this site runs it"
    assert (backends["c10d"]["distribution"], backends["c10d"]["version"]) == ("site-policy", "2.1")

    script = write_script("n.py", "pass\n")
    launched = run_launcher(["--rdzv-backend", "static", "--master-port", "29999", script], env={"PYTHONPATH": site})
    assert launched.returncode == 2
    assert "unknown rendezvous backend 'static'" in launched.stderr
