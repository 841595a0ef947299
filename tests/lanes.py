"""Two lanes for pytest-xdist (``pytest -n 2 --dist loadgroup``: the full run where network
namespaces cannot be made, see tests/full_run.py).

With ``--worker-netns`` (the fast lane), where network namespaces can be made (root), every worker
first moves into one of its own, so fixed ports cannot collide between workers: then any module
may run beside any other (:class:`PrivateNetworkScheduling`); the fast lane starts no session-wide
server. Elsewhere the option changes nothing.

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

import ctypes
import functools
import os
import shutil
import subprocess

import pytest
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


class PrivateNetworkScheduling(LoadScopeScheduling):
    """Load-scope scheduling by module: each worker has a network namespace of its own."""

    def _split_scope(self, nodeid: str) -> str:
        # The module: xdist's own split (at the last "::") cut test ids whose parameters hold "::"
        # (the bad-input corpus' "--master-addr :::") into scopes of their own, each of which ran
        # that module's fixtures again on another worker (the corpus: 10-18 s each, four times).
        return module_of(nodeid)


def module_of(nodeid: str) -> str:
    """The module part of a test id (everything before its first ``::``)."""
    return nodeid.split("::", 1)[0]


@functools.cache
def private_networks_possible() -> bool:
    """Whether this process may make network namespaces (root with CAP_SYS_ADMIN, ``ip`` installed)."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30)
    return probe.returncode == 0


def enter_private_network() -> None:
    """Move this process (its main thread, and whatever it starts from now on) into a new network
    namespace with its loopback up. Needs root; raises OSError otherwise."""
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newnet = 0x40000000
    if libc.unshare(clone_newnet) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare(CLONE_NEWNET): {os.strerror(errno)}")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, capture_output=True, timeout=30)


def slowest_modules_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` (in place) so that the modules with the most tests of a slow need
    (:data:`tests.needs.SLOW_NEEDS`: network namespaces, servers, jobs of torch workers) come first,
    each module's tests kept together and in their order.

    :class:`PrivateNetworkScheduling` hands modules out in collection order: a two-minute module
    of multi-node tests handed out last kept one worker busy while the others idled (the longest
    jobs first leaves the short ones to fill the gaps at the end).
    """
    from tests.needs import SLOW_NEEDS

    slow: dict[str, int] = {}
    for item in items:
        module = module_of(item.nodeid)
        slow[module] = slow.get(module, 0) + any(item.get_closest_marker(need) for need in SLOW_NEEDS)
    first_seen = {module: position for position, module in enumerate(slow)}

    def rank(item: pytest.Item) -> tuple[int, int]:
        module = module_of(item.nodeid)
        return -slow[module], first_seen[module]

    items.sort(key=rank)
