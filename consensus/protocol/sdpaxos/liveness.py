"""Liveness bookkeeping: when a peer counts as failed, and when to send a message again.

Two small pure objects, each tested alone (tests/protocol/sdpaxos/test_liveness.py):

``SilenceTracker`` (failure suspicion, §3.3). A peer is *suspected* once it has been silent
for longer than the election timeout and than ``SILENCE_FACTOR`` times the longest silence it
kept recently while alive. Why the second bound: past saturation a CPU-starved replica's
loop turns stretch towards the election timeout; suspected while alive, its clients'
commands were recovered as no-ops, and the recoveries' Prepares and promises (carrying the
values again) slowed everyone further. Learned silences are capped at
``SILENCE_CEILING_FACTOR`` timeouts (a longer one is a crash, not a slow turn), so a crashed
peer is still suspected after the usual timeout unless it was that slow just before.
"Recently" is the current window of ``SILENCE_WINDOW_FACTOR`` timeouts or the one before.

``RtoEstimator`` (retransmission). RFC 6298's estimator over how long our C-instances take
to be chosen, floored at the configured ``retransmit_us`` and capped at
``RTO_CEILING_FACTOR`` times it. Under load a sample includes the peers' queues:
retransmitting sooner only duplicates what is queued (in a saturated cluster up to half the
bytes sent were such copies). Karn's rule (only instances sent once are sampled) is the
caller's (``CPhase``).
"""

from __future__ import annotations

__all__ = [
    "RTO_CEILING_FACTOR",
    "SILENCE_CEILING_FACTOR",
    "SILENCE_FACTOR",
    "SILENCE_WINDOW_FACTOR",
    "RtoEstimator",
    "SilenceTracker",
]

#: suspected after this many times a peer's longest recent silence (if above the timeout)
SILENCE_FACTOR = 2
#: learned silences stay below this many election timeouts (over SILENCE_FACTOR)
SILENCE_CEILING_FACTOR = 4
#: "recently": in this window of election timeouts or the one before
SILENCE_WINDOW_FACTOR = 8
#: the adaptive retransmission timeout never exceeds this many times its floor
RTO_CEILING_FACTOR = 10


class SilenceTracker:
    """When each peer was last heard, and the longest silences it kept while alive."""

    __slots__ = (
        "_before", "_ceiling", "_now", "_timeout", "_window_at", "_window_us", "last_heard"
    )

    def __init__(self, replicas: int, election_timeout_us: int) -> None:
        self._timeout = election_timeout_us
        self.last_heard = [0] * replicas
        # the longest silence of each peer in the current and in the previous window
        self._now = [0] * replicas
        self._before = [0] * replicas
        self._window_at = 0
        self._window_us = SILENCE_WINDOW_FACTOR * election_timeout_us
        self._ceiling = SILENCE_CEILING_FACTOR * election_timeout_us // SILENCE_FACTOR

    def start(self, now: int) -> None:
        """Start counting at ``now``: every peer counts as just heard."""
        for replica in range(len(self.last_heard)):
            self.last_heard[replica] = now
        self._window_at = now

    def heard(self, replica: int, now: int) -> None:
        """A message from ``replica`` arrived at ``now``."""
        silence = now - self.last_heard[replica]
        if silence > self._now[replica] and silence <= self._ceiling:
            self._now[replica] = silence  # longer: a crash, not a slow turn
        self.last_heard[replica] = now

    def roll(self, now: int) -> None:
        """Start a new window once the current one is over."""
        if now - self._window_at >= self._window_us:
            self._before = self._now
            self._now = [0] * len(self.last_heard)
            self._window_at = now

    def suspected(self, replica: int, now: int) -> bool:
        """Silent for longer than the election timeout and than it was recently while
        alive (see ``SILENCE_FACTOR``)."""
        silence = now - self.last_heard[replica]
        if silence <= self._timeout:
            return False
        recent = max(self._now[replica], self._before[replica])
        return silence > SILENCE_FACTOR * recent


class RtoEstimator:
    """The retransmission timeout, adapted to sampled round trips (RFC 6298)."""

    __slots__ = ("_floor", "_rttvar_us", "_srtt_us", "timeout_us")

    def __init__(self, floor_us: int) -> None:
        self._floor = floor_us
        self._srtt_us = 0
        self._rttvar_us = 0
        self.timeout_us = floor_us

    def sample(self, sample_us: int) -> None:
        """Something sent once was answered ``sample_us`` after it left."""
        if self._srtt_us == 0:
            self._srtt_us, self._rttvar_us = sample_us, sample_us // 2
        else:
            self._rttvar_us += (abs(self._srtt_us - sample_us) - self._rttvar_us) // 4
            self._srtt_us += (sample_us - self._srtt_us) // 8
        estimate = self._srtt_us + 4 * self._rttvar_us
        self.timeout_us = min(max(self._floor, estimate), RTO_CEILING_FACTOR * self._floor)
