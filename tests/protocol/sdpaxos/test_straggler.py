"""Straggler detection (straggler.py, §4): a sequencer alive but too slow to order is suspected
and replaced; ``OrderingWindow`` alone.
"""

from __future__ import annotations

import pytest
from util import cmd, core, drain, msgs

from consensus.messages import Heartbeat, LeaseGrant, PeerMessage, PreVote, Suspect
from consensus.protocol.sdpaxos import Role, SDPaxosReplica
from consensus.protocol.sdpaxos.straggler import ORDER_LAG_FACTOR, WAIT_SAMPLES, OrderingWindow

from .builders import cack, oaccept, oack

# ====================================================================== a replica under steady load


def _steady_load(c_wait_ms: int, o_wait_ms: int, *, seconds: float = 3.0,
                 healed_at_ms: int | None = None,
                 **config: object) -> tuple[SDPaxosReplica, list[tuple[int, int, Suspect]]]:
    """Replica 1 of three leads a command every 5 ms, as closed-loop clients would at the
    pace the cluster allows; its C-phase takes ``c_wait_ms`` and its order ``o_wait_ms``
    (``c_wait_ms`` too from ``healed_at_ms`` on). Returns the core and every Suspect it sent
    (time in ms, destination, message)."""
    r1 = core(3, 1, straggler_cooldown_us=0, election_timeout_us=10_000_000, **config)
    due: dict[int, list[PeerMessage]] = {}
    suspects = []
    index = 0
    for ms in range(int(seconds * 1000)):
        now = ms * 1000
        if ms % 5 == 0:
            r1.propose(cmd(7, index), now)
            due.setdefault(ms + c_wait_ms, []).append(cack(2, 1, index))
            healed = healed_at_ms is not None and ms >= healed_at_ms
            # the sequencer's OAccept and its own OAck, sent once its acceptance is durable
            due.setdefault(ms + (c_wait_ms if healed else o_wait_ms), []).extend(
                (oaccept((index, 1)), oack(0, index))
            )
            index += 1
        for message in due.pop(ms, []):
            r1.step(message, now)
        r1.tick(now)
        ready = drain(r1)
        suspects += [(ms, to, m) for to, m in msgs(ready.send_after_persist, Suspect)]
    return r1, suspects


def test_a_sequencer_ordering_far_slower_than_the_c_phase_is_suspected() -> None:
    # the sequencer orders 40 ms after the C-phase took 1 ms, steadily: demand never
    # outruns supply by 2x (closed loop), only the waits show the straggler
    r1, suspects = _steady_load(1, 40)
    assert suspects, "a lagging sequencer went unsuspected"
    first = suspects[0][0]
    # three slow 500 ms windows in a row, the first one from start-up
    assert 1500 <= first < 2000
    assert {(to, m) for ms, to, m in suspects if ms == first} == {
        (0, Suspect(src=1, view=0)), (2, Suspect(src=1, view=0))}
    # said again every window while it lasts (a lost Suspect must not leave it alone)
    assert sorted({ms for ms, _, _ in suspects}) == list(range(first, 3000, 500))
    # alone it changes nothing; with replica 2 agreeing (a majority) it stops renewing the
    # lease and runs for the sequencer once the lease has lapsed (plus a random part of half
    # the election timeout, 10 s here)
    r1.step(Suspect(src=2, view=0), first * 1000 + 1)
    drain(r1)
    for ms in range(first + 1, first + 6000):
        r1.tick(ms * 1000)
        if msgs(drain(r1).send, PreVote) or r1.role is not Role.FOLLOWER:
            break
    else:
        raise AssertionError("a majority of suspects did not start an election")


def test_a_suspicion_no_majority_joins_ends_once_ordering_is_good_again() -> None:
    # (N=3 seeds 70, 159, 204, ... at 6 clients per site) both followers suspected the
    # sequencer during partitions, each never heard the other's only Suspect, and they
    # stopped renewing its leases for good: no election followed, and every read stalled.
    r1, suspects = _steady_load(1, 40, seconds=5.0, healed_at_ms=2500)
    first, last = suspects[0][0], suspects[-1][0]
    assert 1500 <= first < 2000 and last < 3000 + 3 * 500
    assert not r1.straggler.suspecting
    r1.step(Heartbeat(src=0, view=0, executed=0, lease_request=5_000_000), 5_000_000)
    assert msgs(drain(r1).send_after_persist, LeaseGrant) == [
        (0, LeaseGrant(src=1, view=0, request=5_000_000))
    ]


@pytest.mark.parametrize(("c_wait_ms", "o_wait_ms"), [
    (1, 1),      # LAN, idle
    (1, 3),      # LAN, the sequencer busier than the rest
    (20, 20),    # paper's WAN, 3 replicas: OR
    (125, 146),  # paper's WAN, 5 replicas: the sites far from the sequencer
])
def test_ordering_in_step_with_the_c_phase_is_never_suspected(
    c_wait_ms: int, o_wait_ms: int
) -> None:
    _, suspects = _steady_load(c_wait_ms, o_wait_ms, seconds=5.0)
    assert suspects == []


def test_detection_can_be_configured_off() -> None:
    _, suspects = _steady_load(1, 40, straggler_windows=0)
    assert suspects == []


# ============================================================== OrderingWindow alone


def test_a_window_is_starved_when_less_than_half_of_what_was_asked_is_ordered() -> None:
    assert OrderingWindow.slow(needed=2, got=0, waits_c=0, waits_o=0)
    assert OrderingWindow.slow(needed=5, got=2, waits_c=0, waits_o=0)
    assert not OrderingWindow.slow(needed=2, got=1, waits_c=0, waits_o=0)  # exactly half
    assert not OrderingWindow.slow(needed=4, got=2, waits_c=0, waits_o=0)
    # a single instance asked for and not ordered yet proves nothing
    assert not OrderingWindow.slow(needed=1, got=0, waits_c=0, waits_o=0)


def test_a_window_is_lagging_when_ordering_waits_far_longer_than_the_c_phase() -> None:
    lag = ORDER_LAG_FACTOR
    assert OrderingWindow.slow(needed=0, got=0, waits_c=5, waits_o=lag * 5 + 1)
    assert not OrderingWindow.slow(needed=0, got=0, waits_c=5, waits_o=lag * 5)
    # too few samples waiting for their order say nothing, however short the C-phase
    assert OrderingWindow.slow(needed=0, got=0, waits_c=0, waits_o=WAIT_SAMPLES)
    assert not OrderingWindow.slow(needed=0, got=0, waits_c=0, waits_o=WAIT_SAMPLES - 1)


def _close_slow(window: OrderingWindow, judged: bool = True) -> None:
    window.needed, window.got = 4, 0
    window.close(judged)


def _close_healthy(window: OrderingWindow, judged: bool = True) -> None:
    window.needed, window.got = 4, 4
    window.close(judged)


def test_samples_accumulate_until_the_window_closes() -> None:
    window = OrderingWindow()
    for _ in range(WAIT_SAMPLES):
        window.sample(in_c_phase=0, unordered=1)
    assert (window.waits_c, window.waits_o) == (0, WAIT_SAMPLES)
    window.close(judged=True)
    assert window.slow_in_row == 1  # lagging
    assert (window.needed, window.got, window.waits_c, window.waits_o) == (0, 0, 0, 0)
    window.sample(in_c_phase=3, unordered=2)
    window.close(judged=True)  # the counts started again from zero: healthy
    assert (window.slow_in_row, window.healthy_in_row) == (0, 1)


def test_streaks_count_slow_and_healthy_windows_in_a_row() -> None:
    window = OrderingWindow()
    for expected in (1, 2, 3):
        _close_slow(window)
        assert (window.slow_in_row, window.healthy_in_row) == (expected, 0)
    _close_healthy(window)
    assert (window.slow_in_row, window.healthy_in_row) == (0, 1)
    _close_healthy(window)
    assert (window.slow_in_row, window.healthy_in_row) == (0, 2)
    _close_slow(window)
    assert (window.slow_in_row, window.healthy_in_row) == (1, 0)


def test_a_window_not_judged_breaks_the_slow_streak_and_leaves_the_healthy_one() -> None:
    window = OrderingWindow()
    _close_slow(window)
    _close_slow(window)
    _close_slow(window, judged=False)  # e.g. we were the sequencer, or a candidate
    assert window.slow_in_row == 0
    assert window.needed == window.got == 0
    _close_healthy(window)
    _close_healthy(window, judged=False)
    assert window.healthy_in_row == 1
    _close_slow(window)
    assert (window.slow_in_row, window.healthy_in_row) == (1, 0)
