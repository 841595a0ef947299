"""Two lanes for pytest-xdist (``pytest -n 2 --dist loadgroup``, tox's py3 run).

Most tests must not run beside each other: many bind fixed ports in the root network namespace
(a single-node job's default store on 29500, torchrun's own), and some start session-wide
servers (a Slurm cluster). Those all make one group, run by one worker in collection order, as
without xdist. The tests in :data:`NAMESPACED` run every process of theirs inside network
namespaces of their own (their own ports, addresses and routes, named after the pid that made
them) and in temporary directories of their own, so they cannot collide with anything: they
run one by one on the other worker, and on both once the first lane is done. They are also the
tests that spend most of their time waiting for heartbeat, join and barrier timeouts.

pytest-xdist's own ``loadgroup`` reads ``xdist_group`` marks by rewriting item node ids, which
pytest 9 no longer honours; this scheduler groups by node id on the controller instead.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

#: Node-id prefixes of the tests that may run beside any other test: those in network namespaces
#: of their own, and those whose every job is ``--standalone`` (a free port of its own, private
#: temporary directories and a control socket named after the job's own token).
NAMESPACED = ("tests/multinode/", "tests/store/test_admission.py::", "tests/recovery/", "tests/stragglers/",
              "tests/status/test_slow_ranks.py::")
#: The scope of every other test.
ROOT_NAMESPACE = "root-namespace"


class TwoLaneScheduling(LoadScopeScheduling):
    """Load-scope scheduling whose scopes are one test each, or the whole root-namespace lane."""

    def _split_scope(self, nodeid: str) -> str:
        return nodeid if nodeid.startswith(NAMESPACED) else ROOT_NAMESPACE
