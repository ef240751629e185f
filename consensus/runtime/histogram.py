"""Fixed-bucket histograms of durations: what ``/metrics`` exposes as Prometheus histograms.

Observing is O(log buckets) and memory is O(buckets) however many samples come (the node used
to keep every latency in a list, capped at a million samples and then frozen, and rendering it
walked the whole list on the event loop). Rendering is O(buckets). Percentiles are estimated
from the buckets (``quantile``), as Prometheus' ``histogram_quantile`` does; the benchmarks,
which want exact percentiles, keep their own HdrHistograms (``bench.loadgen``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Final

__all__ = ["DURATION_BUCKETS_S", "Histogram"]

#: upper bounds (seconds) of the buckets of every duration histogram of a replica: 25 µs
#: (a page-cache write, a loop turn of an idle replica) doubling to about 13 s (an fsync on a
#: saturated disk, a command waiting out a view change); 20 buckets
DURATION_BUCKETS_S: Final[tuple[float, ...]] = tuple(25e-6 * 2**k for k in range(20))


class Histogram:
    """Counts of observations per bucket (``bounds``: increasing upper bounds, the last
    bucket, +Inf, implied), their sum and their count."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = DURATION_BUCKETS_S) -> None:
        if not bounds or any(b >= a for a, b in zip(bounds[1:], bounds, strict=False)):
            raise ValueError(f"bucket bounds must be non-empty and increasing, got {bounds!r}")
        self.bounds = tuple(bounds)
        #: per bucket, observations <= its bound and > the previous one; the last: +Inf
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound counts in that bound's bucket (le = "<=")
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def observe_many(self, value: float, times: int) -> None:
        """``observe(value)`` ``times`` times, at the cost of one (the sum may differ from
        ``times`` additions in its last bits: it is the exact product, rounded once)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.sum += value * times
        self.count += times

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= it)`` per bucket, +Inf last (Prometheus' ``le``)."""
        result: list[tuple[float, int]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            result.append((bound, running))
        return result

    def quantile(self, q: float) -> float:
        """An estimate of the ``q``-quantile (0 <= q <= 1): linear within the bucket holding
        it; the last finite bound if it lies in +Inf; 0.0 without observations."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        if self.count == 0:
            return 0.0
        rank = q * self.count
        below = 0
        lower = 0.0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            if count and below + count >= rank:
                return lower + (bound - lower) * (rank - below) / count
            below += count
            lower = bound
        return self.bounds[-1]
