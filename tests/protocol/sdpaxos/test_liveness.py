"""Liveness bookkeeping alone (liveness.py): ``SilenceTracker`` (when a peer is suspected) and
``RtoEstimator`` (the retransmission timeout, RFC 6298)."""

from __future__ import annotations

from consensus.protocol.sdpaxos.liveness import (
    RTO_CEILING_FACTOR,
    SILENCE_CEILING_FACTOR,
    SILENCE_FACTOR,
    SILENCE_WINDOW_FACTOR,
    RtoEstimator,
    SilenceTracker,
)

TIMEOUT = 300_000
#: the longest silence a peer can teach us (a longer one is a crash, not a slow turn)
CEILING = SILENCE_CEILING_FACTOR * TIMEOUT // SILENCE_FACTOR
WINDOW = SILENCE_WINDOW_FACTOR * TIMEOUT
#: a silence longer than the timeout, learned while the peer was alive
SLOW = TIMEOUT + 100_000
FLOOR = 200_000

# ======================================================================== SilenceTracker


def started(at: int = 0) -> SilenceTracker:
    tracker = SilenceTracker(3, TIMEOUT)
    tracker.start(at)
    return tracker


def test_a_peer_is_suspected_only_once_silent_for_longer_than_the_timeout() -> None:
    tracker = started(1_000)  # every peer counts as just heard at start
    assert not tracker.suspected(1, 1_000 + TIMEOUT)
    assert tracker.suspected(1, 1_000 + TIMEOUT + 1)
    tracker.heard(1, 2_000)
    assert not tracker.suspected(1, 2_000 + TIMEOUT)
    assert tracker.suspected(1, 2_000 + TIMEOUT + 1)
    assert tracker.suspected(2, 2_000 + TIMEOUT)  # peers are tracked apart
    assert tracker.last_heard == [1_000, 2_000, 1_000]


def test_a_peer_that_kept_a_long_silence_is_suspected_only_after_twice_that_silence() -> None:
    tracker = started()
    tracker.heard(1, SLOW)  # alive, after a silence longer than the timeout
    tracker.heard(1, SLOW + 1_000)  # a shorter silence does not replace the longest one
    last = SLOW + 1_000
    assert not tracker.suspected(1, last + TIMEOUT + 1)  # past the timeout, not past 2x
    assert not tracker.suspected(1, last + SILENCE_FACTOR * SLOW)
    assert tracker.suspected(1, last + SILENCE_FACTOR * SLOW + 1)
    # a peer that was never slow is suspected after the timeout alone
    assert tracker.suspected(2, last + TIMEOUT + 1)


def test_a_silence_longer_than_the_ceiling_is_not_learned() -> None:
    tracker = started()
    tracker.heard(1, CEILING + 1)  # a crash and restart: not a slow turn
    assert tracker.suspected(1, CEILING + 1 + TIMEOUT + 1)
    # a silence of exactly the ceiling is learned
    tracker = started()
    tracker.heard(1, CEILING)
    assert not tracker.suspected(1, CEILING + TIMEOUT + 1)
    assert not tracker.suspected(1, CEILING + SILENCE_FACTOR * CEILING)
    assert tracker.suspected(1, CEILING + SILENCE_FACTOR * CEILING + 1)


def test_a_learned_silence_lasts_the_window_and_the_next_one_then_is_forgotten() -> None:
    tracker = started()
    tracker.heard(1, SLOW)
    heard_at = WINDOW - 1
    tracker.heard(1, heard_at)  # a silence above the ceiling: not learned
    tracker.roll(WINDOW - 1)  # the window is not over: nothing moves
    tracker.roll(WINDOW)  # the window that learned SLOW is now the previous one
    assert not tracker.suspected(1, heard_at + SILENCE_FACTOR * SLOW)
    assert tracker.suspected(1, heard_at + SILENCE_FACTOR * SLOW + 1)
    heard_at = 2 * WINDOW - 1
    tracker.heard(1, heard_at)
    tracker.roll(2 * WINDOW - 1)  # windows start at the roll that opened them (WINDOW)
    assert not tracker.suspected(1, heard_at + SILENCE_FACTOR * SLOW)
    tracker.roll(2 * WINDOW)  # two windows later: forgotten
    assert not tracker.suspected(1, heard_at + TIMEOUT)
    assert tracker.suspected(1, heard_at + TIMEOUT + 1)


def test_a_silence_learned_in_the_current_window_counts_at_once() -> None:
    tracker = started()
    tracker.roll(WINDOW)
    tracker.heard(1, WINDOW)  # (a silence above the ceiling: not learned)
    tracker.heard(1, WINDOW + SLOW)  # learned in the current window, none before
    last = WINDOW + SLOW
    assert not tracker.suspected(1, last + SILENCE_FACTOR * SLOW)
    assert tracker.suspected(1, last + SILENCE_FACTOR * SLOW + 1)


# ========================================================================== RtoEstimator


def test_the_timeout_starts_at_the_floor() -> None:
    assert RtoEstimator(FLOOR).timeout_us == FLOOR


def test_the_first_sample_sets_srtt_and_half_of_it_as_rttvar() -> None:
    # RFC 6298 (2.2): SRTT = R, RTTVAR = R/2, RTO = SRTT + 4 * RTTVAR = 3R
    rto = RtoEstimator(FLOOR)
    rto.sample(100_000)
    assert rto.timeout_us == 300_000


def test_later_samples_are_smoothed() -> None:
    # RFC 6298 (2.3): RTTVAR = 3/4 RTTVAR + 1/4 |SRTT - R'|, then SRTT = 7/8 SRTT + 1/8 R'
    rto = RtoEstimator(FLOOR)
    rto.sample(100_000)  # SRTT 100 ms, RTTVAR 50 ms
    rto.sample(200_000)
    rttvar = 50_000 + (100_000 - 50_000) // 4
    srtt = 100_000 + 100_000 // 8
    assert rto.timeout_us == srtt + 4 * rttvar == 362_500
    # one slow sample moves the estimate by a quarter (RTTVAR) and an eighth (SRTT) of the
    # difference, far less than a first sample of it would (3 s, capped at 2 s)
    rto.sample(1_000_000)
    rttvar += (1_000_000 - srtt - rttvar) // 4
    srtt += (1_000_000 - srtt) // 8
    assert rto.timeout_us == srtt + 4 * rttvar == 1_298_437


def test_the_timeout_never_drops_below_the_floor() -> None:
    rto = RtoEstimator(FLOOR)
    rto.sample(1_000)  # 3 ms estimated
    assert rto.timeout_us == FLOOR
    rto = RtoEstimator(FLOOR)
    rto.sample(900_000)  # a loaded cluster ...
    assert rto.timeout_us > FLOOR
    for _ in range(200):  # ... that is fast again comes back down to the floor
        rto.sample(1_000)
    assert rto.timeout_us == FLOOR


def test_the_timeout_never_exceeds_its_ceiling() -> None:
    rto = RtoEstimator(FLOOR)
    rto.sample(RTO_CEILING_FACTOR * FLOOR)  # estimated at three times that
    assert rto.timeout_us == RTO_CEILING_FACTOR * FLOOR
    rto.sample(100 * FLOOR)
    assert rto.timeout_us == RTO_CEILING_FACTOR * FLOOR
