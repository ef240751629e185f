"""Helpers for handler-level tests of the baseline cores (Multi-Paxos, Mencius).

``turn`` runs one loop turn of one core by hand; ``Net`` wires a few cores together with
instant delivery and a drop filter, for tests that follow a message exchange.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from consensus.config import ProtocolConfig
from consensus.messages import Command, PeerMessage, Record
from consensus.protocol.ready import Execution, Outgoing, Ready
from consensus.protocol.slotlog import SlotLogCore

Core = TypeVar("Core", bound=SlotLogCore)
M = TypeVar("M")


def config(n: int = 3, **changes: Any) -> ProtocolConfig:
    timing: dict[str, Any] = {
        "retransmit_us": 100_000,
        "catchup_us": 150_000,
        "heartbeat_us": 50_000,
    }
    timing.update(changes)
    return ProtocolConfig(replicas=n, **timing)


def cmd(seq: int, client: int = 1, *, blind: bool = True, key: str = "k") -> Command:
    return Command(client_id=client, seq=seq, op=f"op{seq}".encode(), keys=(key,), blind=blind)


def turn(core: SlotLogCore, *inputs: Command | PeerMessage, now: int = 0) -> Ready:
    """Feed ``inputs`` (commands are proposed, messages stepped) at ``now``, then take and
    advance the turn's ``Ready``."""
    for item in inputs:
        if isinstance(item, Command):
            core.propose(item, now)
        else:
            core.step(item, now)
    ready = core.ready()
    core.advance(ready)
    return ready


def tick(core: SlotLogCore, now: int) -> Ready:
    core.tick(now)
    ready = core.ready()
    core.advance(ready)
    return ready


def of_type(outgoing: Iterable[Outgoing], cls: type[M]) -> list[tuple[int, M]]:
    """(destination, message) for every outgoing message of class ``cls``."""
    return [(out.to, out.message) for out in outgoing if isinstance(out.message, cls)]


def records_of(ready: Ready, cls: type[M]) -> list[M]:
    return [record for record in ready.persist if isinstance(record, cls)]


@dataclass
class Net:
    """Cores with instant delivery: ``run`` loops turns until nothing is in flight."""

    cores: list[Any]
    drop: Callable[[int, int, PeerMessage], bool] = lambda src, dst, msg: False
    now: int = 0
    inbox: list[list[Command | PeerMessage]] = field(default_factory=list)
    applied: list[list[Execution]] = field(default_factory=list)
    ready: list[list[Command]] = field(default_factory=list)
    reads: list[list[Command]] = field(default_factory=list)
    durable: list[list[Record]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, factory: Callable[..., Core], conf: ProtocolConfig) -> Net:
        cores = [factory(conf, r, rng=random.Random(r)) for r in range(conf.replicas)]
        n = len(cores)
        return cls(
            cores,
            inbox=[[] for _ in range(n)],
            applied=[[] for _ in range(n)],
            ready=[[] for _ in range(n)],
            reads=[[] for _ in range(n)],
            durable=[[] for _ in range(n)],
        )

    def propose(self, replica: int, *commands: Command) -> None:
        self.inbox[replica].extend(commands)

    def _carry_out(self, r: int, ready: Ready) -> None:
        self.durable[r].extend(ready.persist)
        for out in ready.send + ready.send_after_persist:
            name = type(out.message).__name__
            if self.drop(r, out.to, out.message):
                self.log.append(f"{r}->{out.to} {name} (dropped)")
            else:
                self.log.append(f"{r}->{out.to} {name}")
                self.inbox[out.to].append(out.message)
        self.applied[r].extend(ready.apply)
        self.ready[r].extend(ready.ready)
        self.reads[r].extend(ready.reads)

    def run(self, max_rounds: int = 100) -> None:
        for _ in range(max_rounds):
            if not any(self.inbox):
                return
            for r, core in enumerate(self.cores):
                items, self.inbox[r] = self.inbox[r], []
                if items:
                    self._carry_out(r, turn(core, *items, now=self.now))
        raise AssertionError("messages still in flight after max_rounds")

    def tick(self, now: int) -> None:
        self.now = now
        for r, core in enumerate(self.cores):
            core.tick(now)
            ready = core.ready()
            core.advance(ready)
            self._carry_out(r, ready)
        self.run()

    def executed(self, replica: int) -> list[tuple[int, int, int]]:
        """(slot, client id, seq) of what ``replica`` applied, in order."""
        return [(e.slot, e.command.client_id, e.command.seq) for e in self.applied[replica]]
