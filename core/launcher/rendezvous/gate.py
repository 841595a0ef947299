"""Who may use a store this node serves, round by round (see docs/store-security.md).

While a round is open, the site's policy applies (``--rdzv-conf join_networks`` and
``secret_file``; anyone when neither is set). Once a round is closed, the store serves only its
participants' addresses (and those of earlier rounds' participants: a node stays admitted for
the job's life once it took part), this host and loopback: :class:`StoreGate` calls
:meth:`~launcher.store.server.StoreServer.restrict_to` when this node reads that a round was
sealed, and lifts the restriction when this node takes part in a newer round. An agent that
arrives while the job runs then either proves the shared secret (when one is configured) and
joins as a late node, or is refused; a refused agent that the site policy would admit to an open
round is announced as a node waiting to join (:meth:`StoreGate.new_joiners`: the host takes a
join index of the closed round for it), so that a job with room for it starts a new round that
admits it.

:func:`member_addresses` turns a round's participants' addresses into IP addresses, for this
gate and for the workers' store of each round (:mod:`~launcher.rendezvous.workers_store`).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from launcher.store.admission import Admission, resolve_addresses

if TYPE_CHECKING:  # pragma: no cover
    from launcher.store.server import StoreServer

__all__ = ["StoreGate", "member_addresses"]

log = logging.getLogger("launcher.rendezvous")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


def member_addresses(addresses: Sequence[Sequence[str]], run_id: str, what: str) -> list[str] | None:
    """The IP addresses to admit for participants with these ``addresses`` (each: announced
    address, then the one its store connection came from); ``None`` when one participant has
    no usable address, after a warning naming it (``what``, e.g. "the workers' store", then
    admits every address, rather than break the job).

    IP literals are taken as they are; a name is resolved only for a participant with no IP
    literal (launcher's own store client always gives one), so a large round costs no DNS
    lookups.
    """
    result: set[str] = set()
    for entry in addresses:
        literals = [a.strip().strip("[]").split("%", 1)[0] for a in entry if _is_ip(a)]
        if literals:
            result.update(literals)
            continue
        resolved: set[str] = set()
        for name in entry:
            try:
                resolved.update(str(ip) for ip in resolve_addresses([name]))
            except ValueError:
                continue
        if not resolved:
            log.warning(
                "rendezvous %r: cannot resolve the address of participant %s; %s admits every address "
                "in this round",
                run_id,
                "/".join(entry) or "(none given)",
                what,
            )
            return None
        result.update(resolved)
    return sorted(result)


class StoreGate:
    """Restricts ``server`` to each closed round's participants; ``admission`` is the site's
    policy for open rounds (``None``: anyone may connect)."""

    def __init__(self, server: StoreServer, admission: Admission | None, run_id: str) -> None:
        self._server = server
        self._secret = admission is not None and admission.secret is not None
        self._run_id = run_id
        #: The round the store is restricted to, or ``None`` while a round is open.
        self.restricted: int | None = None
        self._announced: frozenset[Any] = frozenset()  # refused joiners already counted
        #: Addresses of every participant of every sealed round so far: a node stays admitted for
        #: the job's life once it took part, so one that is late for a new round (still stopping
        #: its workers when the round sealed without it) can still reach the store to join the next.
        self._members: set[str] = set()

    def round_opened(self, r: int) -> None:
        """This node takes part in round ``r`` (open): lift a restriction from an older round."""
        if self.restricted is not None and r > self.restricted:
            self._server.restrict_to(None)
            self.restricted = None
            self._announced = frozenset()
            log.debug("rendezvous %r: round %d is open; the store admits joining agents again", self._run_id, r)

    def round_sealed(self, r: int, addresses: Sequence[Sequence[str]]) -> None:
        """Round ``r`` closed with participants at ``addresses``: serve only them from now on."""
        if self.restricted is not None and self.restricted >= r:
            return
        if not addresses:
            return  # a closer that named no participant: nothing sensible to restrict to
        ips = member_addresses(addresses, self._run_id, "the rendezvous store")
        if ips is None:
            return
        self._members.update(ips)
        # With a secret, an agent proving it may still ask to join (a late node of this round).
        self._server.restrict_to(sorted(self._members), authenticated_joiners=True)
        self.restricted = r
        self._announced = frozenset()
        log.debug("rendezvous %r: round %d closed; the store serves only the job's nodes %s", self._run_id, r,
                  ", ".join(sorted(self._members)))

    def new_joiners(self) -> int:
        """Agents refused lately only because the round is closed, that the site policy would
        admit to an open round, and that this method has not returned yet for this round (0
        when a secret is configured: joiners prove it and take a join index themselves)."""
        if self.restricted is None or self._secret:
            return 0
        knocking = self._server.knocking() - self._announced
        self._announced |= knocking
        return len(knocking)
