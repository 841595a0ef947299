"""Launcher runs in these tests keep their temporary files (kept logs, stacks files) in a
temporary directory of their own, removed after the test."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest


@pytest.fixture(autouse=True)
def _private_tmpdir(monkeypatch, tmp_path_factory):
    # pytest's own base directory is chosen on first use from TMPDIR: choose it before TMPDIR
    # points at this test's directory, removed at its end (the next test's tmp_path would be lost).
    tmp_path_factory.getbasetemp()
    # Short, however long tmp_path is (pytest-xdist adds a level): the launcher's per-job directory
    # goes below it, and a forkserver's AF_UNIX socket below that, whose path must fit in 108 bytes.
    tmp = tempfile.mkdtemp(prefix="lh-", dir="/tmp" if os.path.isdir("/tmp") else None)
    monkeypatch.setenv("TMPDIR", tmp)
    yield
    shutil.rmtree(tmp, ignore_errors=True)
