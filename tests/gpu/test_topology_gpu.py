"""``--topology nvml`` against the real driver: nvmlDeviceGetGpuFabricInfo through launcher's binding.

Where the GPUs belong to a multi-node NVLink fabric (GB200 NVL72), the node gets a path and a
replay of the recorded answers gives the same; elsewhere (an HGX H100 board, a PCIe card) the
call answers "not supported" or the GPU is not registered, and the source says so in one line.
Either way the agent creates no CUDA context.
"""

from __future__ import annotations

import pytest
from launcher.health.nvml import CtypesNvml, RecordedNvml, record_nvml
from launcher.topology.api import NodeLocation, NoLocation, TopologyQuery
from launcher.topology.sources import nvml_location

pytestmark = pytest.mark.gpu


def test_the_real_fabric_info_places_the_node_or_says_why():
    capture = record_nvml(CtypesNvml())
    fabric = [device.get("fabric_info") for device in capture["devices"]]
    assert fabric and all(answer is not None for answer in fabric), capture
    query = TopologyQuery(address="lane")
    try:
        real = nvml_location(query)
    except NoLocation as exc:
        assert "\n" not in str(exc) and str(exc).startswith("lane: "), exc
        with pytest.raises(NoLocation):
            nvml_location(query, load=lambda: RecordedNvml(capture))
        return
    assert isinstance(real, NodeLocation) and real.path[0].startswith("nvl-"), real
    assert nvml_location(query, load=lambda: RecordedNvml(capture)) == real
