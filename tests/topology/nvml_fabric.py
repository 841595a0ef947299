"""Recorded NVML answers (RecordedNvml's form) for ``--topology nvml``: GB200-like nodes of two NVLink domains.

The two cluster UUIDs stand for two NVL72 racks; each node's four GPUs report the same domain,
as the fabric manager registers them (state 3: completed, status 0: success).
"""

from __future__ import annotations

from typing import Any

DOMAIN_A = "6a1c42d0-8f3b-4c6e-9d2a-0b7e5f1c3a90"
DOMAIN_B = "c3e9b1f4-27d5-4a8c-b160-9f2d4e7a5b13"
#: nvmlGpuFabricState_t NVML_GPU_FABRIC_STATE_COMPLETED, and an earlier state (IN_PROGRESS).
COMPLETED, IN_PROGRESS = 3, 2


def node(domain: str, clique: int = 1, gpus: int = 4, *, state: int = COMPLETED, status: int = 0) -> dict[str, Any]:
    """A node whose GPUs all report the NVLink domain ``domain``, clique ``clique``."""
    return {"init": 0, "devices": [{"uuid": [0, f"GPU-{domain[:8]}-{index}"],
                                    "fabric_info": [0, [domain, clique, state, status]]} for index in range(gpus)]}


NODE_A = node(DOMAIN_A)
NODE_B = node(DOMAIN_B)
#: GPUs of one node in two domains (a miscabled or half-registered tray).
SPLIT = {"init": 0, "devices": [node(DOMAIN_A)["devices"][0], node(DOMAIN_B)["devices"][1]]}
#: An H100 HGX board: no multi-node NVLink fabric, the call answers "not supported".
NOT_SUPPORTED = {"init": 0, "devices": [{"uuid": [0, "GPU-0"], "fabric_info": [3, ["", 0, 0, 0]]}]}
#: The fabric manager has not registered the GPU yet.
NOT_REGISTERED = node(DOMAIN_A, state=IN_PROGRESS)
NO_DRIVER = {"init": 9, "devices": []}
