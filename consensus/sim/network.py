"""The simulated network: per-link delays, loss, duplication, reordering and partitions.

Frames on a link arrive in order (FIFO, like TCP) unless reordering is switched on, in which
case a frame may get an extra random delay and overtake later ones. ``blocked`` holds the
directed links currently cut: a symmetric partition cuts both directions, an asymmetric one a
single direction.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["LinkFaults", "Network"]


@dataclass(frozen=True, slots=True)
class LinkFaults:
    loss: float = 0.0  # probability a frame is dropped
    duplicate: float = 0.0  # probability a frame is delivered twice
    reorder: float = 0.0  # probability a frame gets extra delay (and may overtake others)
    reorder_us: int = 0  # the largest extra delay
    jitter_us: int = 0  # uniform extra delay on every frame (keeps FIFO unless reordering)


class Network:
    def __init__(
        self, one_way_us: list[list[int]], rng: random.Random, faults: LinkFaults
    ) -> None:
        self.one_way_us = one_way_us
        self.rng = rng
        self.faults = faults
        self.blocked: set[tuple[int, int]] = set()
        self._last_arrival: dict[tuple[int, int], int] = {}

    def arrivals(self, src: int, dst: int, now: int) -> list[int]:
        """When the frame ``src`` sends ``dst`` at ``now`` arrives (empty: lost or cut)."""
        if (src, dst) in self.blocked:
            return []
        f, rng = self.faults, self.rng
        if f.loss and rng.random() < f.loss:
            return []
        copies = 2 if f.duplicate and rng.random() < f.duplicate else 1
        times = []
        for _ in range(copies):
            at = now + self.one_way_us[src][dst]
            if f.jitter_us:
                at += rng.randrange(f.jitter_us + 1)
            if f.reorder and rng.random() < f.reorder:
                at += rng.randrange(f.reorder_us + 1)
            else:
                at = max(at, self._last_arrival.get((src, dst), 0))  # FIFO
                self._last_arrival[(src, dst)] = at
            times.append(at)
        return times

    # ------------------------------------------------------------------ partitions
    def heal(self) -> None:
        self.blocked.clear()

    def cut(self, src: int, dst: int) -> None:
        self.blocked.add((src, dst))

    def isolate(self, replica: int, n: int) -> None:
        for other in range(n):
            if other != replica:
                self.blocked.add((replica, other))
                self.blocked.add((other, replica))

    def split(self, side: set[int], n: int) -> None:
        """Cut every link between ``side`` and the rest, both ways."""
        for a in side:
            for b in range(n):
                if b not in side:
                    self.blocked.add((a, b))
                    self.blocked.add((b, a))
