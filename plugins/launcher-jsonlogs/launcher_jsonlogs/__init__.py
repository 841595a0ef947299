"""launcher plugin: worker output as JSON lines, one file per node (``--logs-specs jsonlogs``)."""

from __future__ import annotations

from collections.abc import Iterator

from launcher.plugins import hookimpl
from launcher.plugins.types import LogsSpecsProvider


def _load() -> type:
    # Imported only when the name is chosen, so listing plugins stays instant.
    from launcher_jsonlogs.specs import JsonLogsSpecs

    return JsonLogsSpecs


@hookimpl
def launcher_logs_specs() -> Iterator[LogsSpecsProvider]:
    """Register ``jsonlogs``."""
    yield LogsSpecsProvider(
        name="jsonlogs",
        description="Every worker line as a JSON object in <dir>/<run_id>/<hostname>.jsonl",
        load_class=_load,
    )
