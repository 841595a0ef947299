"""Building the LogsSpecs a launch asked for, launcher's own or one written for torchrun."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.plugins.types import LogsSpecsProvider

if TYPE_CHECKING:  # pragma: no cover
    from launcher.config import LaunchConfig
    from launcher.plugins.manager import LauncherPluginManager


def _is_torch_class(cls: type) -> bool:
    return any(base.__module__.startswith("torch.") for base in cls.__mro__)


def _torch_std(spec: Any) -> Any:
    from torch.distributed.elastic.multiprocessing.api import Std

    if isinstance(spec, dict):
        return {rank: Std(value) for rank, value in spec.items()}
    return Std(spec)


def create_logs_specs(config: LaunchConfig, manager: LauncherPluginManager) -> Any:
    """The LogsSpecs instance for ``config``: given, named (``--logs-specs``), or the default."""
    if config.logs_specs is not None and not isinstance(config.logs_specs, str):
        return config.logs_specs
    name = config.logs_specs or "default"
    reg = manager.get("logs specs", name)
    assert isinstance(reg, LogsSpecsProvider)
    cls = reg.load_class()
    redirects, tee = config.redirects, config.tee
    if _is_torch_class(cls):
        # A LogsSpecs written for torchrun expects torch's Std enum values.
        redirects, tee = _torch_std(redirects), _torch_std(tee)
    return cls(
        log_dir=config.log_dir,
        redirects=redirects,
        tee=tee,
        local_ranks_filter=config.local_ranks_filter,
    )
