"""What each built-in cluster environment says about real schedulers' environments.

The table's rows are environments captured from real ``srun`` (plain, ``--mpi=pmi2``,
``--mpi=pmix``), ``sbatch``, ``salloc``, ``mpirun`` and ``mpirun.mpich`` runs (``data/``): for
each, which built-ins claim it and what they derive.
Name resolution is pinned (the virtual nodes' names never resolve) so that the table does not
depend on this machine's DNS.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
from launcher.clusters import kubeflow, lsf, mpi, slurm
from launcher.clusters.api import ClusterInfo, derived_port
from launcher.clusters.hostlist import HostListError, expand_counts, expand_hostlist

from tests.clusters.samples import dump, dump_names, kubeflow_job, lsf_job


def _never(host: str) -> bool:
    return False


DETECTORS: dict[str, Callable[[Mapping[str, str]], ClusterInfo | None]] = {
    "openmpi": lambda env: mpi.detect_openmpi(env, _never),
    "mpich": lambda env: mpi.detect_mpich(env, _never),
    "pmix": lambda env: mpi.detect_pmix(env, _never),
    "slurm": lambda env: slurm.detect(env, _never),
    "lsf": lambda env: lsf.detect(env, lambda: env.get("HOST", "elsewhere")),
    "kubeflow": kubeflow.detect,
}
AUTO_ORDER = ["openmpi", "mpich", "pmix", "slurm", "lsf", "kubeflow"]

# dump -> {built-in: (node ranks, nnodes, address, port, run id, backend, problem phrase or None)}
TABLE: dict[str, dict[str, tuple[object, ...]]] = {
    "slurm-srun-one-task-per-node": {
        "slurm": ([0, 1], 2, "127.0.0.1", 15002, "slurm-2.0", "static", None),
    },
    "slurm-batch-srun": {
        "slurm": ([0, 1], 2, "127.0.0.1", 15003, "slurm-3.0", "static", None),
    },
    "slurm-srun-two-tasks-per-node": {
        "slurm": ([None] * 4, 2, None, 15001, "slurm-1.0", "static", "srun started 2 launchers on n1"),
    },
    "slurm-batch-direct": {
        "slurm": ([None], 2, None, 15003, "slurm-3", "static", "a batch script runs the launcher on one of them"),
    },
    "slurm-salloc": {
        "slurm": ([None], 2, None, 15004, "slurm-4", "static", "salloc runs the launcher on one of them"),
    },
    "slurm-srun-pmi2": {
        "mpich": ([0, 1], 2, "127.0.0.1", 15005, "slurm-5", "c10d", None),
        "slurm": ([0, 1], 2, "127.0.0.1", 15005, "slurm-5.0", "static", None),
    },
    "slurm-srun-pmix": {
        # PMIx gives the rank only: the size and the endpoint come from Slurm; auto asks PMIx first.
        "pmix": ([0, 1], 2, "127.0.0.1", 16750, "slurm-1351750", "c10d", None),
        "slurm": ([0, 1], 2, "127.0.0.1", 16750, "slurm-1351750.0", "static", None),
    },
    "openmpi-in-salloc-two-per-node": {
        "openmpi": ([None] * 4, 4, None, None, None, "c10d", "2 launchers were started on this host"),
        # Slurm's variables there describe Open MPI's daemons; auto asks Open MPI first.
        "slurm": ([0, 0, 1, 1], 2, "127.0.0.1", 15006, "slurm-6.0", "static", None),
    },
    "openmpi-two-nodes": {
        "openmpi": ([0, 1], 2, "192.0.2.2", derived_port("202506241"), "ompi-202506241", "c10d", None),
    },
    "mpich-two-nodes": {
        "mpich": ([0, 1], 2, None, None, None, "c10d", "give --rdzv-endpoint HOST:PORT"),
    },
}


def test_the_table_covers_every_dump() -> None:
    assert sorted(TABLE) == dump_names()


@pytest.mark.parametrize("name", sorted(TABLE))
def test_detection_table(name: str) -> None:
    nodes = dump(name)
    claimed = {}
    for builtin, detect in DETECTORS.items():
        infos = [detect(env) for env in nodes]
        assert len({info is None for info in infos}) == 1, f"{builtin} claims only some nodes of {name}"
        if infos[0] is None:
            continue
        first = infos[0]
        problem = first.problem
        claimed[builtin] = (
            [info.node_rank for info in infos], first.nnodes, first.master_addr, first.master_port, first.run_id,
            first.backend, problem,
        )
    expected = TABLE[name]
    assert sorted(claimed) == sorted(expected), f"{name}: claimed by {sorted(claimed)}"
    for builtin, row in expected.items():
        got = claimed[builtin]
        assert got[:6] == row[:6], f"{name}, {builtin}: {got[:6]} != {row[:6]}"
        phrase = row[6]
        if phrase is None:
            assert got[6] is None, f"{name}, {builtin}: unexpected problem {got[6]!r}"
        else:
            assert got[6] is not None and phrase in str(got[6]), f"{name}, {builtin}: problem {got[6]!r}"
    auto = next(b for b in AUTO_ORDER if b in expected)
    assert auto == next(b for b in AUTO_ORDER if b in claimed)


def test_a_resolvable_first_node_is_the_endpoint() -> None:
    nodes = dump("slurm-batch-srun")
    infos = [slurm.detect(env, lambda host: host == "n1") for env in nodes]
    assert {info.master_addr for info in infos} == {"n1"}
    assert infos[1].sources["master_addr"] == "SLURM_STEP_NODELIST (first node)"


def test_nothing_resolves_and_no_launch_node() -> None:
    env = {k: v for k, v in dump("slurm-batch-srun")[1].items() if k != "SLURM_LAUNCH_NODE_IPADDR"}
    info = slurm.detect(env, _never)
    assert info is not None and info.master_addr is None and "'n1'" in str(info.problem)


def test_one_node_batch_script() -> None:
    env = dict(dump("slurm-batch-direct")[0], SLURM_NNODES="1", SLURM_JOB_NUM_NODES="1",
               SLURM_JOB_NODELIST="n1", SLURM_NTASKS_PER_NODE="2")
    info = slurm.detect(env, _never)
    assert info is not None and info.problem is None
    assert (info.nnodes, info.node_rank, info.master_addr, info.nproc_per_node) == (1, 0, "127.0.0.1", 2)


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("n[01-04,07],gpu[1-2]", ["n01", "n02", "n03", "n04", "n07", "gpu1", "gpu2"]),
        ("n[1-2]", ["n1", "n2"]),
        ("login,compute-[8-10]", ["login", "compute-8", "compute-9", "compute-10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("node[098-101]", ["node098", "node099", "node100", "node101"]),
        ("a.example.org,b.example.org", ["a.example.org", "b.example.org"]),
        ("single", ["single"]),
    ],
)
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]", "n[[1-2]]"])
def test_bad_hostlists(text: str) -> None:
    with pytest.raises(HostListError):
        expand_hostlist(text)


def test_expand_counts() -> None:
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4]
    with pytest.raises(HostListError):
        expand_counts("2(y3)")


def test_kubeflow_pods() -> None:
    infos = [kubeflow.detect(env) for env in kubeflow_job(3)]
    assert [i.node_rank for i in infos if i] == [0, 1, 2]
    first = infos[0]
    assert first is not None
    assert (first.nnodes, first.master_addr, first.master_port, first.backend) == (
        3, "pytorch-mnist-master-0", 23456, "static")


def test_kubeflow_is_not_a_worker_or_an_elastic_job() -> None:
    pod = kubeflow_job(2)[1]
    assert kubeflow.detect({**pod, "LOCAL_RANK": "0"}) is None
    assert kubeflow.detect({k: v for k, v in pod.items() if k != "KUBERNETES_SERVICE_HOST"}) is None
    elastic = kubeflow.detect({**pod, "PET_NNODES": "2", "WORLD_SIZE": "8"})
    assert elastic is not None and elastic.nnodes is None and elastic.node_rank is None


def test_lsf_hosts() -> None:
    job = lsf_job(("hostA.example.org", "hostB.example.org"), slots=4)
    infos = [lsf.detect(env, lambda env=env: env["HOST"].split(".")[0]) for env in job]
    assert [(i.node_rank, i.nnodes, i.nproc_per_node) for i in infos if i] == [(0, 2, 4), (1, 2, 4)]
    assert {i.master_addr for i in infos if i} == {"hostA.example.org"}
    assert {i.master_port for i in infos if i} == {derived_port("4711")}
    stranger = lsf.detect(job[0], lambda: "hostC")
    assert stranger is not None and stranger.node_rank is None and "hostC" in str(stranger.problem)


def test_lsf_hostfile(tmp_path) -> None:  # type: ignore[no-untyped-def]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("hostA\nhostA\nhostB\nhostB\n")
    info = lsf.detect({"LSB_JOBID": "12", "LSB_DJOB_HOSTFILE": str(hostfile)}, lambda: "hostB")
    assert info is not None and (info.node_rank, info.nnodes, info.nproc_per_node) == (1, 2, 2)


def test_derived_port_is_stable() -> None:
    assert derived_port("1234") == 16234
    assert derived_port("31234") == 16234
    assert 15000 <= derived_port("ompi-abc") < 30000
    assert derived_port("ompi-abc") == derived_port("ompi-abc")
