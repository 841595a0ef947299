"""The built-in health checks against launcher.testing's suite for their kind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from launcher.health.api import CheckContext
from launcher.health.builtin import MIN_FREE_ENV
from launcher.testing import HealthCheckConformance


class TestGpuCheck(HealthCheckConformance):
    health_check_name = "gpu"


class TestDiskCheck(HealthCheckConformance):
    health_check_name = "disk"

    @pytest.fixture
    def healthy_context(self, tmp_path: Path) -> CheckContext:
        return CheckContext(node="n", temp_dir=str(tmp_path), log_dir=str(tmp_path / "logs"))

    @pytest.fixture
    def sick_context(self, tmp_path: Path) -> CheckContext:
        return CheckContext(node="n", env={MIN_FREE_ENV: "1e9"}, temp_dir=str(tmp_path))


class TestPythonCheck(HealthCheckConformance):
    health_check_name = "python"

    @pytest.fixture
    def healthy_context(self) -> CheckContext:
        return CheckContext(node="n", env=dict(os.environ), python=sys.executable, module="json.tool")

    @pytest.fixture
    def sick_context(self) -> CheckContext:
        return CheckContext(node="n", env=dict(os.environ), python=sys.executable, module="no_such_pkg_xyz.main")


class TestCommandCheck(HealthCheckConformance):
    health_check_name = "command"

    @pytest.fixture
    def healthy_context(self) -> CheckContext:
        return CheckContext(node="n", command="/bin/true")

    @pytest.fixture
    def sick_context(self) -> CheckContext:
        return CheckContext(node="n", command="/bin/false")
