"""A large round's sealed record is stored compressed and reads back the same; small ones as JSON."""

from __future__ import annotations

import pytest
from launcher.rendezvous.api import RendezvousError
from launcher.rendezvous.membership import COMPRESS_OVER, Membership, decode, encode, encode_large


def _sealed(n: int) -> dict[str, object]:
    ids = [f"node{i:05d}.example.com_{1000 + i}_0" for i in range(n)]
    return {
        "state": "sealed",
        "count": n,
        "ids": ids,
        "lws": [8] * n,
        "addrs": [[f"node{i:05d}.example.com", f"10.0.{i // 256}.{i % 256}"] for i in range(n)],
        "closer": ids[0],
        "hr": 0,
    }


def test_a_small_record_is_plain_json() -> None:
    value = _sealed(8)
    assert encode_large(value) == encode(value)
    assert decode(encode_large(value)) == value


def test_a_large_record_is_compressed_and_reads_back_the_same() -> None:
    value = _sealed(2048)
    plain, stored = encode(value), encode_large(value)
    assert len(plain) > COMPRESS_OVER
    assert len(stored) * 4 < len(plain)
    assert decode(stored) == value


def test_a_damaged_compressed_record_is_an_unreadable_value() -> None:
    with pytest.raises(RendezvousError, match="cannot read"):
        decode(encode_large(_sealed(2048))[:100])


def test_a_membership_works_out_its_addresses_from_the_record_when_asked() -> None:
    value = _sealed(3)
    m = Membership(0, 1, 3, 3, 0, node_id=str(value["ids"][1]), load=lambda: value)  # type: ignore[index]
    assert m.addresses[2] == ("node00002.example.com", "10.0.0.2")
    assert Membership(0, 0, 1, 1, node_id="a_1_0").addresses == ()
