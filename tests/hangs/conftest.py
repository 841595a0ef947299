"""Launcher runs in these tests keep their temporary files (kept logs, stacks files) in tmp_path."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_tmpdir(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
