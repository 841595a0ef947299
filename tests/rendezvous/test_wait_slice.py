"""Large rounds wait in longer slices, so that their idle waits cost the store's host about the
same as a round of 1,024 nodes; never so long that a heartbeat behind a slice comes too late."""

from __future__ import annotations

from launcher.rendezvous.config import DynamicRendezvousConfig
from launcher.rendezvous.store_ops import MAX_WAIT_SLICE, WAIT_SLICE, WAITS_PER_SECOND, wait_slice_for


def test_rounds_up_to_a_thousand_nodes_keep_one_second_slices() -> None:
    for n in (1, 8, 512, WAITS_PER_SECOND):
        assert wait_slice_for(n, 5.0, 15.0) == WAIT_SLICE


def test_larger_rounds_keep_the_re_waits_per_second_bounded() -> None:
    assert wait_slice_for(2048, 5.0, 15.0) * WAITS_PER_SECOND == 2048
    assert wait_slice_for(4096, 5.0, 15.0) == MAX_WAIT_SLICE
    assert wait_slice_for(16384, 5.0, 15.0) == MAX_WAIT_SLICE


def test_a_short_liveness_timeout_keeps_slices_short() -> None:
    # A beat held back by a slice must still land well before the others call this node lost.
    assert wait_slice_for(16384, 1.0, 5.0) == 2.0
    assert wait_slice_for(16384, 1.0, 2.0) == WAIT_SLICE  # never below the small rounds' slice


def test_the_handler_uses_the_slice_of_its_rounds_size() -> None:
    from launcher.rendezvous.dynamic import DynamicRendezvousHandler
    from launcher.store.server import StoreServer

    with StoreServer() as server:
        config = DynamicRendezvousConfig()
        big = DynamicRendezvousHandler(server.store, run_id="slices", min_nodes=1, max_nodes=4096, config=config)
        small = DynamicRendezvousHandler(server.store, run_id="slices", min_nodes=1, max_nodes=8, config=config)
        assert big._ops.wait_slice == MAX_WAIT_SLICE
        assert small._ops.wait_slice == WAIT_SLICE
