"""C-instance ballots as plain ints: ``(round, replica)`` packed so that ordering is by round,
then replica. Replica ``n`` owns ballot ``(0, n)`` of its own instances (pre-prepared); a
recoverer uses a higher round."""

from __future__ import annotations

__all__ = ["BALLOT_STRIDE", "ballot_of", "ballot_round", "next_ballot"]

#: replicas per cluster are fewer than this
BALLOT_STRIDE = 256


def ballot_of(round_: int, replica: int) -> int:
    return round_ * BALLOT_STRIDE + replica


def ballot_round(ballot: int) -> int:
    return ballot // BALLOT_STRIDE


def next_ballot(seen: int, replica: int) -> int:
    """The smallest ballot of ``replica`` above every ballot seen so far."""
    return ballot_of(ballot_round(seen) + 1, replica)
