"""Straggler detection (§4): replace a sequencer that is alive but too slow to order.

A slow sequencer is not a failed one: heartbeats keep coming, so the failure detector never
fires, yet every command waits for its order. Each follower judges the ordering of its own
commands once per ``straggler_window_us`` (``OrderingWindow``):

* *starved*: the sequencer ordered less than half of the instances we asked it to;
* *lagging*: our commands waited more than ``ORDER_LAG_FACTOR`` times longer for their order
  than for their C-phase. By Little's law the ratio of the sampled queue lengths
  (``WAIT_SAMPLES`` samples a window) is the ratio of the mean waits. With closed-loop
  clients demand shrinks to a slow sequencer's pace, so only this one shows it; on the
  paper's WANs ordering takes at most ~1.2x the C-phase.

After ``straggler_windows`` slow windows in a row (and not within ``straggler_cooldown_us``
of a view change) a follower *suspects* the sequencer: it tells the others (``Suspect``,
repeated every window while it suspects, so a lost one does not leave it alone) and stops
renewing the sequencer's lease (election.py). Once a majority suspects (each suspicion counts
for ``SUSPECT_WINDOWS`` windows after it was last heard), it runs for the next view as soon
as the lease it granted lapses, after a random delay (``force_election_at``, read by
``Election.detect_failures``). Without a majority, ``straggler_windows`` healthy windows end
the suspicion (kept up, it stopped every lease renewal and so every read, with no election
to follow). A view change ends every suspicion (``on_view_joined``).

Entry points: ``watch_ordering`` (every tick), ``on_suspect``, ``on_view_joined``;
``OrderingWindow`` is pure and tested alone (tests/protocol/sdpaxos/test_straggler.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.messages import Suspect
from consensus.protocol.types import Role

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["ORDER_LAG_FACTOR", "SUSPECT_WINDOWS", "WAIT_SAMPLES",
           "OrderingWindow", "StragglerDetector"]

#: Straggler detection samples its own commands' waits this many times per window ...
WAIT_SAMPLES = 20
#: ... and a window is slow when they waited this many times longer for their order than
#: for their C-phase
ORDER_LAG_FACTOR = 4
#: a peer's suspicion counts for this many straggler windows after its last Suspect
SUSPECT_WINDOWS = 3


class OrderingWindow:
    """What the current window saw of our own commands' ordering, and the streaks of slow
    and healthy windows before it."""

    __slots__ = ("got", "healthy_in_row", "needed", "slow_in_row", "waits_c", "waits_o")

    def __init__(self) -> None:
        self.needed = 0  # own instances proposed this window
        self.got = 0  # own O-instances accepted this window
        self.waits_c = 0  # samples of own unready instances still in their C-phase
        self.waits_o = 0  # ... and of those not ordered yet
        self.slow_in_row = 0
        self.healthy_in_row = 0  # (counts while we suspect)

    def sample(self, in_c_phase: int, unordered: int) -> None:
        self.waits_c += in_c_phase
        self.waits_o += unordered

    @staticmethod
    def slow(needed: int, got: int, waits_c: int, waits_o: int) -> bool:
        starved = needed >= 2 and 2 * got < needed
        lagging = waits_o >= WAIT_SAMPLES and waits_o > ORDER_LAG_FACTOR * max(waits_c, 1)
        return starved or lagging

    def close(self, judged: bool) -> None:
        """End the window; count it as slow or healthy if ``judged`` (we follow a serving
        sequencer), else break the slow streak."""
        slow = self.slow(self.needed, self.got, self.waits_c, self.waits_o)
        self.needed = self.got = self.waits_c = self.waits_o = 0
        if not judged:
            self.slow_in_row = 0
            return
        self.slow_in_row = self.slow_in_row + 1 if slow else 0
        self.healthy_in_row = 0 if slow else self.healthy_in_row + 1


class StragglerDetector:
    """Judges the sequencer's ordering and runs the suspicion protocol."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        self.window = OrderingWindow()
        self.window_start = 0
        self._next_wait_sample = 0
        self.suspecting = False
        #: replicas suspecting the sequencer (us included) -> when we last heard so
        self.suspects: dict[int, int] = {}
        self.force_election_at: int | None = None  # when to run (a majority agreed)

    def start(self, now: int) -> None:
        """The first input of this incarnation: the first window starts."""
        self.window_start = now

    def note_proposed(self) -> None:
        """We proposed an own instance (the sequencer is to order it)."""
        self.window.needed += 1

    def note_ordered(self) -> None:
        """We accepted an O-instance placing one of our own instances."""
        self.window.got += 1

    def on_view_joined(self) -> None:
        """A new view: every suspicion of the old sequencer ends."""
        self.suspects.clear()
        self.suspecting = False
        self.window.slow_in_row = 0
        self.force_election_at = None

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
        self.window_start = r.now
        judged = not r.is_sequencer and r.role is Role.FOLLOWER and r.view_ready
        self.window.close(judged)
        if not judged:
            return
        cooled = r.now - r.views.last_view_change_at >= r.config.straggler_cooldown_us
        if self.suspecting:
            if self.force_election_at is not None:
                return  # a majority agreed: the election is under way
            if self.window.healthy_in_row >= windows:
                self.suspecting = False  # no majority joined, and ordering is fine again
                del self.suspects[r.me]
                return
        elif self.window.slow_in_row < windows or not cooled:
            return
        # Suspect, or say so again: a lost Suspect must not leave us suspecting alone
        self.suspecting = True
        self.suspects[r.me] = r.now
        r.broadcast(Suspect(src=r.me, view=r.view))
        self._maybe_replace_straggler()

    def _sample_waits(self) -> None:
        r = self.r
        if not r.proposals.pending or r.is_sequencer:
            return
        ordered = r.readiness.ordered_own()
        unordered = in_c_phase = 0
        for index in r.proposals.pending:
            if index >= ordered:
                unordered += 1
            inst = r.c_store.instances.get((r.me, index))
            if inst is None or not inst.committed:
                in_c_phase += 1
        self.window.sample(in_c_phase, unordered)

    def on_suspect(self, msg: Suspect) -> None:
        r = self.r
        if msg.view == r.view and msg.src != r.sequencer:
            self.suspects[msg.src] = r.now
            self._maybe_replace_straggler()

    def _maybe_replace_straggler(self) -> None:
        r = self.r
        # A suspicion is repeated every window while it lasts: one not heard for a few has
        # been withdrawn.
        since = r.now - SUSPECT_WINDOWS * r.config.straggler_window_us
        agreeing = sum(1 for heard in self.suspects.values() if heard >= since)
        if self.suspecting and agreeing >= r.q and self.force_election_at is None:
            # Stop renewing the lease (done: we are suspecting); once it lapses, run.
            delay = int(r.rng.random() * r.config.election_timeout_us / 2)
            self.force_election_at = max(r.election.leases.granted_until, r.now) + delay
