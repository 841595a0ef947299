"""Finding entry points on ``sys.path`` without :mod:`importlib.metadata`.

``importlib.metadata`` parses every distribution's metadata with the email package, which costs
about 15 ms of a launch that should take a few tens of milliseconds. The entry points themselves
live in small ``entry_points.txt`` files beside each distribution's ``.dist-info`` (or
``.egg-info``) directory, so this module reads just those, and reads a distribution's name from
its ``METADATA`` only when that distribution has entry points in the group asked for.

As with :func:`importlib.metadata.entry_points`, when the same distribution is found in several
``sys.path`` entries, the first one wins.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FoundEntryPoint:
    """One entry point and the distribution that declares it."""

    name: str
    value: str
    group: str
    distribution: str
    version: str

    def load(self) -> Any:
        """Import the module (and attribute) the entry point names."""
        module_name, _, attribute = self.value.partition(":")
        target: Any = importlib.import_module(module_name.strip())
        for part in attribute.strip().split(".") if attribute.strip() else ():
            target = getattr(target, part)
        return target


def _normalise(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _metadata_name(info_dir: str, fallback: str) -> str:
    for filename in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(info_dir, filename), encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if line.startswith("Name:"):
                        return line[5:].strip()
                    if not line.strip():
                        break  # the headers end at the first blank line
        except OSError:
            continue
    return fallback


def _parse(text: str) -> dict[str, list[tuple[str, str]]]:
    """The ``[group]`` / ``name = value`` format of entry_points.txt."""
    groups: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = groups.setdefault(line[1:-1].strip(), [])
        elif current is not None and "=" in line:
            name, _, value = line.partition("=")
            current.append((name.strip(), value.strip()))
    return groups


def entry_points(group: str, path: list[str] | None = None) -> Iterator[FoundEntryPoint]:
    """Every entry point of ``group`` declared by a distribution on ``path`` (``sys.path``)."""
    seen: set[str] = set()
    for entry in sys.path if path is None else path:
        directory = entry or "."
        try:
            names = os.listdir(directory)
        except OSError:
            continue  # not a directory (a zip file, a missing path)
        for name in sorted(names):
            if name.endswith(".dist-info"):
                stem = name[: -len(".dist-info")]
            elif name.endswith(".egg-info"):
                stem = name[: -len(".egg-info")]
            else:
                continue
            dist_name, _, version = stem.partition("-")
            key = _normalise(dist_name)
            if key in seen:
                continue
            seen.add(key)
            info_dir = os.path.join(directory, name)
            try:
                with open(os.path.join(info_dir, "entry_points.txt"), encoding="utf-8") as handle:
                    declared = _parse(handle.read()).get(group)
            except OSError:
                continue
            if not declared:
                continue
            display = _metadata_name(info_dir, dist_name)
            version = version.split("-")[0] if version else "?"
            for ep_name, value in declared:
                yield FoundEntryPoint(ep_name, value, group, display, version)
