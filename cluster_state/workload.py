"""Synthetic scheduler workloads: gang jobs of mixed sizes and priorities.

Used by ``sdpaxos demo``, the compose demo's schedulers and the end-to-end benchmark, so the
same job mix is measured everywhere. Deterministic for a given ``random.Random``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["JobSpec", "next_job"]

#: (pods, GPUs per pod) shapes of a gang, with relative weights: mostly small jobs, a few
#: multi-node gangs, and gangs whose members differ in size
SHAPES: tuple[tuple[tuple[tuple[int, int], ...], int], ...] = (
    (((1, 1),), 30),
    (((1, 2),), 15),
    (((1, 4),), 15),
    (((1, 8),), 15),
    (((2, 8),), 8),
    (((4, 8),), 3),
    (((1, 8), (2, 4)), 6),
    (((2, 2), (1, 4)), 8),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    name: str
    vc: str
    priority: int  # 0..1000 guaranteed, -1 opportunistic
    members: tuple[tuple[int, int], ...]  # (pod count, GPUs per pod)
    duration_s: float  # how long the job holds its GPUs once placed

    @property
    def gpus(self) -> int:
        return sum(pods * gpus for pods, gpus in self.members)


def next_job(rng: random.Random, name: str, vcs: list[str], *, mean_duration_s: float) -> JobSpec:
    shapes = [shape for shape, _ in SHAPES]
    members = rng.choices(shapes, weights=[weight for _, weight in SHAPES])[0]
    roll = rng.random()
    # a tenth opportunistic, most at a normal priority, some urgent enough to preempt
    priority = -1 if roll < 0.1 else (rng.randrange(600, 1001) if roll > 0.85 else 100)
    return JobSpec(
        name=name,
        vc=rng.choice(vcs),
        priority=priority,
        members=members,
        duration_s=rng.expovariate(1 / mean_duration_s),
    )
