"""Fixtures of the status tests."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.status.jobs import WORKER, Job


@pytest.fixture
def start_job(write_script: Callable[[str, str], str], tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """``start_job(flags, env)``: a running :class:`Job` of WORKER, let go after the test."""
    jobs: list[Job] = []

    def start(flags: list[str] | None = None, env: dict[str, str] | None = None) -> Job:
        jobs.append(Job(write_script("worker.py", WORKER), tmp_path, flags or [], env or {}))
        return jobs[-1]

    yield start
    for job in jobs:
        if job.process.returncode is None:
            job.finish()


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """The ``prometheus`` server's path; the test is skipped where it is missing (marker ``prometheus``)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is missing (Debian: apt-get install prometheus)")
    return binary
