"""Building the LogsSpecs a launch asked for, launcher's own or one written for torchrun.

``--logs-specs NAME`` is looked up among launcher's plugins first (the core's own and the
``launcher`` entry-point group), then in torch's ``torchrun.logs_specs`` group, where a class
written for torchrun is registered (see :meth:`launcher.plugins.manager.LauncherPluginManager.load_plugins`).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from launcher.errors import UsageError
from launcher.plugins.types import LogsSpecsLike, LogsSpecsProvider

if TYPE_CHECKING:  # pragma: no cover
    from launcher.logs.settings import LogSettings
    from launcher.plugins.manager import LauncherPluginManager


def _is_torch_class(cls: type) -> bool:
    return any(base.__module__.startswith("torch.") for base in cls.__mro__)


def _torch_std(spec: Any) -> Any:
    from torch.distributed.elastic.multiprocessing.api import Std

    if isinstance(spec, dict):
        return {rank: Std(value) for rank, value in spec.items()}
    return Std(spec)


def _accepted(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    # LogsSpecs written for torch < 2.3 take no local_ranks_filter; pass what the class accepts.
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {key: value for key, value in kwargs.items() if key in params}


def create_logs_specs(logs: LogSettings, manager: LauncherPluginManager) -> LogsSpecsLike:
    """The LogsSpecs instance the log settings name (``--logs-specs``), or the default.

    ``logs`` is the ``logs`` flag group's object (or anything with its fields); an instance in
    ``logs.logs_specs`` (what a test may pass) is returned as it is.

    A class derived from torch's LogsSpecs receives torch's ``Std`` values for ``redirects`` and
    ``tee``, as under torchrun; any other class receives the plain bitmasks. Only the keyword
    arguments the class accepts are passed. A class that rejects its settings raises
    :class:`~launcher.errors.UsageError`.
    """
    if logs.logs_specs is not None and not isinstance(logs.logs_specs, str):
        return logs.logs_specs
    name = logs.logs_specs or "default"
    reg = manager.get(LogsSpecsProvider, name)
    cls = reg.load_class()
    redirects, tee = logs.redirects, logs.tee
    if _is_torch_class(cls):
        # A LogsSpecs written for torchrun expects torch's Std enum values.
        redirects, tee = _torch_std(redirects), _torch_std(tee)
    kwargs: dict[str, Any] = {
        "log_dir": logs.log_dir,
        "redirects": redirects,
        "tee": tee,
        # torchrun's LogsSpecs take a set; the settings hold a frozenset.
        "local_ranks_filter": None if logs.local_ranks_filter is None else set(logs.local_ranks_filter),
    }
    try:
        return cls(**_accepted(cls, kwargs))
    except (ValueError, TypeError, OSError) as exc:
        # Bad settings (a --log-dir that is a file, a missing option): one line, no traceback.
        raise UsageError(f"logs specs {name!r}: {exc}") from exc
