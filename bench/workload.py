"""Workload generators for the process benchmarks: Poisson arrivals, Zipf, uniform and
hot-key (contention) keys, and key-value commands of an exact size.

Everything takes an explicit ``random.Random`` so a ``--seed`` reproduces the request stream.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from consensus.statemachine import kv_get, kv_put

__all__ = [
    "HOT_PREFIX",
    "HotKeys",
    "KeyChooser",
    "PoissonArrivals",
    "UniformKeys",
    "ZipfKeys",
    "key_name",
    "make_put",
    "parse_key_dist",
    "zeta",
]

#: smallest put command ``make_put`` can build (an empty value)
MIN_PUT_BYTES = len(kv_put("k0000000", ""))


def key_name(index: int) -> str:
    """The key of item ``index`` (fixed width, so every put of a size has the same bytes)."""
    return f"k{index:07d}"


def make_put(key: str, size: int) -> bytes:
    """A ``kv_put`` of ``key`` whose encoded command is exactly ``size`` bytes (the paper's
    16 B and 1 KB commands), or the smallest possible if ``size`` is below that."""
    length = max(0, size - MIN_PUT_BYTES)
    op = kv_put(key, "x" * length)
    # msgpack's string header grows at 32 and 256 bytes: step back until the size fits
    while len(op) > size and length > 0:
        length -= 1
        op = kv_put(key, "x" * length)
    return op


def make_get(key: str) -> bytes:
    return kv_get(key)


@dataclass(slots=True)
class PoissonArrivals:
    """Arrival times of a Poisson process of ``rate`` events per second from ``start``:
    exponentially distributed gaps, so arrivals do not wait for answers (open loop)."""

    rate: float
    rng: random.Random
    start: float = 0.0
    _next: float = field(init=False)

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        self._next = self.start + self.rng.expovariate(self.rate)

    def peek(self) -> float:
        """When the next arrival is due."""
        return self._next

    def pop(self) -> float:
        """The next arrival time (and move past it)."""
        due = self._next
        self._next += self.rng.expovariate(self.rate)
        return due

    def until(self, end: float) -> list[float]:
        """Every arrival before ``end`` from the current position."""
        times = []
        while self._next < end:
            times.append(self.pop())
        return times


def zeta(n: int, theta: float) -> float:
    """The generalized harmonic number sum_{i=1..n} 1 / i^theta."""
    return math.fsum(i**-theta for i in range(1, n + 1))


class ZipfKeys:
    """Item indices in ``[0, n)`` with P(i) proportional to 1 / (i + 1)^theta: item 0 is the
    most popular. The sampling method is Gray et al.'s ("Quickly generating billion-record
    synthetic databases", SIGMOD'94), the one YCSB's Zipfian generator uses; theta 0.99 is
    YCSB's default. One uniform draw per sample, O(n) set-up for zeta(n)."""

    def __init__(self, n: int, theta: float, rng: random.Random) -> None:
        if n < 2:
            raise ValueError("a Zipf distribution needs at least 2 items")
        if not 0 < theta < 1:
            raise ValueError(f"theta must be in (0, 1), got {theta}")
        self.n = n
        self.theta = theta
        self.rng = rng
        self.zeta_n = zeta(n, theta)
        zeta_2 = 1 + 0.5**theta
        self._alpha = 1 / (1 - theta)
        self._eta = (1 - (2 / n) ** (1 - theta)) / (1 - zeta_2 / self.zeta_n)
        self._half_pow = 0.5**theta

    def probability(self, index: int) -> float:
        """The exact probability of item ``index``."""
        return float((index + 1) ** -self.theta / self.zeta_n)

    def next(self) -> int:
        u = self.rng.random()
        uz = u * self.zeta_n
        if uz < 1.0:
            return 0
        if uz < 1.0 + self._half_pow:
            return 1
        index = int(self.n * (self._eta * u - self._eta + 1) ** self._alpha)
        return min(index, self.n - 1)


class UniformKeys:
    """Item indices drawn uniformly from ``[0, n)``."""

    def __init__(self, n: int, rng: random.Random) -> None:
        if n < 1:
            raise ValueError("need at least one item")
        self.n = n
        self.rng = rng

    def next(self) -> int:
        return self.rng.randrange(self.n)


class HotKeys:
    """The paper's contention workload (§5.2, Fig. 10): a share ``percent`` of the commands
    touch one hot key (item 0), the others keys drawn uniformly from the rest of ``[1, n)``
    (distinct but for chance collisions, rare with ``n`` far above the commands in flight)."""

    def __init__(self, n: int, percent: float, rng: random.Random) -> None:
        if n < 2:
            raise ValueError("a hot key and the rest need at least 2 items")
        if not 0 <= percent <= 100:
            raise ValueError(f"contention is a percentage (0-100), got {percent}")
        self.n = n
        self.share = percent / 100
        self.rng = rng

    def next(self) -> int:
        if self.rng.random() < self.share:
            return 0
        return 1 + self.rng.randrange(self.n - 1)


KeyChooser = ZipfKeys | UniformKeys | HotKeys

#: ``hot:P`` names the contention distribution with P percent of commands on the hot key
HOT_PREFIX = "hot:"


def parse_key_dist(name: str, n: int, rng: random.Random, theta: float = 0.99) -> KeyChooser:
    if name == "zipf":
        return ZipfKeys(n, theta, rng)
    if name == "uniform":
        return UniformKeys(n, rng)
    if name.startswith(HOT_PREFIX):
        try:
            percent = float(name.removeprefix(HOT_PREFIX))
        except ValueError:
            raise ValueError(f"bad contention in {name!r}: expected hot:PERCENT") from None
        return HotKeys(n, percent, rng)
    raise ValueError(f"unknown key distribution {name!r} (uniform, zipf or hot:PERCENT)")


def sample(chooser: KeyChooser, count: int) -> Sequence[int]:
    """``count`` draws (a pool the load generator cycles through)."""
    return [chooser.next() for _ in range(count)]
