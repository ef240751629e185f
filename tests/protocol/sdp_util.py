"""Helpers for the SDPaxos core tests: commands, canonical text forms, and a message bag.

The canonical forms are what the golden scripts (``golden/*.txt``) compare against, so they
are deliberately short and stable:

* a command prints as ``client:seq`` (``7:0``), a batch as ``[7:0,7:1]`` (``None`` if absent);
* O-instance entries print as ``slot=>owner`` (``0=>1``; ``NO_CL`` is ``noop``);
* a message prints as ``Type(field=value ...)`` in declaration order, without ``src`` (the
  trace line names the sender);
* a record prints as ``Type field=value ...``.

``Net`` drives real cores through an explicit in-flight bag: nothing is delivered unless a
test says so, which makes reordering, duplication and loss explicit.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from consensus.config import ProtocolConfig
from consensus.messages import NO_CL, Command, OEntry, PeerMessage, Record
from consensus.protocol.ready import Execution, Outgoing, Ready
from consensus.protocol.sdpaxos import SDPaxosReplica

__all__ = [
    "Flight",
    "Net",
    "cmd",
    "core",
    "drain",
    "fmt_batch",
    "fmt_cmd",
    "fmt_msg",
    "fmt_record",
    "msgs",
]


def cmd(client: int, seq: int, *, blind: bool = True, keys: tuple[str, ...] = ()) -> Command:
    return Command(client_id=client, seq=seq, op=f"op{client}:{seq}".encode(), keys=keys,
                   blind=blind)


def core(replicas: int, me: int, **config: object) -> SDPaxosReplica:
    cfg = ProtocolConfig(replicas=replicas, **config)  # type: ignore[arg-type]
    return SDPaxosReplica(cfg, me, rng=random.Random(0))


def drain(replica: SDPaxosReplica) -> Ready:
    """One loop turn: take the Ready and advance past it."""
    ready = replica.ready()
    replica.advance(ready)
    return ready


def msgs(
    outgoing: Iterable[Outgoing], kind: type | None = None
) -> list[tuple[int, PeerMessage]]:
    """(destination, message) pairs, optionally of one message type only."""
    return [(o.to, o.message) for o in outgoing if kind is None or isinstance(o.message, kind)]


# --------------------------------------------------------------------------- canonical text


def fmt_cmd(command: Command) -> str:
    return f"{command.client_id}:{command.seq}"


def fmt_batch(batch: tuple[Command, ...] | None) -> str:
    if batch is None:
        return "None"
    return "[" + ",".join(fmt_cmd(c) for c in batch) + "]"


def _fmt_entry(entry: OEntry) -> str:
    owner = "noop" if entry.owner == NO_CL else str(entry.owner)
    return f"{entry.slot}=>{owner}"


def _fmt_value(value: object) -> str:
    if isinstance(value, tuple):
        if value and all(isinstance(v, Command) for v in value):
            return fmt_batch(value)  # type: ignore[arg-type]
        if value and all(isinstance(v, OEntry) for v in value):
            return "[" + ",".join(_fmt_entry(v) for v in value) + "]"  # type: ignore[arg-type]
        return "[" + ",".join(_fmt_value(v) for v in value) + "]"
    if isinstance(value, Command):
        return fmt_cmd(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return fmt_msg(value)
    return str(value)


def _fields(obj: object) -> str:
    assert dataclasses.is_dataclass(obj)
    return " ".join(
        f"{f.name}={_fmt_value(getattr(obj, f.name))}"
        for f in dataclasses.fields(obj)
        if f.name != "src"
    )


def fmt_msg(message: object) -> str:
    return f"{type(message).__name__}({_fields(message)})"


def fmt_record(record: Record) -> str:
    return f"{type(record).__name__} {_fields(record)}"


# --------------------------------------------------------------------------- message bag


@dataclass(eq=False)
class Flight:
    src: int
    dst: int
    message: PeerMessage


@dataclass
class Net:
    """Real cores plus an in-flight bag; every output is logged in canonical form."""

    config: ProtocolConfig
    now: int = 0
    cores: list[SDPaxosReplica] = field(default_factory=list)
    bag: list[Flight] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    executed: list[list[Execution]] = field(default_factory=list)
    ready_cmds: list[list[Command]] = field(default_factory=list)
    durable: list[list[Record]] = field(default_factory=list)
    #: message types discarded at send time (never delivered, never logged)
    discard: tuple[type, ...] = ()
    #: called with each Ready (after logging), e.g. for invariant checks
    on_ready: Callable[[int, Ready], None] | None = None
    #: keep the canonical text log (off for speed in property tests)
    trace: bool = True

    def __post_init__(self) -> None:
        n = self.config.replicas
        if not self.cores:
            self.cores = [
                SDPaxosReplica(self.config, r, rng=random.Random(r)) for r in range(n)
            ]
        self.executed = [[] for _ in range(n)]
        self.ready_cmds = [[] for _ in range(n)]
        self.durable = [[] for _ in range(n)]

    def _log(self, line: str) -> None:
        self.log.append(line)

    def restart(self, replica: int, seed: int = 99) -> None:
        """Crash ``replica`` between two turns and rebuild it from its durable records (it
        executes again, at once, what its records say it executed)."""
        self.cores[replica] = SDPaxosReplica(
            self.config, replica, recovered=list(self.durable[replica]),
            rng=random.Random(seed),
        )
        self.executed[replica] = []
        if self.trace:
            self._log(f"restart {replica}")

    # inputs --------------------------------------------------------------
    def propose(self, replica: int, *commands: Command) -> None:
        for command in commands:
            self.cores[replica].propose(command, self.now)
        self.flush(replica)

    def tick(self, replica: int, at: int | None = None) -> None:
        if at is not None:
            self.now = max(self.now, at)
        self.cores[replica].tick(self.now)
        self.flush(replica)

    def deliver(self, flight: Flight) -> None:
        self._take(flight)
        if self.trace:
            self._log(f"{flight.dst} <- {flight.src} {fmt_msg(flight.message)}")
        self.cores[flight.dst].step(flight.message, self.now)
        self.flush(flight.dst)

    def deliver_together(self, flights: list[Flight]) -> None:
        """Deliver ``flights`` in order, draining each receiver once at the end (one turn)."""
        touched: list[int] = []
        for flight in flights:
            self._take(flight)
            if self.trace:
                self._log(f"{flight.dst} <- {flight.src} {fmt_msg(flight.message)}")
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
        if self.trace:
            self._log(f"drop {flight.src}->{flight.dst} {fmt_msg(flight.message)}")

    def duplicate(self, flight: Flight) -> None:
        copy = Flight(flight.src, flight.dst, flight.message)
        self.bag.append(copy)
        if self.trace:
            self._log(f"dup {flight.src}->{flight.dst} {fmt_msg(flight.message)}")

    # outputs -------------------------------------------------------------
    def flush(self, replica: int) -> Ready:
        r = replica
        ready = self.cores[r].ready()
        if self.trace:
            self._trace_ready(r, ready)
        self.durable[r].extend(ready.persist)
        self.durable[r].extend(ready.log)  # a crash here is between turns: written by then
        for out in ready.send_after_persist + ready.send:
            if not isinstance(out.message, self.discard):
                self.bag.append(Flight(r, out.to, out.message))
        self.ready_cmds[r].extend(ready.ready)
        self.executed[r].extend(ready.apply)
        if self.on_ready is not None:
            self.on_ready(r, ready)
        self.cores[r].advance(ready)
        return ready

    def _trace_ready(self, r: int, ready: Ready) -> None:
        log = self.log.append
        for record in ready.persist:
            log(f"{r} persist {fmt_record(record)}")
        for record in ready.log:
            log(f"{r} log {fmt_record(record)}")
        for arrow, outs in (("->", ready.send_after_persist), ("~>", ready.send)):
            for out in outs:
                if not isinstance(out.message, self.discard):
                    log(f"{r} {arrow} {out.to} {fmt_msg(out.message)}")
        for command in ready.ready:
            log(f"{r} ready {fmt_cmd(command)}")
        for ex in ready.apply:
            log(
                f"{r} exec slot={ex.slot} off={ex.offset} {fmt_cmd(ex.command)} "
                f"led_here={ex.led_here}"
            )
        for failure in ready.failed:
            log(f"{r} failed {fmt_cmd(failure.command)} definite={failure.definite} "
                f"{failure.reason}")
        for peer in ready.snapshot_requests:
            log(f"{r} snapshot-request {peer}")
