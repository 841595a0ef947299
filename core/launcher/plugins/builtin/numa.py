"""Built-in NUMA affinity strategies: ``node``, ``socket``, ``exclusive``, ``core-complex``.

The strategies themselves are in :mod:`launcher.numa.strategies`; they use only the standard
library, and are imported when one is chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from launcher.plugins import hookimpl
from launcher.plugins.types import NumaStrategy

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from launcher.numa.strategies import AffinityStrategy


def _factory(class_name: str) -> Callable[[], AffinityStrategy]:
    def create() -> AffinityStrategy:
        from launcher.numa import strategies

        strategy: AffinityStrategy = getattr(strategies, class_name)()
        return strategy

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
