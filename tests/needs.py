"""What each test needs beyond a Python process: one pytest marker per need, set at collection.

``tox -e fast`` deselects every test that needs any of :data:`SLOW_NEEDS`; ``pytest -m netns`` (or
``-m "slurm or mpi"``...) picks the tests of one need. The marks are set here, from what a test
reaches, so that a new test is classified without marking it by hand:

* a fixture it uses (directly or through other fixtures), by name: ``make_network`` is a network
  namespace, ``slurm_cluster`` a Slurm cluster...;
* an object it, its fixtures or the helper functions they call (in this repository) refer to:
  anything from ``tests.multinode.netns`` builds namespaces, ``tests.multinode.etcd``'s
  ``start_etcd`` starts an etcd server;
* the folder it lives in (``tests/gpu/``), or, for jobs whose workers import torch, the module
  (:data:`TORCH_JOBS`): what a worker script imports is not visible from the test's code.

A mark written by hand on a test (``@pytest.mark.netns``) counts too; the two agree.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Need:
    """How to tell that a test needs one thing: the marker, and what gives it away."""

    marker: str
    description: str
    #: Fixture names whose use means the need.
    fixtures: frozenset[str] = frozenset()
    #: Modules any object of which, referred to, means the need.
    modules: frozenset[str] = frozenset()
    #: ``module.qualname`` of single objects whose use means the need.
    objects: frozenset[str] = frozenset()
    #: Node-id prefixes (folders, modules, single tests) whose every test has the need.
    paths: tuple[str, ...] = ()


#: Modules (or single tests) that run jobs of several workers importing torch (gloo all-reduce,
#: DDP, the recovery example): seconds each, where a standard-library worker takes a fraction.
#: Measured with ``--durations``; a module is listed whole when most of its tests launch such jobs.
TORCH_JOBS = (
    "tests/core/test_gloo.py::",
    "tests/store/test_gloo.py::",
    "tests/clusters/test_cluster_option.py::test_kubeflow_pods_make_one_job",
    "tests/hangs/test_gloo_hang.py::",
    "tests/recovery/test_all_blocked.py::",
    "tests/recovery/test_function.py::",
    "tests/recovery/test_in_place.py::",
    "tests/status/test_slow_ranks.py::",
    "tests/stragglers/test_preload_and_functions.py::",
    "tests/stragglers/test_real_jobs.py::",
    "plugins/launcher-torchx/tests/test_kubeflow_pet_env.py::",
    "plugins/launcher-torchx/tests/test_torchx_local_cwd.py::test_one_node_two_workers",
    "plugins/launcher-torchx/tests/test_torchx_local_cwd.py::test_two_nodes_two_workers_each",
)

NEEDS = (
    Need("netns", "network namespaces of its own (root, ip netns): multi-host tests",
         fixtures=frozenset({"_namespaces_usable", "make_network", "start_agent"}),
         modules=frozenset({"tests.multinode.netns"})),
    Need("slurm", "a real Slurm cluster (slurmctld, slurmd, munge)", fixtures=frozenset({"slurm_cluster"}),
         objects=frozenset({"tests.clusters.schedulers.SlurmCluster"})),
    Need("mpi", "Open MPI's or MPICH's mpirun", fixtures=frozenset({"openmpi", "mpich"})),
    Need("etcd", "a real etcd server", fixtures=frozenset({"etcd_binary", "shared_etcd", "etcd_cluster"}),
         objects=frozenset({"tests.multinode.etcd.etcd_binary", "tests.multinode.etcd.start_etcd"})),
    Need("prometheus", "a real Prometheus server scraping a job", fixtures=frozenset({"prometheus_binary"})),
    Need("gpu", "a GPU (skipped without one)", paths=("tests/gpu/",)),
    Need("torch_job", "a job of several workers that import torch (gloo)", paths=TORCH_JOBS),
)

#: The needs the fast lane (``tox -e fast``) leaves out.
SLOW_NEEDS = tuple(need.marker for need in NEEDS)
#: ``-m`` expression of the fast lane.
FAST_LANE = " and ".join(f"not {marker}" for marker in SLOW_NEEDS)


def register(config: pytest.Config) -> None:
    """Register one marker per need (``pytest --markers`` lists them)."""
    for need in NEEDS:
        config.addinivalue_line("markers", f"{need.marker}: needs {need.description}")


def mark(items: Iterable[pytest.Item]) -> None:
    """Add the marker of every need each item has."""
    for item in items:
        reached = _Reached(item)
        nodeid = _root_relative(item)
        for need in NEEDS:
            if item.get_closest_marker(need.marker) is not None:
                continue
            if (nodeid.startswith(need.paths) or reached.fixtures & need.fixtures
                    or reached.modules & need.modules or reached.objects & need.objects):
                item.add_marker(need.marker)


def _root_relative(item: pytest.Item) -> str:
    """The node id from the repository root, wherever pytest's rootdir is."""
    try:
        path = Path(item.path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return item.nodeid
    return path + item.nodeid[item.nodeid.index("::"):] if "::" in item.nodeid else path


class _Reached:
    """The fixtures a test uses, and the objects its code reaches (through this repository's code)."""

    def __init__(self, item: pytest.Item) -> None:
        self.fixtures: frozenset[str] = frozenset(getattr(item, "fixturenames", ()))
        self.modules: set[str] = set()
        self.objects: set[str] = set()
        self._seen: set[int] = set()
        functions = [getattr(item, "function", None)]
        info = getattr(item, "_fixtureinfo", None)
        for defs in (info.name2fixturedefs.values() if info is not None else ()):
            functions.extend(fixturedef.func for fixturedef in defs)
        for function in functions:
            self._visit(function)

    def _visit(self, function: object) -> None:
        function = getattr(function, "__wrapped__", function)
        code = getattr(function, "__code__", None)
        if code is None or id(code) in self._seen or not _ours(code):
            return
        self._seen.add(id(code))
        namespace = getattr(function, "__globals__", {})
        for name in _names(code):
            value = namespace.get(name)
            if value is None:
                continue
            if isinstance(value, types.ModuleType):
                self.modules.add(value.__name__)
                continue
            module = getattr(value, "__module__", None)
            if isinstance(module, str):
                self.modules.add(module)
                self.objects.add(f"{module}.{getattr(value, '__qualname__', name)}")
            if isinstance(value, types.FunctionType):
                self._visit(value)


def _names(code: types.CodeType) -> Iterator[str]:
    """The global names a function and the functions nested in it refer to."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _ours(code: types.CodeType) -> bool:
    """Code of this repository (tests, plugins' tests), not of pytest or the standard library."""
    path = Path(code.co_filename)
    return path.is_absolute() and ROOT in path.parents and ".tox" not in path.parts
