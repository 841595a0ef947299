"""The rendezvous key schema: names byte for byte (the wire format), and parsing them back."""

from __future__ import annotations

import pytest
from launcher.rendezvous import dynamic
from launcher.rendezvous.keys import KEY_ROOT, KeyKind, ParsedKey, RendezvousKeys, is_per_node, parse_key

BASE = "launcher/rdzv/job%2F1"


def test_key_names_are_the_wire_format() -> None:
    keys = RendezvousKeys("job/1")
    assert KEY_ROOT == "launcher/rdzv" and dynamic.KEY_ROOT is KEY_ROOT
    assert keys.run_prefix == f"{BASE}/"
    assert keys.current == f"{BASE}/current"
    assert keys.closed == f"{BASE}/closed"
    assert keys.round_prefix(3) == f"{BASE}/3/"
    assert keys.open(3) == f"{BASE}/3/open"
    assert keys.seq(3) == f"{BASE}/3/seq"
    assert keys.node(3, 7) == f"{BASE}/3/node/7"
    assert keys.node_prefix(3) == f"{BASE}/3/node/"
    assert keys.sealed(3) == f"{BASE}/3/sealed"
    assert keys.rejoin(3) == f"{BASE}/3/rejoin"
    assert keys.heartbeat(3, 2) == f"{BASE}/3/hb/2"
    assert keys.heartbeat_prefix(3) == f"{BASE}/3/hb/"
    assert keys.lost_count(3) == f"{BASE}/3/lost"
    assert keys.lost(3, 1) == f"{BASE}/3/lost/1"
    assert keys.master(3) == f"{BASE}/3/master"
    assert keys.agent(3) == f"{BASE}/3/agent/"


def test_every_key_parses_back_to_its_kind_round_and_index() -> None:
    keys = RendezvousKeys("job/1")
    expected = {
        keys.current: (KeyKind.CURRENT, None, None),
        keys.closed: (KeyKind.CLOSED, None, None),
        keys.open(4): (KeyKind.OPEN, 4, None),
        keys.seq(4): (KeyKind.SEQ, 4, None),
        keys.node(4, 17): (KeyKind.NODE, 4, 17),
        keys.sealed(4): (KeyKind.SEALED, 4, None),
        keys.roster(4): (KeyKind.ROSTER, 4, None),
        keys.place(4, 17): (KeyKind.PLACE, 4, 17),
        keys.rejoin(4): (KeyKind.REJOIN, 4, None),
        keys.heartbeat(4, 0): (KeyKind.HEARTBEAT, 4, 0),
        keys.lost_count(4): (KeyKind.LOST_COUNT, 4, None),
        keys.lost(4, 2): (KeyKind.LOST, 4, 2),
        keys.master(4): (KeyKind.MASTER, 4, None),
        keys.agent(4) + "launcher/job/outcome/4/0": (KeyKind.AGENT, 4, None),
    }
    for key, (kind, r, index) in expected.items():
        assert parse_key(key) == ParsedKey(kind, r, index, "job/1"), key


@pytest.mark.parametrize(
    "key",
    [
        "",
        "launcher/rdzv",
        "launcher/rdzv/",
        "launcher/rdzv/job",
        "launcher/rdzv//current",
        "other/rdzv/job/current",
        "launcher/rdzv/job/unknown",
        "launcher/rdzv/job/x/seq",
        "launcher/rdzv/job/3",
        "launcher/rdzv/job/3/",
        "launcher/rdzv/job/3/what",
        "launcher/rdzv/job/3/node",
        "launcher/rdzv/job/3/node/x",
        "launcher/rdzv/job/3/node/1/extra",
        "launcher/rdzv/job/3/hb/-1",
        "launcher/rdzv/job/3/seq/1",
        "launcher/rdzv/job/3/agent",
    ],
)
def test_keys_of_no_kind_do_not_parse(key: str) -> None:
    assert parse_key(key) is None


def test_per_node_keys_are_the_participant_record_and_heartbeat_only() -> None:
    keys = RendezvousKeys("job/with/slashes")
    assert is_per_node(keys.node(3, 17)) and is_per_node(keys.heartbeat(0, 0))
    shared = [
        keys.current,
        keys.closed,
        keys.open(4),
        keys.seq(3),
        keys.sealed(3),
        keys.rejoin(3),
        keys.lost_count(3),
        keys.lost(3, 1),
        keys.master(3),
        keys.agent(3) + "x",
        keys.agent(3) + "x/node/1",
    ]
    for key in shared:
        assert not is_per_node(key), key
