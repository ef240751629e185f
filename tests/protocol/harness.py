"""A minimal deterministic cluster of protocol cores for handler-level tests.

No faults, no codec: a heap of deliveries with per-link one-way delays. The full simulator
(`consensus.sim`) is the place for faults and checkers; this harness keeps unit tests small.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from consensus.config import SITES, ProtocolConfig, site_rtt_ms
from consensus.messages import Command, PeerMessage, Record
from consensus.protocol.ready import Execution
from consensus.protocol.sdpaxos import SDPaxosReplica


def paper_delays_us(n: int) -> list[list[int]]:
    return [[int(site_rtt_ms(SITES[a], SITES[b]) * 1000) // 2 for b in range(n)] for a in range(n)]


@dataclass
class Cluster:
    config: ProtocolConfig
    delays_us: list[list[int]]
    now: int = 0
    cores: list[SDPaxosReplica] = field(default_factory=list)
    queue: list[tuple[int, int, int, object]] = field(default_factory=list)
    seq: int = 0
    executed: list[list[Execution]] = field(default_factory=list)
    ready_at: dict[tuple[int, int], int] = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)
    drop: Callable[[int, int, PeerMessage], bool] = lambda src, dst, msg: False
    durable: list[list[Record]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.config.replicas
        self.cores = [
            SDPaxosReplica(self.config, r, rng=random.Random(r)) for r in range(n)
        ]
        self.executed = [[] for _ in range(n)]
        self.durable = [[] for _ in range(n)]

    def restart(self, replica: int, seed: int = 99) -> None:
        """Replace a replica by a fresh core rebuilt from its durable records."""
        self.cores[replica] = SDPaxosReplica(
            self.config, replica, recovered=list(self.durable[replica]), rng=random.Random(seed)
        )
        self.executed[replica] = []

    def _push(self, at: int, replica: int, item: object) -> None:
        heapq.heappush(self.queue, (at, self.seq, replica, item))
        self.seq += 1

    def propose(self, replica: int, command: Command, at: int | None = None) -> None:
        self._push(self.now if at is None else at, replica, command)

    def _flush(self, replica: int) -> None:
        core = self.cores[replica]
        ready = core.ready()
        self.durable[replica].extend(ready.persist)
        for out in ready.send_after_persist + ready.send:
            self.trace.append(f"{self.now} {replica}->{out.to} {type(out.message).__name__}")
            if not self.drop(replica, out.to, out.message):
                self._push(self.now + self.delays_us[replica][out.to], out.to, out.message)
        self.executed[replica].extend(ready.apply)
        for command in ready.ready:
            self.ready_at.setdefault((command.client_id, command.seq), self.now)
        core.advance(ready)

    def run(self, until: int | None = None, tick_us: int = 10_000) -> None:
        next_tick = self.now + tick_us
        while self.queue or (until is not None and self.now < until):
            at = self.queue[0][0] if self.queue else next_tick
            if until is not None and min(at, next_tick) > until:
                self.now = until
                return
            if not self.queue or next_tick < at:
                self.now = next_tick
                for replica, core in enumerate(self.cores):
                    core.tick(self.now)
                    self._flush(replica)
                next_tick += tick_us
                if until is None and not self.queue:
                    return
                continue
            at, _, replica, item = heapq.heappop(self.queue)
            self.now = at
            touched = {replica}
            self._deliver(replica, item)
            while self.queue and self.queue[0][0] == at:
                _, _, other, more = heapq.heappop(self.queue)
                self._deliver(other, more)
                touched.add(other)
            for r in sorted(touched):
                self._flush(r)

    def _deliver(self, replica: int, item: object) -> None:
        core = self.cores[replica]
        if isinstance(item, Command):
            core.propose(item, self.now)
        else:
            core.step(item, self.now)  # type: ignore[arg-type]
