"""Built-in NUMA affinity strategies: ``node``, ``socket``, ``exclusive``, ``core-complex``.

The strategies themselves are in :mod:`launcher.numa.strategies`; they use only the standard
library, and are imported when one is chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from launcher.plugins import hookimpl
from launcher.plugins.types import NumaStrategy


def _factory(class_name: str) -> Callable[[], Any]:
    def create() -> Any:
        from launcher.numa import strategies

        return getattr(strategies, class_name)()

    return create


@hookimpl
def launcher_numa_strategies() -> Iterator[NumaStrategy]:
    yield NumaStrategy(
        name="node",
        description="Each worker on the CPUs of its device's NUMA node",
        create=_factory("NodeStrategy"),
    )
    yield NumaStrategy(
        name="socket",
        description="Each worker on the CPUs of its device's socket (all its NUMA nodes)",
        create=_factory("SocketStrategy"),
    )
    yield NumaStrategy(
        name="exclusive",
        description="Each worker on its own share of the cores of its device's NUMA node",
        create=_factory("ExclusiveStrategy"),
    )
    yield NumaStrategy(
        name="core-complex",
        description="Each worker on one L3-cache group (core complex) of its device's NUMA node",
        create=_factory("CoreComplexStrategy"),
    )
