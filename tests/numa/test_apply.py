"""apply_affinity binds the calling process and the threads it already started."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from launcher.numa import apply_affinity

SCRIPT = """
import json, os, threading, time
from launcher.numa import apply_affinity

first = min(os.sched_getaffinity(0))
ready = threading.Event()
done = threading.Event()
tids = {}

def worker(name, pin):
    tids[name] = threading.get_native_id()
    if pin is not None:
        os.sched_setaffinity(0, pin)
    ready.set() if name == "pinned" else None
    done.wait()

pinned_to = {max(os.sched_getaffinity(0))}
plain = threading.Thread(target=worker, args=("plain", None))
pinned = threading.Thread(target=worker, args=("pinned", pinned_to))
plain.start(); pinned.start(); ready.wait(); time.sleep(0.05)
apply_affinity(frozenset({first}))
result = {
    "main": sorted(os.sched_getaffinity(0)),
    "plain": sorted(os.sched_getaffinity(tids["plain"])),
    "pinned": sorted(os.sched_getaffinity(tids["pinned"])),
    "first": first,
    "pinned_to": sorted(pinned_to),
}
done.set(); plain.join(); pinned.join()
# A thread started after binding inherits it.
late = {}
t = threading.Thread(target=lambda: late.update(cpus=sorted(os.sched_getaffinity(0))))
t.start(); t.join()
result["late"] = late["cpus"]
print(json.dumps(result))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to see a binding")
def test_binds_main_and_existing_threads_but_not_pinned_ones() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["main"] == [result["first"]]
    assert result["plain"] == [result["first"]]
    assert result["pinned"] == result["pinned_to"]  # pinned on purpose: left alone
    assert result["late"] == [result["first"]]


def test_exec_keeps_the_binding() -> None:
    """Command entrypoints: bound between fork and exec, the new program runs on those CPUs."""
    cpu = min(os.sched_getaffinity(0))
    code = (
        "import os, sys\n"
        "from launcher.numa import apply_affinity\n"
        f"apply_affinity(frozenset({{{cpu}}}))\n"
        "show = 'import os; print(sorted(os.sched_getaffinity(0)))'\n"
        "os.execv(sys.executable, [sys.executable, '-c', show])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[{cpu}]"


def test_empty_set_is_refused() -> None:
    with pytest.raises(ValueError):
        apply_affinity(frozenset())
