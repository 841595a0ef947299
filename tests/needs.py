"""What each test needs beyond a Python process: one pytest marker per need, set at collection.

``tox -e fast`` deselects every test that needs any of :data:`SLOW_NEEDS`; ``pytest -m netns`` (or
``-m "slurm or mpi"``...) picks the tests of one need. The marks are set here, from what a test
reaches, so that a new test is classified without marking it by hand:

* a fixture it uses (directly or through other fixtures), by name: ``make_network`` is a network
  namespace, ``slurm_cluster`` a Slurm cluster...;
* an object it, its fixtures or the helper functions they call (in this repository) refer to:
  anything from ``tests.multinode.netns`` builds namespaces, ``tests.multinode.etcd``'s
  ``start_etcd`` starts an etcd server;
* a parameter: ``store_service[torch]`` needs torch;
* the folder it lives in (``tests/gpu/``), or, for jobs whose workers import torch, the module
  (:data:`TORCH_JOBS`, :data:`TORCH_IMPORTS`): what a worker script imports is not visible from
  the test's code.

``torch`` is not a slow need: those tests stay in the fast lane and are skipped where torch is
missing (the fast lane on a Python without a torch wheel).

A mark written by hand on a test (``@pytest.mark.netns``) counts too; the two agree.
"""

from __future__ import annotations

import importlib.util
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
    #: Parameter values or ids (of a parametrized test or fixture) that mean the need: ``[torch]``.
    params: frozenset[str] = frozenset()
    #: Left out of the fast lane (else: in it, and skipped where the need cannot be met).
    slow: bool = True


#: Modules (or single tests) that run jobs of several workers importing torch (gloo all-reduce,
#: DDP, the recovery example): seconds each, where a standard-library worker takes a fraction.
#: Measured with ``--durations``; a module is listed whole when most of its tests launch such jobs.
TORCH_JOBS = (
    "tests/core/test_gloo.py::",
    "tests/store/test_gloo.py::",
    "tests/clusters/test_cluster_option.py::test_kubeflow_pods_make_one_job",
    "tests/hangs/test_checkpoint_quiet.py::test_rank_1_waiting",
    "tests/hangs/test_checkpoint_quiet.py::test_with_a_fixed_timeout_too",
    "tests/hangs/test_checkpoint_quiet.py::test_a_checkpoint_that_hangs",
    "tests/hangs/test_gloo_hang.py::",
    "tests/hangs/test_auto_timeout.py::test_learned_values_survive_a_restart_and_name_the_blocked_rank",
    "tests/hangs/test_auto_timeout.py::test_a_slow_start_and_slow_checkpoints_raise_no_false_alarm",
    "tests/hangs/test_progress_without_code.py::test_a_ddp_job_with_no_launcher_call_is_watched",
    "tests/hangs/test_progress_without_code.py::test_an_fsdp2_job_with_no_launcher_call_is_watched_too",
    "tests/hangs/test_progress_without_code.py::test_the_same_job_unblocked_finishes_with_no_false_alarm",
    "tests/hangs/test_progress_without_code.py::test_steps_per_second_come_from_optimizer_steps",
    "tests/hangs/test_frameworks.py::",
    "tests/recovery/test_all_blocked.py::",
    "tests/recovery/test_function.py::",
    "tests/recovery/test_in_place.py::",
    "tests/recovery/test_learned_timeouts.py::",
    "tests/rendezvous/test_c10d.py::test_file_store_from_the_command_line",
    "tests/status/test_slow_ranks.py::",
    "tests/stragglers/test_preload_and_functions.py::",
    "tests/stragglers/test_real_jobs.py::",
    "plugins/launcher-torchx/tests/test_kubeflow_pet_env.py::",
    "plugins/launcher-torchx/tests/test_torchx_local_cwd.py::test_one_node_two_workers",
    "plugins/launcher-torchx/tests/test_torchx_local_cwd.py::test_two_nodes_two_workers_each",
)

#: Tests that import torch in their own process, or run a worker or torchrun that does (without being
#: a job of several torch workers): skipped on a Python without torch (the fast lane on 3.10, 3.13).
TORCH_IMPORTS = (
    "tests/recovery/test_slow_abort.py::",
    "tests/core/test_worker_env.py::test_environment_matches_torchrun",
    "tests/core/test_worker_env.py::test_is_torchelastic_launched_and_record",
    "tests/devices/test_cuda.py::test_without_nvml_a_cpu_only_torch_means_no_cuda",
    "tests/devices/test_lazy_imports.py::test_auto_without_nvml_on_a_cpu_only_torch_never_imports_torch",
    "tests/devices/test_privateuse1.py::test_without_a_backend_only_torchs_placeholder_name_is_claimed",
    "tests/devices/test_resolve.py::test_xpu_on_a_torch_without_xpu",
    "tests/failures/test_record.py::test_same_format_as_torchs_record",
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
    Need("torch", "torch in the test's Python (skipped where it is missing)", paths=TORCH_IMPORTS,
         params=frozenset({"torch"}), slow=False),
    # A private network namespace has only its loopback (no DNS either): these skip there (the fast lane), and the
    # full run (tests/full_run.py) runs them in the root namespace.
    Need("host_network", "this host's own network: an address other than loopback, its DNS resolver",
         paths=("tests/rendezvous/test_c10d.py::test_local_host_detection_by_interface_address",
                "plugins/launcher-etcd/tests/test_etcd_plugin.py::"
                "test_an_endpoint_host_that_dns_says_does_not_exist_fails_at_once"), slow=False),
)

#: The needs the fast lane (``tox -e fast``) leaves out.
SLOW_NEEDS = tuple(need.marker for need in NEEDS if need.slow)
#: ``-m`` expression of the fast lane.
FAST_LANE = " and ".join(f"not {marker}" for marker in SLOW_NEEDS)


def register(config: pytest.Config) -> None:
    """Register one marker per need (``pytest --markers`` lists them)."""
    for need in NEEDS:
        config.addinivalue_line("markers", f"{need.marker}: needs {need.description}")


def mark(items: Iterable[pytest.Item]) -> None:
    """Add the marker of every need each item has."""
    torch_missing = importlib.util.find_spec("torch") is None
    for item in items:
        reached = _Reached(item)
        nodeid = _root_relative(item)
        callspec = getattr(item, "callspec", None)
        params = set(callspec.id.split("-")) if callspec else set()  # the ids, [torch] or [spawn-torch]
        params.update(value for value in (callspec.params.values() if callspec else ()) if isinstance(value, str))
        for need in NEEDS:
            if item.get_closest_marker(need.marker) is None and (
                    nodeid.startswith(need.paths) or reached.fixtures & need.fixtures
                    or reached.modules & need.modules or reached.objects & need.objects or params & need.params):
                item.add_marker(need.marker)
        if torch_missing and (item.get_closest_marker("torch") or item.get_closest_marker("torch_job")):
            item.add_marker(pytest.mark.skip(reason="needs torch, which this Python does not have"))


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
