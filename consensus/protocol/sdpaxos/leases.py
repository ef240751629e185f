"""Read leases (§3.5): the sequencer answers reads alone while a majority promised not to
elect anyone else.

A follower that grants the sequencer of its view a lease (answering its heartbeat's
``lease_request``) votes for no other candidate until the lease expires (``may_vote_for``);
the sequencer counts a grant valid for ``lease_us`` shortened by twice the clocks' drift
bound, from when it *asked* (so the grant's travel time is on the safe side), and serves
reads while it and the grants it holds make a majority (``valid``). A fresh or restarted
replica may have granted a lease it no longer remembers: it votes for nobody, itself
included, for one lease period after it starts (``start``).

Pure state, tested alone (tests/protocol/sdpaxos/test_leases.py); election.py and reads.py
use it.
"""

from __future__ import annotations

__all__ = ["Leases"]


class Leases:
    """The lease this replica granted, and the grants it holds as sequencer."""

    __slots__ = ("_held", "_hold_us", "_lease_us", "_votes_blocked_until", "granted_to",
                 "granted_until")

    def __init__(self, lease_us: int, max_drift_ppm: int) -> None:
        self._lease_us = lease_us
        drift = max_drift_ppm / 1_000_000
        self._hold_us = int(lease_us * (1 - 2 * drift))
        self._votes_blocked_until = 0
        self.granted_to: int | None = None  # (None: no lease granted yet)
        self.granted_until = 0
        #: grantor -> until when its grant counts (as the sequencer measures time)
        self._held: dict[int, int] = {}

    def start(self, now: int) -> None:
        """This incarnation starts at ``now``: any lease it granted before is forgotten, so
        it votes for nobody until such a lease would have expired."""
        self._votes_blocked_until = now + self._lease_us

    def grant(self, to: int, now: int) -> None:
        self.granted_to = to
        self.granted_until = now + self._lease_us

    def may_vote_for(self, candidate: int, now: int) -> bool:
        if now < self._votes_blocked_until:
            return False
        bound = self.granted_to not in (None, candidate)
        return not (bound and now < self.granted_until)

    def record_grant(self, grantor: int, asked_at: int) -> None:
        """As sequencer: ``grantor`` granted the lease we asked for at ``asked_at``."""
        until = asked_at + self._hold_us
        self._held[grantor] = max(self._held.get(grantor, 0), until)

    def drop_held(self) -> None:
        """A new view: grants held for the old one count no more."""
        self._held.clear()

    def valid(self, now: int, quorum: int) -> bool:
        """We (the sequencer) and the unexpired grants we hold make a majority."""
        holders = 1 + sum(1 for until in self._held.values() if until > now)
        return holders >= quorum
