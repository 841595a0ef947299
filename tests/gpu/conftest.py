"""The GPU lane: tests marked ``gpu`` run where torch sees a CUDA device and are skipped elsewhere.

``pytest -m gpu tests/gpu`` (or ``benchmarks/gpu_lane.py``, which also builds and installs the
wheels and prints the figures beside torchrun's).
"""

from __future__ import annotations

import pytest

from tests.gpu import lane


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or lane.cuda_devices() > 0:
        return
    skip = pytest.mark.skip(reason=lane.skip_reason())
    for item in gpu_items:
        item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not lane.RECORDED:
        return
    terminalreporter.section("GPU lane figures (seconds; one run each, no threshold)")
    for row in lane.RECORDED:
        detail = ", ".join(f"{k}={v}" for k, v in sorted(row.items()) if k not in ("figure", "seconds"))
        terminalreporter.write_line(f"{row['figure']:<48} {row['seconds']:8.3f}  {detail}")


def pytest_report_header(config: pytest.Config) -> str:
    """Which launcher the lane tests (benchmarks/gpu_lane.py runs them against the installed wheel)."""
    import launcher

    return f"launcher from {launcher.__file__}; CUDA devices torch sees: {lane.cuda_devices()}"
