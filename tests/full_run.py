"""CI's full run (``tox -e py3``): every test, in two parts that run at the same time.

* The tests that need this host's own network (:data:`ROOT_NETWORK_NEEDS`: a Slurm cluster,
  whose daemons find each other by this host's name and address, the MPI launchers, and the
  tests that look for an address other than loopback): one pytest process, in collection
  order, in the root network namespace.
* Every other test: ``--workers`` pytest-xdist workers, each in a network namespace of its own
  (``--worker-netns``, :mod:`tests.lanes`), modules spread over them. Most of those tests wait
  for heartbeat, join and barrier timeouts, so three workers on two cores finish far sooner than
  two lanes did, while a core stays free often enough for the tests that time what they see.

The first part's output is printed when both are done; the exit status is the first failing
part's. Where network namespaces cannot be made (not root), one pytest runs everything with the
two lanes of :mod:`tests.lanes`, as ``pytest -n 2 --dist loadgroup`` does.

Usage: ``python -m tests.full_run`` (``tox -e py3``). Arguments, if any, go to one plain pytest
instead (``tox -e py3 -- tests/core -q``): the parts are for the whole suite.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

from tests.lanes import private_networks_possible

#: Markers (tests/needs.py) of the tests that must run in the root network namespace.
ROOT_NETWORK_NEEDS = ("slurm", "mpi", "host_network")
#: xdist workers for the tests in network namespaces of their own.
WORKERS = 3
#: pytest's exit status when a selection is empty (a checkout without those tests): not a failure.
NO_TESTS_COLLECTED = 5
#: -rs: why each skipped test skipped; --durations: the slowest 30, to see where CI's time goes.
COMMON = ["-q", "-p", "no:cacheprovider", "-rs", "--durations=30"]


def main(argv: list[str]) -> int:
    """Run the whole suite in its two parts (``argv`` empty), or one pytest with ``argv``; the exit status."""
    if argv:
        return subprocess.call([sys.executable, "-m", "pytest", *argv])
    pytest = [sys.executable, "-m", "pytest", *COMMON]
    if not private_networks_possible():
        return subprocess.call([*pytest, "-n", "2", "--dist", "loadgroup"])
    root_only = " or ".join(ROOT_NETWORK_NEEDS)
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as root_log:
        root_part = subprocess.Popen([*pytest, "-m", root_only], stdout=root_log, stderr=subprocess.STDOUT)
        private = subprocess.call([*pytest, "-m", f"not ({root_only})", "-n", str(WORKERS),
                                   "--dist", "loadgroup", "--worker-netns"])
        root = root_part.wait()
        root_log.seek(0)
        print(f"--- the tests that need the root network namespace ({root_only}), run beside the above "
              f"(done after {time.monotonic() - started:.0f} s in all):", flush=True)
        sys.stdout.write(root_log.read())
    if root == NO_TESTS_COLLECTED:
        root = 0
    return private or root


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
