"""How many workers a node runs (``--nproc-per-node``) and which device each one sees.

The agent calls two functions:

:func:`resolve_nproc_per_node`
    turns ``--nproc-per-node`` (a number, or a device provider's name such as ``cuda``, ``gpu``,
    ``xpu``, ``cpu``, ``auto`` or the privateuse1 backend's name) into a worker count and the
    provider that counted it.
:func:`virtual_local_rank_env`
    the environment overrides for ``--virtual-local-rank``: each worker sees ``LOCAL_RANK=0`` and
    exactly one device.

Providers are plugins (``launcher_device_providers``); the built-ins live in
:mod:`launcher.devices.providers`. See ``docs/devices-and-numa.md``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from launcher.devices.errors import DeviceUnavailableError
from launcher.errors import UsageError
from launcher.plugins.errors import PluginNotFoundError
from launcher.plugins.types import DeviceProvider

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from launcher.plugins.manager import LauncherPluginManager

__all__ = [
    "DeviceUnavailableError",
    "registered_providers",
    "resolve_nproc_per_node",
    "virtual_local_rank_env",
]

log = logging.getLogger("launcher.devices")

# When --nproc-per-node is a number, torchrun's --virtual-local-rank uses CUDA's variable.
_DEFAULT_VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


def registered_providers(manager: LauncherPluginManager) -> list[DeviceProvider]:
    """Every registered device provider once (aliases collapsed), in registration order."""
    return [provided.registration for provided in manager.unique_registrations(DeviceProvider)]


def _find_provider(name: str, manager: LauncherPluginManager) -> DeviceProvider:
    try:
        return manager.get(DeviceProvider, name)
    except PluginNotFoundError:
        # A name known only at run time (the privateuse1 backend's) is asked for only after every
        # registered name missed, because answering may import torch.
        dynamic = sorted(
            (p for p in registered_providers(manager) if p.answers_to is not None),
            key=lambda p: (p.priority, p.name),
        )
        for provider in dynamic:
            assert provider.answers_to is not None
            try:
                if provider.answers_to(name.strip().lower()):
                    return provider
            except Exception as exc:  # a provider that cannot tell does not claim the name
                log.debug("device provider %r could not check name %r: %s", provider.name, name, exc)
        raise


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def resolve_nproc_per_node(value: str, manager: LauncherPluginManager) -> tuple[int, DeviceProvider | None]:
    """Turn ``--nproc-per-node VALUE`` into ``(workers per node, provider)``.

    A value that does not start with a letter is a count: plain ASCII decimal from 1 to
    :data:`~launcher.values.MAX_NPROC`, returned as ``(n, None)`` without loading any provider.
    A name selects a registered device provider (``auto`` stands for the provider it chooses,
    which is what is returned) and returns its device count. Raises
    :class:`~launcher.errors.UsageError`, in one line, for any other count or a kind that cannot be
    counted here, and the plugin manager's not-found error for an unknown name.
    """
    text = value.strip()
    if not value[:1].isalpha():
        # A count, never a device kind: plain ASCII decimal ("1_0", "٢", "+2" are refused, as
        # everywhere; int() would take them).
        from launcher.values import MAX_NPROC, parse_int

        return parse_int(value, "--nproc-per-node", 1, MAX_NPROC), None

    provider = _find_provider(text, manager)
    chosen = provider
    if provider.choose is not None:
        try:
            chosen = provider.choose(registered_providers(manager))
        except Exception as exc:
            raise UsageError(
                f"--nproc-per-node {value}: cannot choose a device kind: {_one_line(exc)}; "
                "give a number of workers instead (e.g. --nproc-per-node 1)"
            ) from exc
    label = chosen.name if chosen.name == text.lower() else f"{text.lower()} ({chosen.name})"
    try:
        count = int(chosen.count_devices())
    except Exception as exc:
        raise UsageError(
            f"--nproc-per-node {value}: cannot count {chosen.name} devices: {_one_line(exc)}; "
            "give a number of workers instead (e.g. --nproc-per-node 1)"
        ) from exc
    if count < 1:
        raise UsageError(
            f"--nproc-per-node {value}: no {chosen.name} devices are visible to this process"
            f"{_visibility_note(chosen)}; give a number of workers (e.g. --nproc-per-node 1)"
            + ("" if provider.choose is not None else " or --nproc-per-node auto")
        )
    log.info("--nproc-per-node %s: %d workers, one per %s device", label, count, chosen.name)
    return count, chosen


def _visibility_note(provider: DeviceProvider) -> str:
    var = provider.visible_devices_env
    if var and var in os.environ:
        return f" ({var}={os.environ[var]!r})"
    return ""


def _cuda_entry_usable(entry: str) -> bool:
    upper = entry.upper()
    return entry[:1].isdigit() or entry[:1] == "+" or upper.startswith(("GPU-", "MIG-"))


def virtual_local_rank_env(
    provider: DeviceProvider | None, local_rank: int, environ: Mapping[str, str]
) -> dict[str, str]:
    """Environment overrides for one worker under ``--virtual-local-rank``.

    The worker sees ``LOCAL_RANK=0`` and, through the provider's ``visible_devices_env``, exactly
    the ``local_rank``-th device this agent sees: with ``CUDA_VISIBLE_DEVICES=2,3`` inherited,
    local rank 1 gets ``CUDA_VISIBLE_DEVICES=3``; with nothing inherited it gets ``1``. A provider
    without a visibility variable (``cpu``) only changes ``LOCAL_RANK``. With no provider (a
    numeric ``--nproc-per-node``) the variable is ``CUDA_VISIBLE_DEVICES``, as with torchrun.
    Raises :class:`~launcher.errors.UsageError` when the inherited list has no such device.
    """
    if local_rank < 0:
        raise ValueError(f"local_rank must be >= 0, got {local_rank}")
    overrides = {"LOCAL_RANK": "0"}
    var = _DEFAULT_VISIBLE_ENV if provider is None else provider.visible_devices_env
    if var is None:
        return overrides
    inherited = environ.get(var)
    if inherited is None:
        overrides[var] = str(local_rank)
        return overrides
    entries = [entry.strip() for entry in inherited.split(",")] if inherited.strip() else []
    if var == _DEFAULT_VISIBLE_ENV:
        # CUDA ignores everything from the first entry it cannot parse; so must we.
        for position, entry in enumerate(entries):
            if not _cuda_entry_usable(entry):
                entries = entries[:position]
                break
    if local_rank >= len(entries) or not entries[local_rank]:
        raise UsageError(
            f"--virtual-local-rank: local rank {local_rank} has no device of its own: "
            f"{var}={inherited!r} lists {len(entries)}; run at most {len(entries)} workers per node "
            f"or widen {var}"
        )
    overrides[var] = entries[local_rank]
    return overrides
