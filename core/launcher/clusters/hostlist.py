"""Slurm's compressed lists, expanded by our own code (no ``scontrol show hostnames``).

``n[01-04,07],gpu[1-2]`` is six host names; ``2(x3),1`` is four task counts. ``scontrol`` is not
on every compute node's path and costs a round trip to the controller on every launch.
"""

from __future__ import annotations

from itertools import product


class HostListError(ValueError):
    """A list that is not in Slurm's compressed syntax."""


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostListError(f"nested brackets in host list {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostListError(f"unbalanced ']' in host list {text!r}")
        elif char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    if depth:
        raise HostListError(f"unbalanced '[' in host list {text!r}")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _range(spec: str, whole: str) -> list[str]:
    """``01-04,07`` -> ``01 02 03 04 07`` (zero padding kept from the lower bound)."""
    values: list[str] = []
    for part in spec.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise HostListError(f"bad range {part!r} in host list {whole!r}")
        if not sep:
            values.append(low)
            continue
        width = len(low) if low.startswith("0") else 0
        start, stop = int(low), int(high)
        if stop < start:
            raise HostListError(f"range {part!r} runs backwards in host list {whole!r}")
        values.extend(str(number).zfill(width) for number in range(start, stop + 1))
    return values


def _expand_item(item: str, whole: str) -> list[str]:
    """One name with any number of bracket groups: ``rack[1-2]-n[1-3]`` is six names."""
    pieces: list[list[str]] = []
    rest = item
    while "[" in rest:
        before, _, after = rest.partition("[")
        spec, sep, rest = after.partition("]")
        if not sep:
            raise HostListError(f"unbalanced '[' in host list {whole!r}")
        pieces.append([before])
        pieces.append(_range(spec, whole))
    pieces.append([rest])
    return ["".join(parts) for parts in product(*pieces)]


def expand_hostlist(text: str) -> list[str]:
    """Every host name of a Slurm host list, in order (duplicates kept as given)."""
    hosts: list[str] = []
    for item in _split_top(text.strip()):
        hosts.extend(_expand_item(item, text))
    return hosts


def expand_counts(text: str) -> list[int]:
    """``2(x3),1`` -> ``[2, 2, 2, 1]`` (``SLURM_TASKS_PER_NODE``, ``SLURM_JOB_CPUS_PER_NODE``)."""
    counts: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        value, _, repeat = item.partition("(")
        times = 1
        if repeat:
            if not (repeat.startswith("x") and repeat.endswith(")") and repeat[1:-1].isdigit()):
                raise HostListError(f"bad count {item!r} in {text!r}")
            times = int(repeat[1:-1])
        if not value.isdigit():
            raise HostListError(f"bad count {item!r} in {text!r}")
        counts.extend([int(value)] * times)
    return counts
