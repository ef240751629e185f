"""Failure detection (election.py with liveness.py's ``SilenceTracker``, §3.3): when a silent or
slow peer is suspected, seen through when its instances are first recovered.
"""

from __future__ import annotations

from util import core, drain

from consensus.config import ProtocolConfig
from consensus.messages import CPrepare, Heartbeat
from consensus.protocol.sdpaxos.liveness import (
    SILENCE_CEILING_FACTOR,
    SILENCE_FACTOR,
    SILENCE_WINDOW_FACTOR,
)

from .builders import A, all_out, caccept

# =========================================================================== suspicion


def _first_prepare(owner_speaks: set[int], accepted_at: int, until: int) -> int:
    """Replica 2 of five (the recoverer of replica 1) runs in 50 ms turns until ``until``:
    every other peer heartbeats each turn, replica 1 only at the times in ``owner_speaks``;
    at ``accepted_at`` replica 2 accepts an instance of replica 1 and never learns it chosen.
    When replica 2 first recovers replica 1's instances (-1: never)."""
    r2 = core(5, 2)
    for now in range(TICK_US, until + 1, TICK_US):
        for peer in (0, 1, 3, 4):
            if peer != 1 or now in owner_speaks:
                r2.step(Heartbeat(src=peer, view=0, executed=0, lease_request=-1), now)
        if now == accepted_at:
            r2.step(caccept(1, 1, 0, (A,)), now)
        r2.tick(now)
        if any(m.owner == 1 for _, m in all_out(drain(r2)) if isinstance(m, CPrepare)):
            return now
    return -1


TICK_US = 50_000


TIMEOUT_US = ProtocolConfig(replicas=5).election_timeout_us


def test_a_silent_peer_is_recovered_after_the_election_timeout() -> None:
    last = 1_000_000
    speaks = set(range(TICK_US, last + 1, TICK_US))
    assert _first_prepare(speaks, TICK_US, 3_000_000) == last + TIMEOUT_US + TICK_US


def test_a_peer_slow_but_alive_is_recovered_only_after_twice_its_recent_silences() -> None:
    # past saturation (5 replicas at 0.15 CPU) loop turns stretched to 150-330 ms: replicas
    # were recovered while alive, and their clients were told "recovered without it"
    gap = TIMEOUT_US + 2 * TICK_US  # a message every 400 ms, longer than the timeout
    last = 2_000_000
    speaks = set(range(gap, last + 1, gap))
    assert _first_prepare(speaks, gap, 5_000_000) == last + SILENCE_FACTOR * gap + TICK_US


def test_slow_silences_are_forgotten_after_two_windows_of_regular_messages() -> None:
    gap = TIMEOUT_US + 2 * TICK_US
    slow_until = 2_000_000
    regular_until = slow_until + 2 * SILENCE_WINDOW_FACTOR * TIMEOUT_US + TICK_US
    speaks = set(range(gap, slow_until, gap)) | set(
        range(slow_until, regular_until + 1, TICK_US)
    )
    expected = regular_until + TIMEOUT_US + TICK_US
    assert _first_prepare(speaks, gap, regular_until + 2_000_000) == expected


def test_a_silence_longer_than_slow_turns_explain_is_not_learned() -> None:
    # a crash and restart: the peer is suspected after the usual timeout afterwards
    crash = SILENCE_CEILING_FACTOR * TIMEOUT_US // SILENCE_FACTOR + TICK_US
    back = 1_000_000 + crash
    last = back + 1_000_000
    speaks = set(range(TICK_US, 1_000_000, TICK_US)) | set(range(back, last + 1, TICK_US))
    assert _first_prepare(speaks, back, last + 2_000_000) == last + TIMEOUT_US + TICK_US
