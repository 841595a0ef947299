"""The markers of tests/needs.py: each test gets the needs it has, from its fixtures, code and folder."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import needs

ROOT = Path(__file__).resolve().parents[1]

#: Tests of every kind of evidence, and the needs each must get (and no other).
EXPECTED = {
    # No need: a pure policy test beside namespace tests in the same module.
    "tests/store/test_admission.py::test_policy_verdicts": set(),
    # A fixture of the module's own that builds namespace hosts (tests.multinode.netns.Network).
    "tests/store/test_admission.py::test_joiners_need_the_secret_and_members_keep_access_once_restricted": {"netns"},
    # The conftest's fixtures (tests/multinode's autouse one, make_network, start_agent).
    "tests/multinode/test_recovery.py::test_two_nodes_recover_in_place": {"netns"},
    # ...and a helper that starts an etcd server, called from the test's own code.
    "tests/multinode/test_recovery.py::test_two_nodes_recover_in_place_over_etcd": {"netns", "etcd"},
    "tests/status/test_metrics.py::test_bad_ports_are_one_line_and_no_worker_starts": set(),
    "tests/status/test_metrics.py::test_a_real_prometheus_scrapes_the_ranks_and_the_restart_count": {"prometheus"},
    "tests/clusters/test_schedulers.py::test_sbatch_two_nodes": {"slurm"},
    "tests/clusters/test_schedulers.py::test_openmpi_one_launcher_per_node": {"mpi"},
    "tests/clusters/test_detection.py::test_expand_counts": set(),
    # A single test listed in needs.TORCH_JOBS, beside the module's others.
    "tests/clusters/test_cluster_option.py::test_kubeflow_pods_make_one_job": {"torch_job"},
    "tests/clusters/test_cluster_option.py::test_none_changes_nothing": set(),
    "tests/recovery/test_fallback.py::test_a_rank_without_the_wrapper_means_a_full_restart": set(),
    # A module listed in needs.TORCH_JOBS.
    "tests/recovery/test_in_place.py::test_a_killed_rank_is_replaced_and_the_others_keep_their_process": {"torch_job"},
    "plugins/launcher-etcd/tests/test_etcd_store.py::test_keys_live_under_the_prefix_only": {"etcd"},
    # A fixture's parameter (tests/rendezvous's store_service) and a listed test that imports torch.
    "tests/rendezvous/test_dynamic.py::test_run_ids_do_not_mix[torch]": {"torch"},
    "tests/rendezvous/test_dynamic.py::test_run_ids_do_not_mix[launcher]": set(),
    "tests/failures/test_record.py::test_same_format_as_torchs_record": {"torch"},
}

#: Prints each collected test's need markers (``-p`` plugin of the collecting run).
REPORTER = '''
def pytest_collection_finish(session):
    for item in session.items:
        print("NEEDS", item.nodeid, ",".join(sorted({m.name for m in item.iter_markers()} & NEEDS)))

NEEDS = set(%r)
'''


def test_each_test_gets_exactly_the_needs_it_has(tmp_path):
    (tmp_path / "needs_reporter.py").write_text(REPORTER % ([need.marker for need in needs.NEEDS],))
    files = sorted({nodeid.split("::")[0] for nodeid in EXPECTED})
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "needs_reporter",
         *(str(ROOT / f) for f in files)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = {}
    for line in result.stdout.splitlines():
        if line.startswith("NEEDS "):
            _, nodeid, *marks = line.split(" ")
            found[nodeid] = set(filter(None, "".join(marks).split(",")))
    assert {nodeid: found.get(nodeid) for nodeid in EXPECTED} == EXPECTED


def test_the_fast_lane_leaves_out_every_need():
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    command = " ".join(tox["testenv:fast"]["commands"].split())
    assert f'-m "{needs.FAST_LANE}"' in command


@pytest.mark.parametrize("need", needs.NEEDS, ids=lambda need: need.marker)
def test_every_need_is_a_registered_marker(need, pytestconfig):
    assert any(line.startswith(f"{need.marker}:") for line in pytestconfig.getini("markers"))
