"""``--preload`` and the threads an import starts (real templates, real workers, real torch).

A template may fork only if the workers get everything the imports set up. Native threads that
their library stops itself before a fork (OpenBLAS, loaded by numpy and so by ``import torch``)
are no obstacle: one worker per node, without ``OMP_NUM_THREADS``, must be preloaded and end up
with the thread counts and environment of a plain start. Threads that a fork would lose (an
OpenMP pool, a library's own thread), and CUDA, are refused in one line that names the cause.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launcher.preload._preload_main import _hazard_reason

from tests.core.test_preload import _comparable, _preload_lines, _run

#: What a one-worker job's worker tells about its threads, before and after using them.
THREADS = """
import json, os, sys
preloaded = "torch" in sys.modules
import numpy, torch

def tasks():
    return len(os.listdir("/proc/self/task"))

record = {
    "preloaded": preloaded,
    "intra_op": torch.get_num_threads(),
    "inter_op": torch.get_num_interop_threads(),
    "env": dict(os.environ),
    "ppid": os.getppid(),
}
matrix = numpy.ones((256, 256))
(matrix @ matrix).sum()
record["tasks_after_numpy"] = tasks()  # numpy's BLAS pool, started again after the fork
tensor = torch.ones(256, 256)
(tensor @ tensor).sum()
record["tasks_after_torch"] = tasks()  # and torch's intra-op pool
with open(sys.argv[1], "w") as f:
    json.dump(record, f)
"""


def test_one_worker_is_preloaded_with_the_threads_and_environment_of_a_plain_start(write_script, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    script = write_script("threads.py", THREADS)
    out = tmp_path / "record.json"  # one path for both runs: the workers' argv must be the same
    runs = {}
    for mode, flags in (("normal", []), ("preload", ["--preload", "torch"])):
        # run_launcher's environment has no OMP_NUM_THREADS, and launcher sets none for one worker.
        result, pid = _run(["--standalone", "--nproc-per-node", "1", *flags, script, str(out)], timeout=300)
        assert result.returncode == 0, result.stderr
        runs[mode] = (json.loads(out.read_text()), pid, result.stderr)
        out.unlink()
    normal, preloaded = runs["normal"][0], runs["preload"][0]
    assert not _preload_lines(runs["preload"][2]), runs["preload"][2]
    assert preloaded["preloaded"] and not normal["preloaded"]
    assert "OMP_NUM_THREADS" not in preloaded["env"]
    for key in ("intra_op", "inter_op", "tasks_after_numpy", "tasks_after_torch"):
        assert preloaded[key] == normal[key], (key, preloaded, normal)
    expected = _comparable({**normal, "modules": None}, runs["normal"][1])["env"]
    assert _comparable({**preloaded, "modules": None}, runs["preload"][1])["env"] == expected


def test_a_native_thread_that_a_fork_loses_is_refused_in_one_line(write_script):
    # A thread started below the threading module (as a C library would start one): a fork that
    # ends at once does not stop it, so a forked worker would lack it.
    write_script("native_pool.py", """
        import _thread, time
        _thread.start_new_thread(time.sleep, (60,))
    """)
    script = write_script("check.py", "import sys\nassert 'native_pool' not in sys.modules\n")
    result, _ = _run(["--standalone", "--nproc-per-node", "1", "--preload", "native_pool", script],
                     cwd=str(Path(script).parent))
    assert result.returncode == 0, result.stderr
    lines = _preload_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert "importing native_pool started 1 native thread(s) that do not stop for a fork" in lines[0]
    assert "starting workers normally" in lines[0]


def test_cuda_is_named_when_an_import_initialized_it():
    # Initializing CUDA starts threads too (2 on an H200 node): the line must name CUDA, not a
    # thread pool. No GPU here, so what the template found is given to the function that words it.
    reason = _hazard_reason("model", True, 2, [], False, 0)
    assert reason is not None and "importing model initialized CUDA" in reason
    assert "OpenMP" not in reason and "thread(s)" not in reason
    pool = _hazard_reason("model", False, 2, [], False, 0)
    assert pool is not None and "started 2 native thread(s)" in pool and "CUDA" not in pool
    assert _hazard_reason("model", False, 0, [], False, 0) is None
