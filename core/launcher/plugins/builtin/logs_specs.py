"""Built-in LogsSpecs: ``default``, torchrun's directory layout."""

from __future__ import annotations

from collections.abc import Iterator

from launcher.plugins import hookimpl
from launcher.plugins.types import LogsSpecsProvider


def _load_default() -> type:
    from launcher.logs.specs import DefaultLogsSpecs

    return DefaultLogsSpecs


@hookimpl
def launcher_logs_specs() -> Iterator[LogsSpecsProvider]:
    yield LogsSpecsProvider(
        name="default",
        description="torchrun's layout: <log-dir>/<run_id>_<unique>/attempt_<n>/<local_rank>/",
        load_class=_load_default,
    )
