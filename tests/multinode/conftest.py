"""Fixtures for multi-node tests: namespace hosts, and real agents running inside them.

The whole directory is skipped, with the reason, where namespaces cannot be built (not root, no
``ip``, no CAP_NET_ADMIN) or torch is missing (the workers need gloo).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.multinode.harness import AgentProcess, agent_env
from tests.multinode.netns import Host, Network, cleanup_stale, unavailable_reason


@pytest.fixture(scope="session", autouse=True)
def _namespaces_usable() -> None:
    reason = unavailable_reason()
    if reason is None and importlib.util.find_spec("torch") is None:
        reason = "multi-node tests need torch (the workers use gloo)"
    if reason is not None:
        pytest.skip(reason)
    # Namespaces of earlier runs that crashed or were killed (their pid is gone).
    cleanup_stale()


@pytest.fixture
def make_network() -> Iterator[Callable[..., Network]]:
    """``make_network(n, ipv4=True, ipv6=False)``: n hosts on a private bridge, destroyed after the test."""
    networks: list[Network] = []

    def _make(n: int, *, ipv4: bool = True, ipv6: bool = False) -> Network:
        network = Network(n, ipv4=ipv4, ipv6=ipv6)
        networks.append(network)
        network.create()
        return network

    try:
        yield _make
    finally:
        for network in reversed(networks):
            network.destroy()


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    """``start_agent(host, args, name=None, env=None, program=("-m", "launcher"))``: ``launcher ARGS``
    inside ``host`` (``python PROGRAM ARGS``).

    Output goes to ``tmp_path/<name>.stdout|stderr``. Agents still running at the end are killed
    (and their networks' destroy kills whatever they left inside the namespace).
    """
    agents: list[AgentProcess] = []
    log_dir = tmp_path / "agents"
    log_dir.mkdir()

    def _start(host: Host, args: Sequence[str], name: str | None = None,
               env: dict[str, str] | None = None, program: Sequence[str] = ("-m", "launcher")) -> AgentProcess:
        agent = AgentProcess(host, name or f"{host.name}-{len(agents)}", args, log_dir, agent_env(host, env),
                             program)
        agents.append(agent)
        return agent

    try:
        yield _start
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.host.kill_all()
                agent.kill()
