"""``--rdzv-conf`` that arrives with the quotes of a quoting layer still in it: refused, and shown without them."""

from __future__ import annotations

import pytest
from launcher.config import parse_rdzv_conf
from launcher.errors import UsageError


@pytest.mark.parametrize(("value", "meant"), [
    ("'join_timeout=5,timeout=5'", "join_timeout=5,timeout=5"),
    ('"join_timeout=5"', "join_timeout=5"),
    ("join_timeout='5'", "join_timeout=5"),
    ("join_timeout=5,'timeout'=5", "join_timeout=5,timeout=5"),
])
def test_stray_quotes_are_named_and_the_meant_value_shown(value: str, meant: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_rdzv_conf(value)
    message = str(caught.value)
    assert "carries quote characters" in message
    assert message.endswith(f"give it without them, --rdzv-conf {meant}")
    assert parse_rdzv_conf(meant)  # what the message suggests is accepted


def test_a_quote_inside_a_value_is_the_value() -> None:
    """A path may hold a quote; only keys and a value's ends are checked."""
    assert parse_rdzv_conf("secret_file=/run/it's/secret,join_timeout=5") == {
        "secret_file": "/run/it's/secret", "join_timeout": "5"}
