"""The built-in sources' parsers: the site file, Slurm's topology variables, NVML's fabric info (recorded)."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher.errors import UsageError
from launcher.health.nvml import RecordedNvml, record_nvml
from launcher.topology.api import NodeLocation, NoLocation, TopologyQuery
from launcher.topology.sources import file_location, nvml_location, parse_site_file, slurm_location

from . import nvml_fabric

SITE = """\
# rack row 3
10.0.3.7   spine0.leaf12   # gpu17
10.0.3.8   spine0.leaf2

gpu19.example.com spine1.leaf7
"""


def test_site_file_lines_comments_and_blank_lines() -> None:
    hosts = parse_site_file(SITE, "site.txt")
    assert hosts == {
        "10.0.3.7": NodeLocation(("spine0", "leaf12"), order=2),
        "10.0.3.8": NodeLocation(("spine0", "leaf2"), order=3),
        "gpu19.example.com": NodeLocation(("spine1", "leaf7"), order=5),
    }


@pytest.mark.parametrize(("text", "line", "says"), [
    ("10.0.0.1 spine0.leaf1\n10.0.0.2\n", 2, "is not 'ADDRESS_OR_HOSTNAME SWITCH.PATH'"),
    ("10.0.0.1 spine0 leaf1\n", 1, "is not 'ADDRESS_OR_HOSTNAME SWITCH.PATH'"),
    ("10.0.0.1 spine0..leaf1\n", 1, "empty switch name"),
    ("10.0.0.1 leaf1\n# again\n10.0.0.1 leaf2\n", 3, "listed again (first on line 1)"),
])
def test_malformed_site_file_is_one_line_naming_file_and_line(text: str, line: int, says: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_site_file(text, "/etc/site.txt")
    message = str(caught.value)
    assert "\n" not in message
    assert f"file:/etc/site.txt, line {line}:" in message and says in message, message


def test_file_source_matches_address_then_host_names(tmp_path: Path) -> None:
    site = tmp_path / "site.txt"
    site.write_text(SITE)
    by_address = TopologyQuery(argument=str(site), address="10.0.3.8", hostnames=("gpu18",))
    assert file_location(by_address).path == ("spine0", "leaf2")
    by_name = TopologyQuery(argument=str(site), address="192.168.1.1", hostnames=("gpu19", "GPU19.example.com"))
    assert file_location(by_name).path == ("spine1", "leaf7")
    missing = TopologyQuery(argument=str(site), address="10.9.9.9", hostnames=("gpu99",))
    with pytest.raises(NoLocation, match=r"10\.9\.9\.9 \(host gpu99\) has no line in .*site\.txt"):
        file_location(missing)


def test_unreadable_site_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"file:.*nosuch\.txt cannot be read \(No such file or directory\)"):
        file_location(TopologyQuery(argument=str(tmp_path / "nosuch.txt"), address="10.0.0.1"))


def _slurm(addr: str, pattern: str) -> TopologyQuery:
    return TopologyQuery(environ={"SLURM_TOPOLOGY_ADDR": addr, "SLURM_TOPOLOGY_ADDR_PATTERN": pattern},
                         hostnames=("gpu017",))


def test_slurm_tree_and_block_patterns() -> None:
    assert slurm_location(_slurm("core0.s12.gpu017", "switch.switch.node")) == NodeLocation(("core0", "s12"), 17)
    assert slurm_location(_slurm("b3.nid00042", "block.node")) == NodeLocation(("b3",), 42)
    assert slurm_location(_slurm("s1.login", "switch.node")) == NodeLocation(("s1",), None)


@pytest.mark.parametrize(("addr", "pattern", "says"), [
    ("gpu017", "node", "names no switch"),
    ("s0.gpu017", "switch.switch.node", "does not match"),
    ("", "", "SLURM_TOPOLOGY_ADDR is not set"),
])
def test_slurm_without_switches_says_why(addr: str, pattern: str, says: str) -> None:
    with pytest.raises(NoLocation, match=says):
        slurm_location(_slurm(addr, pattern))


def _nvml(answers: dict) -> NodeLocation:
    return nvml_location(TopologyQuery(address="10.0.0.1"), load=lambda: RecordedNvml(answers))


def test_nvml_two_domains() -> None:
    a, b = _nvml(nvml_fabric.NODE_A), _nvml(nvml_fabric.NODE_B)
    assert a == NodeLocation((f"nvl-{nvml_fabric.DOMAIN_A}", "clique-1"))
    assert b.path[0] == f"nvl-{nvml_fabric.DOMAIN_B}" and a != b


@pytest.mark.parametrize(("answers", "says"), [
    (nvml_fabric.SPLIT, "different NVLink domains"),
    (nvml_fabric.NOT_SUPPORTED, "reports no NVLink fabric .*not supported"),
    (nvml_fabric.NOT_REGISTERED, "not registered with an NVLink fabric"),
    (nvml_fabric.NO_DRIVER, "NVML cannot start"),
])
def test_nvml_without_a_domain_says_why(answers: dict, says: str) -> None:
    with pytest.raises(NoLocation, match=says):
        _nvml(answers)


def test_nvml_calls_only_the_binding_and_shuts_down() -> None:
    recorded = RecordedNvml(nvml_fabric.NODE_A)
    nvml_location(TopologyQuery(), load=lambda: recorded)
    assert recorded.calls[0] == "init" and recorded.calls[-1] == "shutdown"
    assert set(recorded.calls) == {"init", "device_count", "handle", "fabric_info", "shutdown"}


def test_record_nvml_keeps_fabric_info() -> None:
    record = record_nvml(RecordedNvml(nvml_fabric.NODE_A))
    assert [list(d["fabric_info"][1]) for d in record["devices"]][0] == [nvml_fabric.DOMAIN_A, 1, 3, 0]
    assert _nvml(record) == _nvml(nvml_fabric.NODE_A)
