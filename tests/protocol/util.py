"""Shared helpers for the protocol-core tests (SDPaxos and the Multi-Paxos / Mencius baselines).

One loop turn by hand:

* ``cmd(client, seq, ...)`` builds a client command (the one command helper of the suite);
* ``turn(core, *inputs, now=...)`` proposes commands / steps messages, then takes and advances
  the turn's ``Ready``; ``drain(core)`` is a turn with no new input, ``tick(core, now)`` a
  turn of timers;
* ``msgs(outgoing, Kind)`` lists ``(destination, message)`` pairs, ``records_of(ready, Kind)``
  the durable records of one type;
* ``core(replicas, me, ...)`` builds an SDPaxos core, ``config(n, ...)`` the short timers the
  baseline tests assume.

``Net`` drives real cores of any protocol through an explicit in-flight bag: nothing is
delivered unless a test says so (``deliver``, ``deliver_all``, or ``run`` for turn-by-turn
delivery with each replica's inputs batched), which makes reordering, duplication and loss
explicit.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from consensus.config import ProtocolConfig
from consensus.messages import Command, PeerMessage, Record
from consensus.protocol.ready import Execution, Outgoing, Ready
from consensus.protocol.sdpaxos import SDPaxosReplica

__all__ = [
    "Flight",
    "Net",
    "cmd",
    "config",
    "core",
    "drain",
    "msgs",
    "records_of",
    "tick",
    "turn",
]

M = TypeVar("M")

#: the baseline tests' timers: short, so that retransmission and catch-up show in a few ticks
BASELINE_TIMING: dict[str, int] = {
    "retransmit_us": 100_000,
    "catchup_us": 150_000,
    "heartbeat_us": 50_000,
}


# --------------------------------------------------------------------------- building


def cmd(
    client: int,
    seq: int,
    *,
    op: bytes | None = None,
    keys: tuple[str, ...] = (),
    blind: bool = True,
) -> Command:
    """Command ``seq`` of ``client``; its op defaults to a distinct ``op<client>:<seq>``."""
    payload = f"op{client}:{seq}".encode() if op is None else op
    return Command(client_id=client, seq=seq, op=payload, keys=keys, blind=blind)


def config(n: int = 3, **changes: Any) -> ProtocolConfig:
    """A configuration of ``n`` replicas with the baseline tests' short timers."""
    return ProtocolConfig(replicas=n, **{**BASELINE_TIMING, **changes})


def core(replicas: int, me: int, **settings: object) -> SDPaxosReplica:
    """SDPaxos replica ``me`` of ``replicas`` (default timers unless ``settings`` say)."""
    cfg = ProtocolConfig(replicas=replicas, **settings)  # type: ignore[arg-type]
    return SDPaxosReplica(cfg, me, rng=random.Random(0))


# --------------------------------------------------------------------------- one turn


def turn(replica: Any, *inputs: Command | PeerMessage, now: int = 0) -> Ready:
    """Feed ``inputs`` (commands are proposed, messages stepped) at ``now``, then take and
    advance the turn's ``Ready``."""
    for item in inputs:
        if isinstance(item, Command):
            replica.propose(item, now)
        else:
            replica.step(item, now)
    ready: Ready = replica.ready()
    replica.advance(ready)
    return ready


def drain(replica: Any) -> Ready:
    """One loop turn with no new input: take the Ready and advance past it."""
    return turn(replica)


def tick(replica: Any, now: int) -> Ready:
    """One loop turn of ``replica``'s timers at ``now``."""
    replica.tick(now)
    return drain(replica)


@overload
def msgs(outgoing: Iterable[Outgoing]) -> list[tuple[int, PeerMessage]]: ...
@overload
def msgs(outgoing: Iterable[Outgoing], kind: type[M]) -> list[tuple[int, M]]: ...
def msgs(outgoing: Iterable[Outgoing], kind: type | None = None) -> list[tuple[int, Any]]:
    """(destination, message) pairs, optionally of one message type only."""
    return [(o.to, o.message) for o in outgoing if kind is None or isinstance(o.message, kind)]


def records_of(ready: Ready, kind: type[M]) -> list[M]:
    """The records of type ``kind`` among what ``ready`` makes durable."""
    return [record for record in ready.persist if isinstance(record, kind)]


# --------------------------------------------------------------------------- message bag


@dataclass(eq=False)
class Flight:
    src: int
    dst: int
    message: PeerMessage


def _never_lost(src: int, dst: int, message: PeerMessage) -> bool:
    return False


@dataclass
class Net:
    """Real cores plus an in-flight bag; every output is kept (per replica, and ``sent``).

    ``factory`` builds the cores (``SDPaxosReplica`` unless a baseline's class is given),
    replica ``r`` with ``random.Random(r)``.
    """

    config: ProtocolConfig
    factory: Callable[..., Any] = SDPaxosReplica
    now: int = 0
    cores: list[Any] = field(default_factory=list)
    bag: list[Flight] = field(default_factory=list)
    #: ``"src->dst Type"`` for every message sent and not lost, in send order
    sent: list[str] = field(default_factory=list)
    executed: list[list[Execution]] = field(default_factory=list)
    ready_cmds: list[list[Command]] = field(default_factory=list)
    reads: list[list[Command]] = field(default_factory=list)
    durable: list[list[Record]] = field(default_factory=list)
    #: message types discarded at send time (never delivered, never in ``sent``)
    discard: tuple[type, ...] = ()
    #: messages this says are lost at send time (never delivered, never in ``sent``)
    lose: Callable[[int, int, PeerMessage], bool] = _never_lost
    #: called with each Ready, e.g. for invariant checks
    on_ready: Callable[[int, Ready], None] | None = None
    #: keep ``sent`` (off for speed in property tests)
    trace: bool = True

    def __post_init__(self) -> None:
        n = self.config.replicas
        if not self.cores:
            self.cores = [self.factory(self.config, r, rng=random.Random(r)) for r in range(n)]
        self.executed = [[] for _ in range(n)]
        self.ready_cmds = [[] for _ in range(n)]
        self.reads = [[] for _ in range(n)]
        self.durable = [[] for _ in range(n)]

    def restart(self, replica: int, seed: int = 99) -> None:
        """Crash ``replica`` between two turns and rebuild it from its durable records (it
        executes again, at once, what its records say it executed)."""
        self.cores[replica] = self.factory(
            self.config, replica, recovered=list(self.durable[replica]),
            rng=random.Random(seed),
        )
        self.executed[replica] = []

    # inputs --------------------------------------------------------------
    def propose(self, replica: int, *commands: Command) -> None:
        """Client commands at ``replica``, all in one turn."""
        for command in commands:
            self.cores[replica].propose(command, self.now)
        self.flush(replica)

    def read(self, replica: int, *commands: Command) -> None:
        """Client reads at ``replica``, all in one turn."""
        for command in commands:
            self.cores[replica].read(command, self.now)
        self.flush(replica)

    def tick(self, replica: int, at: int | None = None) -> None:
        if at is not None:
            self.now = max(self.now, at)
        self.cores[replica].tick(self.now)
        self.flush(replica)

    def tick_all(self, at: int) -> None:
        """Move the clock to ``at``, run every replica's timers (in replica order), then
        ``run`` until nothing is in flight."""
        for replica in range(len(self.cores)):
            self.tick(replica, at)
        self.run()

    def deliver(self, flight: Flight) -> None:
        self._take(flight)
        self.cores[flight.dst].step(flight.message, self.now)
        self.flush(flight.dst)

    def deliver_together(self, flights: list[Flight]) -> None:
        """Deliver ``flights`` in order, draining each receiver once at the end (one turn)."""
        touched: list[int] = []
        for flight in flights:
            self._take(flight)
            self.cores[flight.dst].step(flight.message, self.now)
            if flight.dst not in touched:
                touched.append(flight.dst)
        for replica in touched:
            self.flush(replica)

    def deliver_all(self, limit: int = 100_000) -> None:
        """Deliver FIFO until the bag is empty (messages sent meanwhile included)."""
        for _ in range(limit):
            if not self.bag:
                return
            self.deliver(self.bag[0])
        raise AssertionError("deliver_all did not quiesce")

    def run(self, max_rounds: int = 100) -> None:
        """Deliver in rounds until the bag is empty: each round, every replica in turn takes
        everything in flight to it (sent earlier in the round included) in one turn."""
        for _ in range(max_rounds):
            if not self.bag:
                return
            for replica in range(len(self.cores)):
                inbox = [f for f in self.bag if f.dst == replica]
                if inbox:
                    self.deliver_together(inbox)
        raise AssertionError("messages still in flight after max_rounds")

    def matching(self, src: str, dst: str, kind: str) -> list[Flight]:
        return [
            f
            for f in self.bag
            if (src == "*" or f.src == int(src))
            and (dst == "*" or f.dst == int(dst))
            and (kind == "*" or type(f.message).__name__ == kind)
        ]

    def _take(self, flight: Flight) -> None:
        for i, f in enumerate(self.bag):
            if f is flight:
                del self.bag[i]
                return
        raise AssertionError("not in flight")

    def drop(self, flight: Flight) -> None:
        self._take(flight)

    def duplicate(self, flight: Flight) -> None:
        copy = Flight(flight.src, flight.dst, flight.message)
        self.bag.append(copy)

    # outputs -------------------------------------------------------------
    def _lost(self, src: int, out: Outgoing) -> bool:
        return isinstance(out.message, self.discard) or self.lose(src, out.to, out.message)

    def flush(self, replica: int) -> Ready:
        r = replica
        ready = self.cores[r].ready()
        # ``lose`` is asked once per message (a test's filter may count what it drops)
        after_persist = [o for o in ready.send_after_persist if not self._lost(r, o)]
        at_once = [o for o in ready.send if not self._lost(r, o)]
        self.durable[r].extend(ready.persist)
        self.durable[r].extend(ready.log)  # a crash here is between turns: written by then
        for out in after_persist + at_once:
            self.bag.append(Flight(r, out.to, out.message))
            if self.trace:
                self.sent.append(f"{r}->{out.to} {type(out.message).__name__}")
        self.ready_cmds[r].extend(ready.ready)
        self.executed[r].extend(ready.executions())
        self.reads[r].extend(ready.reads)
        if self.on_ready is not None:
            self.on_ready(r, ready)
        self.cores[r].advance(ready)
        return ready

    def executed_ids(self, replica: int) -> list[tuple[int, int, int]]:
        """(slot, client id, seq) of what ``replica`` executed, in order."""
        return [(e.slot, e.command.client_id, e.command.seq) for e in self.executed[replica]]
