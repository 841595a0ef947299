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


@dataclass(frozen=True)
class FoundEntryPoint:
    """One entry point and the distribution that declares it."""

    name: str
    value: str
    group: str
    distribution: str
    version: str

    def load(self) -> object:
        """Import the module (and attribute) the entry point names."""
        module_name, _, attribute = self.value.partition(":")
        target: object = importlib.import_module(module_name.strip())
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


#: One distribution's entry point as read from disk: (name, value, info directory, name from the
#: directory, version); the distribution's display name is read only when the group is asked for.
_Declared = tuple[str, str, str, str, str]

#: Per ``sys.path``: its directories' modification times when scanned, and every group's entry
#: points. A start asks for three groups; reading every distribution's entry_points.txt once
#: instead of three times saves a millisecond or two of every start. Installing or removing a
#: distribution changes its directory's modification time, which makes the next call scan again.
_INDEX: dict[tuple[str, ...], tuple[tuple[int, ...], dict[str, list[_Declared]]]] = {}


def _stamp(directory: str) -> int:
    try:
        return os.stat(directory).st_mtime_ns
    except OSError:
        return -1


def _scan(path: tuple[str, ...]) -> dict[str, list[_Declared]]:
    """Every group's entry points on ``path``; the first of a distribution's copies wins."""
    groups: dict[str, list[_Declared]] = {}
    seen: set[str] = set()
    for entry in path:
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
                    declared = _parse(handle.read())
            except OSError:
                continue
            version = version.split("-")[0] if version else "?"
            for group, items in declared.items():
                groups.setdefault(group, []).extend(
                    (ep_name, value, info_dir, dist_name, version) for ep_name, value in items
                )
    return groups


def entry_points(group: str, path: list[str] | None = None) -> Iterator[FoundEntryPoint]:
    """Every entry point of ``group`` declared by a distribution on ``path`` (``sys.path``)."""
    entries = tuple(sys.path if path is None else path)
    stamps = tuple(_stamp(entry or ".") for entry in entries)
    known = _INDEX.get(entries)
    if known is None or known[0] != stamps:
        known = (stamps, _scan(entries))
        _INDEX[entries] = known
    names: dict[str, str] = {}
    for ep_name, value, info_dir, dist_name, version in known[1].get(group, ()):
        if info_dir not in names:
            names[info_dir] = _metadata_name(info_dir, dist_name)
        yield FoundEntryPoint(ep_name, value, group, names[info_dir], version)
