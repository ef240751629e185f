"""TODO straggler"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.messages import (
    Suspect,
)
from consensus.protocol.types import Role

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

#: Straggler detection samples its own commands' waits this many times per window ...
WAIT_SAMPLES = 20

#: ... and a window is slow when they waited this many times longer for their order than
#: for their C-phase
ORDER_LAG_FACTOR = 4

#: a peer's suspicion counts for this many straggler windows after its last Suspect
SUSPECT_WINDOWS = 3



class StragglerDetector:
    """TODO"""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        # straggler detection
        self.window_start = 0
        self.window_needed = 0
        self.window_got = 0
        self._wait_c = 0  # samples of own unready instances still in their C-phase
        self._wait_o = 0  # ... and of those not ordered yet
        self._next_wait_sample = 0
        self.slow_windows = 0
        self._healthy_windows = 0  # in a row, while suspecting
        self.suspecting = False
        #: replicas suspecting the sequencer (us included) -> when we last heard so
        self.suspects: dict[int, int] = {}
        self.force_election_at = -1

    def watch_ordering(self) -> None:
        r = self.r
        windows = r.config.straggler_windows
        if windows == 0:
            return
        if r.now >= self._next_wait_sample:
            self._next_wait_sample = r.now + r.config.straggler_window_us // WAIT_SAMPLES
            self._sample_waits()
        if r.now - self.window_start < r.config.straggler_window_us:
            return
        needed, got = self.window_needed, self.window_got
        wait_c, wait_o = self._wait_c, self._wait_o
        self.window_start = r.now
        self.window_needed = self.window_got = self._wait_c = self._wait_o = 0
        if r.is_sequencer or r.role is not Role.FOLLOWER or not r.view_ready:
            self.slow_windows = 0
            return
        # Starved: the sequencer ordered less than half of what we asked for. Lagging: our
        # commands waited far longer for their order than for their C-phase (by Little's law
        # the ratio of the sampled queue lengths is the ratio of the mean waits): with
        # closed-loop clients demand shrinks to a slow sequencer's pace, so only the second
        # shows it. On the paper's WANs ordering takes at most ~1.2x the C-phase.
        starved = needed >= 2 and 2 * got < needed
        lagging = wait_o >= WAIT_SAMPLES and wait_o > ORDER_LAG_FACTOR * max(wait_c, 1)
        slow = starved or lagging
        self.slow_windows = self.slow_windows + 1 if slow else 0
        self._healthy_windows = 0 if slow else self._healthy_windows + 1
        cooled = r.now - r.views.last_view_change_at >= r.config.straggler_cooldown_us
        if self.suspecting:
            if self.force_election_at >= 0:
                return  # a majority agreed: the election is under way
            if self._healthy_windows >= windows:
                # No majority joined, and ordering is fine again: grant leases again. (Kept
                # up, a suspicion whose Suspects were lost stopped every lease renewal and
                # so every read, with no election to follow.)
                self.suspecting = False
                del self.suspects[r.me]
                return
        elif self.slow_windows < windows or not cooled:
            return
        # Suspect, or say so again: a lost Suspect must not leave us suspecting alone
        self.suspecting = True
        self.suspects[r.me] = r.now
        r.broadcast(Suspect(src=r.me, view=r.view))
        self._maybe_replace_straggler()

    def _sample_waits(self) -> None:
        r = self.r
        if not r.unready or r.is_sequencer:
            return
        ordered = r.readiness.ordered_own()
        for index in r.unready:
            if index >= ordered:
                self._wait_o += 1
            inst = r.c.get((r.me, index))
            if inst is None or not inst.committed:
                self._wait_c += 1

    def on_suspect(self, msg: Suspect) -> None:
        r = self.r
        if msg.view == r.view and msg.src != r.sequencer:
            self.suspects[msg.src] = r.now
            self._maybe_replace_straggler()

    def _maybe_replace_straggler(self) -> None:
        # A suspicion is repeated every window while it lasts: one not heard for a few has
        # been withdrawn.
        r = self.r
        since = r.now - SUSPECT_WINDOWS * r.config.straggler_window_us
        agreeing = sum(1 for heard in self.suspects.values() if heard >= since)
        if self.suspecting and agreeing >= r.q and self.force_election_at < 0:
            # Stop renewing the lease (done: we are suspecting); once it lapses, run.
            delay = int(r.rng.random() * r.config.election_timeout_us / 2)
            self.force_election_at = max(r.election.leases.granted_until, r.now) + delay
