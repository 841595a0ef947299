"""--topology: its forms, the lookup of each source when the plan is built, and bad input on the command line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from launcher.errors import UsageError
from launcher.plugins.manager import get_plugin_manager
from launcher.topology.api import NodeLocation
from launcher.topology.locate import TopologySettings, locate_node, parse_topology

from tests.conftest import run_launcher


def test_forms() -> None:
    assert parse_topology(None) is None and parse_topology("  ") is None
    assert parse_topology("auto") == TopologySettings(auto=True)
    assert parse_topology("Slurm, file:/etc/x.txt") == TopologySettings((("slurm", None), ("file", "/etc/x.txt")))


@pytest.mark.parametrize(("value", "says"), [
    ("slurm,,nvml", "has an empty source"),
    ("auto,slurm", "auto picks the sources itself and goes alone"),
    ("file:", "has nothing after ':'"),
])
def test_bad_forms(value: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        parse_topology(value)


@pytest.fixture(scope="module")
def manager():
    return get_plugin_manager(environ={})


def test_sources_compose_outermost_first(manager, tmp_path: Path) -> None:
    site = tmp_path / "site.txt"
    site.write_text("10.0.0.5 spine1.leaf3\n")
    environ = {"SLURM_TOPOLOGY_ADDR": "pod2.gpu5", "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.node"}
    found = locate_node(parse_topology(f"slurm,file:{site}"), manager, "10.0.0.5", environ)
    assert found == NodeLocation(("pod2", "spine1", "leaf3"), order=1)


@pytest.mark.parametrize(("value", "says"), [
    ("nosuch", "unknown topology source 'nosuch'"),
    ("file", "--topology file needs an argument"),
    ("slurm:x", "--topology slurm takes no argument"),
    ("slurm", "--topology slurm has no path for this node: SLURM_TOPOLOGY_ADDR is not set"),
])
def test_named_sources_refuse_in_one_line(manager, value: str, says: str) -> None:
    with pytest.raises(UsageError) as caught:
        locate_node(parse_topology(value), manager, "10.0.0.5", {})
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_auto_without_any_source_warns_and_keeps_the_order(manager, caplog, monkeypatch) -> None:
    monkeypatch.setattr("launcher.health.nvml.CtypesNvml.__init__", _no_driver)  # the same on a GPU host
    with caplog.at_level(logging.WARNING, logger="launcher.topology"):
        assert locate_node(parse_topology("auto"), manager, "10.0.0.5", {}) is None
    [record] = caplog.records
    assert "no source places this node" in record.getMessage() and "keeping torchrun's order" in record.getMessage()


def test_auto_uses_what_the_environment_offers(manager, monkeypatch) -> None:
    monkeypatch.setattr("launcher.health.nvml.CtypesNvml.__init__", _no_driver)
    environ = {"SLURM_TOPOLOGY_ADDR": "s0.s3.gpu5", "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.node"}
    assert locate_node(parse_topology("auto"), manager, None, environ) == NodeLocation(("s0", "s3"), 5)


def _no_driver(self, path: str = "") -> None:
    from launcher.health.nvml import NvmlUnavailable

    raise NvmlUnavailable("no NVIDIA driver here (test)")


@pytest.mark.parametrize("case", ["unknown", "unreadable", "malformed", "no-line"])
def test_bad_input_exits_2_in_one_line_before_any_worker(case: str, tmp_path: Path) -> None:
    marker = tmp_path / "worker-ran"
    script = tmp_path / "job.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    site = tmp_path / "site.txt"
    site.write_text("10.0.0.1 spine0.leaf1\nbroken line here\n" if case == "malformed" else "10.0.0.1 spine0.leaf1\n")
    value = {"unknown": "nosuch", "unreadable": f"file:{tmp_path / 'missing.txt'}"}.get(case, f"file:{site}")
    result = run_launcher(["--standalone", "--local-addr", "127.0.0.1", "--topology", value, str(script)], timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    expected = {"unknown": "unknown topology source 'nosuch'", "unreadable": "cannot be read",
                "malformed": "line 2:", "no-line": "127.0.0.1 (host"}[case]
    assert expected in lines[0], lines[0]
    assert not marker.exists()


def test_the_variable_stands_for_the_flag(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("pass\n")
    result = run_launcher(["--standalone", "--local-addr", "127.0.0.1", str(script)],
                          env={"PET_TOPOLOGY": "slurm"}, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("launcher: error: PET_TOPOLOGY slurm has no path for this node"), result.stderr
