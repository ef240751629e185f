"""``sdpaxos nemesis``: inject faults into a local cluster of real replica processes under client
load, then check the client history for linearizability and the replicas for liveness and
convergence.

One run per seed, each on a fresh loopback cluster (``LocalCluster``; every socket on
127.0.0.1) serving the key-value store, its replicas run with ``--fault-injection`` so the
harness can cut links through the transport's test-only fault layer (``cut_off``):

1. **Load.** ``--clients`` closed-loop native clients, homed round-robin on the replicas (a
   client retries on the next replica after a timeout), run puts, linearizable gets and
   compare-and-sets on a few keys, recording each operation's invoke and its completion:
   ``ok``, ``fail`` (a definite failure: it never took effect) or ``info`` (indefinite: it may
   or may not have). Written values are unique, so the checker can tell every write apart.
2. **Faults.** A schedule drawn from the seed alone (``plan_faults``; the same seed gives the
   same schedule): ``kill`` (SIGKILL, the replica stays down for the fault's duration, then
   restarts from its write-ahead log), ``stop`` (SIGSTOP ... SIGCONT), ``restart`` (SIGTERM
   and start again at once), ``partition`` (a minority cut off from the rest, both ways),
   ``kill-all`` (SIGKILL every replica, start them all again after the fault's duration),
   ``bridge`` (two sides that cannot hear each other and one replica, the bridge, that hears
   and is heard by both) and ``one-way`` (a minority that hears the rest and is not heard by
   them, or the reverse). Kinds take turns in a seeded order, so a short run sees each.
   **Budget.** At most ``--max-faulty`` replicas (default: a minority, F) are faulty at a
   time. A replica counts as faulty until ``RECOVERY_GRACE_S`` after it was started again; a
   fault that cuts links counts the side it cuts off (``Fault.replicas``: every lost link has
   an end there, so the replicas outside every fault's side, a majority, all hear each other).
   ``kill-all`` is the one fault over the budget, a whole-cluster crash: it starts only when
   no replica is faulty, and counts all of them faulty until ``--heal-bound`` after their
   restart, a window that nothing else disturbs and that must end within the fault phase;
   every replica must serve again within it, or the seed fails for liveness.
3. **Heal.** After ``--seconds``: SIGCONT the stopped, start the killed, clear every partition.
   Then, with the load still running, each replica is probed with linearizable reads sent to
   it alone; the time from the heal to its first answer is its *unavailability after heal*.
   A replica that does not answer within ``--heal-bound`` is a liveness failure.
4. **Converge.** The load stops; every replica must reach the same executed slot (its metrics
   endpoint) and hold the same value for every key (local reads), within ``--heal-bound``.
5. **Check.** The history goes through the linearizability checker (``sdpaxos lincheck``),
   key by key (the store's keys are independent, so this is exact), with one more read per
   key of the converged state at its end. Definite failures are left out: a client told so
   may act as if the operation never happened, so it must not have (Jepsen's ``:fail``). An
   indefinite write is completed where a later operation saw its value, or left out if none
   did (``checkable_history`` says why both are exact). A violation names the key, where the
   checker got stuck (how many operations it linearized, the last of them, the value there
   and the operations none of which could go next) and the client operations that wrote the
   values involved, with what each client was told.

Verdict per seed: ``ok``, ``violation`` (not linearizable, or replicas at the same slot with
different data), ``liveness`` (a replica not serving after heal or after a kill-all's
restart, no convergence, a replica process that exited by itself, nothing completed at all)
or ``unknown`` (the checker ran out of time on some key). Each seed's report, and the
summary, count the operations whose clients were told an indefinite outcome. The exit status
is 0 only if every seed is ok. Each seed's directory keeps the replica logs,
``history.jsonl`` (``sdpaxos lincheck`` re-checks it) and ``events.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import msgpack

from consensus.codec import FrameReader, frame_to_wire
from consensus.errors import DefiniteFailure, SDPaxosError
from consensus.messages import Command
from consensus.runtime.cli import cluster_toml
from consensus.runtime.client import Client, cut_off
from consensus.runtime.client_protocol import (
    ClientRequest,
    Cut,
    decode_response,
    encode_partition,
)
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import LocalCluster, free_base_port
from consensus.sim.history import Operation, dump_jsonl
from consensus.sim.lincheck import CheckResult, Verdict, check_keys
from consensus.statemachine import kv_cas, kv_get, kv_put

__all__ = [
    "FAULT_KINDS",
    "LINK_KINDS",
    "Fault",
    "SeedReport",
    "ViolationWindow",
    "add_arguments",
    "checkable_history",
    "failure_reasons",
    "judge",
    "main",
    "plan_faults",
    "positive",
    "run",
    "send_cut",
    "tally",
    "unrecovered_after_kill_all",
]

FaultKind = Literal["kill", "stop", "restart", "partition", "kill-all", "bridge", "one-way"]
FAULT_KINDS: tuple[FaultKind, ...] = (
    "kill", "stop", "restart", "partition", "kill-all", "bridge", "one-way"
)
#: the kinds that cut links (``Fault.lost``) rather than act on processes
LINK_KINDS = ("partition", "bridge", "one-way")
VerdictName = Literal["ok", "violation", "liveness", "unknown"]

#: the keys the load works on: few, so operations on a key overlap and the check has teeth
KEYS = tuple(f"k{i}" for i in range(5))
#: the load's mix: (operation, weight)
OP_WEIGHTS = (("put", 3), ("get", 4), ("cas", 3))

#: fault durations and the gaps between fault starts, seconds (drawn uniformly)
FAULT_MIN_S, FAULT_MAX_S = 1.0, 4.0
GAP_MIN_S, GAP_MAX_S = 0.3, 1.5
#: a replica started again (after kill or restart) counts as faulty this long: it is loading
#: its log and catching up, so faulting another one meanwhile could take away the majority
RECOVERY_GRACE_S = 2.0
#: default time every replica has to serve again after the heal (and after a kill-all)
HEAL_BOUND_S = 10.0
#: load before the first fault, so the history starts on a healthy cluster
WARMUP_S = 1.0

#: a client request unanswered this long is sent to the next replica (then indefinite)
CLIENT_TIMEOUT_S = 1.0
#: pause after a failed operation, doubled after each further failure in a row up to the
#: most, so a client does not spin against a down cluster (a kill-all) and every attempt
#: does not count as one more indefinite operation
FAILURE_BACKOFF_S = 0.05
FAILURE_BACKOFF_MAX_S = 1.0
#: one probe read at the replica being measured; probes are this far apart at most
PROBE_TIMEOUT_S = 0.5
PROBE_INTERVAL_S = 0.05
#: cut_off requests (the fault layer) are answered at once by a running replica
CUT_OFF_TIMEOUT_S = 0.5
#: how often the harness re-sends partition settings a replica has not acknowledged yet
PARTITION_SYNC_S = 0.2
#: the cluster's start-up before any fault: every replica must serve within this
START_TIMEOUT_S = 30.0
#: a replica asked to stop (SIGTERM) is killed if it has not exited within this
TERM_TIMEOUT_S = 5.0
#: default time budget of the linearizability check, seconds
CHECK_TIMEOUT_S = 120.0
#: client ids: load clients count up from here; probes and final reads use their own ranges
CLIENT_ID_BASE = 1_000
PROBE_ID_BASE = 1 << 40
FINAL_ID_BASE = 1 << 41
#: replica ports: a base in [PORT_FLOOR, the ephemeral range's start - PORT_SPAN) (see
#: quiet_base_port); cluster_toml uses base + 0/100/200/300 + replica id
PORT_FLOOR = 10_000
PORT_SPAN = 400
PORT_TRIES = 100
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32_768


# --------------------------------------------------------------------------- the schedule

#: a replica's transport dropping nothing
NO_CUT = Cut(frozenset(), frozenset())


Link = tuple[int, int]


@dataclasses.dataclass(frozen=True, slots=True)
class Fault:
    """``replicas`` are faulty from ``start`` to ``end`` (seconds into the fault phase);
    ``end`` equal to the phase's length means the final heal ends it. A fault of a
    ``LINK_KINDS`` kind loses the frames of ``lost``, directed links (sender, receiver),
    each with one end in ``replicas`` (the side it cuts off)."""

    kind: FaultKind
    replicas: tuple[int, ...]
    start: float
    end: float
    lost: tuple[Link, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "replicas": list(self.replicas),
                               "start_s": round(self.start, 3), "end_s": round(self.end, 3)}
        if self.lost:
            out["lost_links"] = [list(link) for link in self.lost]
        return out


def _both_ways(side: Iterable[int], other: Iterable[int]) -> tuple[Link, ...]:
    others = sorted(other)
    return tuple(sorted((a, b) for s in side for o in others for a, b in ((s, o), (o, s))))


def plan_faults(
    seed: int, replicas: int, seconds: float, kinds: Sequence[FaultKind], max_faulty: int,
    *, heal_bound_s: float = HEAL_BOUND_S,
) -> list[Fault]:
    """The seed's fault schedule: a pure function of its arguments. A schedule of the four
    original kinds (kill, stop, restart, partition) is the one earlier builds drew."""
    if not kinds or max_faulty < 1:
        return []
    rng = random.Random(seed)
    order: list[FaultKind] = []
    busy_until = [0.0] * replicas  # when each replica stops counting as faulty
    faults: list[Fault] = []
    t = 0.0
    while True:
        t = round(t + rng.uniform(GAP_MIN_S, GAP_MAX_S), 3)  # millisecond times, as printed
        if t >= seconds:
            return faults
        free = [r for r in range(replicas) if busy_until[r] <= t]
        room = max_faulty - (replicas - len(free))
        if room < 1 or not free:
            continue
        if not order:  # kinds take turns, in a fresh seeded order each round
            order = list(kinds)
            rng.shuffle(order)
        kind = order[-1]
        if kind == "kill-all":
            # a whole-cluster crash waits for a quiet cluster, and is left out of this round
            # if its restart and the heal bound after it no longer fit in the phase
            latest = seconds - heal_bound_s - t
            if latest < FAULT_MIN_S:
                order.pop()
                continue
            if len(free) < replicas:
                continue
            order.pop()
            end = round(t + rng.uniform(FAULT_MIN_S, min(FAULT_MAX_S, latest)), 3)
            busy_until = [end + heal_bound_s] * replicas
            faults.append(Fault(kind, tuple(range(replicas)), t, end))
            continue
        if kind == "bridge" and (len(free) < 2 or replicas < 3):
            continue  # it needs a free bridge and a free side, and someone on the other
        order.pop()
        lost: tuple[Link, ...] = ()
        if kind == "bridge":
            bridge = rng.choice(free)
            candidates = [r for r in free if r != bridge]
            most = min(room, len(candidates), replicas - 2)
            victims = tuple(sorted(rng.sample(candidates, rng.randint(1, most))))
            lost = _both_ways(victims, set(range(replicas)) - set(victims) - {bridge})
        else:
            # a partition may cut off several replicas (a minority unless --max-faulty allows
            # more, and never everyone: one side must keep someone); the others hit one
            most = min(room, len(free), replicas - 1) if kind in LINK_KINDS else 1
            victims = tuple(sorted(rng.sample(free, rng.randint(1, most))))
            rest = sorted(set(range(replicas)) - set(victims))
            if kind == "partition":
                lost = _both_ways(victims, rest)
            elif kind == "one-way":  # the side is deaf (hears nobody) or mute (nobody hears it)
                deaf = rng.random() < 0.5
                lost = tuple(sorted((o, v) if deaf else (v, o) for v in victims for o in rest))
        duration = 0.0 if kind == "restart" else rng.uniform(FAULT_MIN_S, FAULT_MAX_S)
        end = round(min(seconds, t + duration), 3)
        recovers = end + (RECOVERY_GRACE_S if kind in ("kill", "restart") else 0.0)
        for r in victims:
            busy_until[r] = recovers
        faults.append(Fault(kind, victims, t, end, lost))


# --------------------------------------------------------------------------- the history


@dataclasses.dataclass(slots=True)
class Record:
    """One client operation: its invoke and (``outcome`` set) its completion."""

    process: int
    f: Literal["write", "read", "cas"]
    key: str
    input: Any
    call_us: int
    outcome: Literal["ok", "fail", "info"] | None = None
    output: Any = None
    ret_us: int | None = None
    #: a completed cas: the value it found (the history format keeps only whether it swapped)
    before: str | None = None
    #: a failure: what the client was told (the error's message)
    error: str | None = None

    @property
    def written(self) -> str | None:
        """The value this operation stores if it takes effect (a cas: if it swaps)."""
        if self.f == "write":
            value: str = self.input
            return value
        return self.input[1] if self.f == "cas" else None

    def operation(self, *, ret_us: int | None = None) -> Operation:
        """For the checker: completed if ok, else open (or completed at ``ret_us``). A cas
        that did not swap had no effect: it is checked as a read of the value it found
        (which the history format would lose), unless it found the value it expected, a
        reply the store never gives, kept as the cas it is so the checker refuses it."""
        ok = self.outcome == "ok"
        if ok and self.f == "cas" and self.output is False and self.before != self.input[0]:
            return Operation(client=self.process, key=self.key, op="read", input=None,
                             output=self.before, call=self.call_us, ret=self.ret_us)
        if ok or ret_us is None:
            return Operation(client=self.process, key=self.key, op=self.f, input=self.input,
                             output=self.output if ok else None, call=self.call_us,
                             ret=self.ret_us if ok else None)
        # an indefinite write or cas known to have taken effect (see checkable_history)
        return Operation(client=self.process, key=self.key, op=self.f, input=self.input,
                         output=None if self.f == "write" else True, call=self.call_us,
                         ret=ret_us)

    def describe(self) -> str:
        """One line: the client, what it asked and what it was told."""
        told = {"ok": "ok", "fail": "a definite failure", "info": "an indefinite outcome",
                None: "nothing (still open)"}[self.outcome]
        if self.outcome == "ok" and self.f == "read":
            told += f", read {self.output!r}"
        elif self.outcome == "ok" and self.f == "cas":
            told += ", swapped" if self.output else f", not swapped (found {self.before!r})"
        elif self.error is not None:
            told += f" ({self.error})"
        asked = {"write": f"write {self.input!r}", "read": "read",
                 "cas": f"cas {self.input[0]!r} -> {self.input[1]!r}"}[self.f]
        return (f"client {self.process} {asked} [call {self.call_us}, return "
                f"{self.ret_us}]: told {told}")

    def events(self) -> list[dict[str, Any]]:
        value = list(self.input) if isinstance(self.input, tuple) else self.input
        base = {"process": self.process, "f": self.f, "key": self.key}
        done = {**base, "type": self.outcome or "info", "value": value,
                "output": self.output, "time_us": self.ret_us}
        if self.f == "cas" and self.outcome == "ok":
            done["before"] = self.before
        if self.error is not None:
            done["error"] = self.error
        return [{**base, "type": "invoke", "value": value, "time_us": self.call_us}, done]


def checkable_history(
    records: Sequence[Record],
    final: dict[str, str | None] | None = None,
    final_call_us: int = 0,
    final_ret_us: int = 0,
) -> tuple[list[Operation], dict[str, int]]:
    """The history for the checker, and counts of what was done to it.

    * A definite failure never took effect: left out (the client was told so and may act on
      it, so it must not have: Jepsen's ``:fail``). A value only it wrote that shows up later
      is a violation: nothing in the history wrote it.
    * A completed cas that did not swap is checked as a read of the value it found
      (``Record.operation``).
    * ``final`` (the converged state, read between ``final_call_us`` and ``final_ret_us``,
      after every operation returned) becomes one more read per key, so the end state is
      checked against the history too.
    * An indefinite write or cas whose value (unique) some completed operation saw — a read's
      output, a cas's found value, a final read — took effect before that operation
      returned: it is completed at the earliest such return (an equivalent history: every
      linearization of either is one of the other). One whose value nobody saw is left out:
      a linearization including it has no read or cas between it and the next write (they
      would have seen its value), so dropping it leaves a linearization. Both keep the
      checker's search small: an operation open forever keeps its window open.
    """
    seen: dict[tuple[str, str], int] = {}  # (key, value) -> earliest return that saw it

    def saw(key: str, value: str | None, at: int) -> None:
        if value is not None:
            seen[(key, value)] = min(seen.get((key, value), at), at)

    history: list[Operation] = []
    for record in records:
        if record.outcome == "ok" and record.ret_us is not None:
            if record.f == "read":
                saw(record.key, record.output, record.ret_us)
            elif record.f == "cas":
                saw(record.key, record.before, record.ret_us)
    if final is not None:
        for key, value in sorted(final.items()):
            history.append(Operation(client=FINAL_ID_BASE, key=key, op="read", input=None,
                                     output=value, call=final_call_us, ret=final_ret_us))
            saw(key, value, final_ret_us)
    counts = {"failed_dropped": 0, "indefinite_completed": 0, "indefinite_unseen_dropped": 0,
              "indefinite_reads_dropped": 0, "final_reads": len(history),
              "failed_cas_as_reads": 0}
    for record in records:
        if record.outcome == "ok":
            history.append(record.operation())
            counts["failed_cas_as_reads"] += history[-1].op != record.f
        elif record.outcome == "fail":
            counts["failed_dropped"] += 1
        elif record.f == "read":
            counts["indefinite_reads_dropped"] += 1  # no effect, nothing to check
        else:
            written = record.written
            at = None if written is None else seen.get((record.key, written))
            if at is None:
                counts["indefinite_unseen_dropped"] += 1
            elif at < record.call_us:
                history.append(record.operation())  # seen before it was called: left open,
                # so the checker reports the violation
            else:
                counts["indefinite_completed"] += 1
                history.append(record.operation(ret_us=at))
    history.sort(key=lambda op: op.call)
    return history, counts


def _now_us() -> int:
    return time.monotonic_ns() // 1000


class Load:
    """The clients: each a loop of one operation at a time until ``stop`` is set."""

    def __init__(self, addresses: list[tuple[str, int]], clients: int, seed: int) -> None:
        self.addresses = addresses
        self.clients = clients
        self.seed = seed
        self.records: list[Record] = []
        self.stop = asyncio.Event()
        self._ids = itertools.count(CLIENT_ID_BASE)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(i)) for i in range(self.clients)]

    async def finish(self) -> None:
        self.stop.set()
        # each worker ends after its current operation, bounded by the client's own retries
        await asyncio.gather(*self._tasks)

    def _client(self, home: int) -> Client:
        return Client(next(self._ids), self.addresses, home=home, timeout_s=CLIENT_TIMEOUT_S,
                      attempts=len(self.addresses))

    async def _worker(self, index: int) -> None:
        rng = random.Random(f"{self.seed}/{index}")
        home = index % len(self.addresses)
        client = self._client(home)
        known: dict[str, str | None] = {}  # the last value this worker saw per key
        names = [name for name, _ in OP_WEIGHTS]
        weights = [weight for _, weight in OP_WEIGHTS]
        backoff = FAILURE_BACKOFF_S
        try:
            for n in itertools.count():
                if self.stop.is_set():
                    return
                key = rng.choice(KEYS)
                name = rng.choices(names, weights)[0]
                value = f"{client.client_id}.{n}"
                record = Record(client.client_id, "read", key, None, _now_us())
                try:
                    if name == "put":
                        record.f, record.input = "write", value
                        self.records.append(record)
                        await client.execute(kv_put(key, value), [key], blind=True)
                        known[key] = value
                    elif name == "cas":
                        expected = known.get(key)
                        record.f, record.input = "cas", (expected, value)
                        self.records.append(record)
                        reply = await client.execute(kv_cas(key, expected, value), [key])
                        _, swapped, before = msgpack.unpackb(reply.payload)
                        record.output, record.before = bool(swapped), before
                        known[key] = value if swapped else before
                    else:
                        self.records.append(record)
                        reply = await client.read(kv_get(key), [key])
                        record.output = msgpack.unpackb(reply.payload)[1]
                        known[key] = record.output
                    record.outcome = "ok"
                    backoff = FAILURE_BACKOFF_S
                except DefiniteFailure as exc:
                    record.outcome, record.error = "fail", str(exc)
                except SDPaxosError as exc:
                    # indefinite: the operation stays open forever, so this process is done
                    # (one open operation per client); go on as a new client
                    record.outcome, record.error = "info", str(exc)
                    await client.close()
                    client = self._client(home)
                record.ret_us = _now_us()
                if record.outcome != "ok":
                    await asyncio.sleep(backoff)
                    backoff = min(2 * backoff, FAILURE_BACKOFF_MAX_S)
        finally:
            await client.close()


# --------------------------------------------------------------------------- the verdict


@dataclasses.dataclass(slots=True)
class ReplicaState:
    """What a replica holds once the cluster is quiet: its executed slot and every key."""

    executed: int | None
    data: dict[str, str | None]

    def to_json(self) -> dict[str, Any]:
        return {"executed": self.executed, "data": self.data}


@dataclasses.dataclass(frozen=True, slots=True)
class ViolationWindow:
    """Where a key's history stopped being linearizable (the checker's ``where_stuck``), and
    the recorded operations that wrote the values there, with what their clients were told
    (a definite failure among them: an operation that took effect after all)."""

    result: CheckResult
    #: value -> the operations that wrote it (values are unique: one, or none at all)
    writers: dict[str, list[Record]]

    @classmethod
    def of(cls, result: CheckResult, records: Sequence[Record]) -> ViolationWindow:
        values = {result.state}
        for op in result.stuck:
            values.add(op.output if op.op == "read" else op.input[0] if op.op == "cas" else None)
        writers = {
            value: [r for r in records if r.key == result.key and r.written == value]
            for value in sorted(v for v in values if v is not None)
        }
        return cls(result, writers)

    def to_json(self) -> dict[str, Any]:
        return {**self.result.where_stuck(), "writers": [
            {"value": value, "written_by": [r.describe() for r in by]}
            for value, by in self.writers.items()
        ]}

    def lines(self) -> list[str]:
        return self.result.describe_stuck() + [
            f"value {value!r} written by: "
            + ("; ".join(r.describe() for r in by) if by else "no recorded operation")
            for value, by in self.writers.items()
        ]


@dataclasses.dataclass(slots=True)
class Judgement:
    verdict: VerdictName
    reasons: list[str]
    lincheck: str
    lincheck_s: float
    #: every key that is not linearizable, where its check got stuck
    windows: list[ViolationWindow] = dataclasses.field(default_factory=list)
    #: key -> the checker's verdict on it
    keys: dict[str, str] = dataclasses.field(default_factory=dict)


def judge(
    history: Sequence[Operation],
    finals: Sequence[ReplicaState] | None,
    unavailable_s: Sequence[float | None],
    heal_bound_s: float,
    *,
    crashes: Sequence[str] = (),
    check_timeout_s: float = CHECK_TIMEOUT_S,
    records: Sequence[Record] = (),
) -> Judgement:
    """The seed's verdict from what was observed. ``finals`` is None when the replicas did not
    converge in time (their last observed states are then not comparable); an entry of
    ``unavailable_s`` is None for a replica that never served after the heal; ``crashes``
    are liveness failures seen during the run; ``records`` (the operations ``history`` was
    made from) name the writers of the values in a violation's window."""
    started = time.monotonic()
    checked = check_keys(history, timeout_s=check_timeout_s)
    check_s = time.monotonic() - started
    illegal = [c for c in checked if c.verdict is Verdict.ILLEGAL]
    undecided = [c for c in checked if c.verdict is Verdict.UNKNOWN]
    windows = [ViolationWindow.of(c, records) for c in illegal]
    keys = {str(c.key): c.verdict.name.lower() for c in checked}
    violations = [f"history not linearizable: {c.detail}" for c in illegal]
    liveness: list[str] = []
    if finals is not None and any(f != finals[0] for f in finals):
        slots = {f.executed for f in finals}
        where = ", ".join(f"replica {r}: {f.to_json()}" for r, f in enumerate(finals))
        if len(slots) == 1:
            violations.append(f"replicas diverged at the same executed slot ({where})")
        else:
            liveness.append(f"replicas did not converge ({where})")
    if finals is None:
        liveness.append(f"replicas did not converge within {heal_bound_s} s")
    for r, waited in enumerate(unavailable_s):
        if waited is None or waited > heal_bound_s:
            liveness.append(f"replica {r} did not serve a linearizable read within "
                            f"{heal_bound_s} s of the heal")
    liveness.extend(crashes)
    if not any(op.ret is not None for op in history):
        liveness.append("no operation completed")
    lincheck = "illegal" if illegal else "unknown" if undecided else "ok"
    if violations:
        return Judgement("violation", violations + liveness, lincheck, check_s, windows, keys)
    if liveness:
        return Judgement("liveness", liveness, lincheck, check_s, keys=keys)
    if undecided:
        return Judgement("unknown", [
            f"linearizability check: keys {[c.key for c in undecided]} undecided within their "
            f"share of {check_timeout_s} s"], lincheck, check_s, keys=keys)
    return Judgement("ok", [], lincheck, check_s, keys=keys)


def longest_gap_s(history: Iterable[Operation], start_us: int, end_us: int) -> float:
    """The longest time between consecutive completions (any client) in [start, end]."""
    marks = sorted(op.ret for op in history if op.ret is not None and start_us <= op.ret
                   <= end_us)
    edges = [start_us, *marks, end_us]
    return max((b - a for a, b in itertools.pairwise(edges)), default=0) / 1e6


# --------------------------------------------------------------------------- one run


@dataclasses.dataclass(slots=True)
class SeedReport:
    seed: int
    replicas: int
    seconds: float
    faults: list[Fault]
    verdict: VerdictName
    reasons: list[str]
    operations: dict[str, dict[str, int]]
    unavailable_after_heal_s: list[float | None]
    longest_stall_s: float
    lincheck: str
    lincheck_s: float
    finals: list[ReplicaState] | None
    directory: str
    #: (fault index, replica) -> seconds from a start during the faults until it served
    recovery: dict[tuple[int, int], float | str | None] = dataclasses.field(
        default_factory=dict
    )
    #: what ``checkable_history`` did to the recorded operations
    history_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    #: every key that is not linearizable, where its check got stuck
    windows: list[ViolationWindow] = dataclasses.field(default_factory=list)
    #: key -> the checker's verdict on it
    lincheck_keys: dict[str, str] = dataclasses.field(default_factory=dict)
    #: what clients were told, for the failures (``failure_reasons``)
    failure_reasons: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    @property
    def indefinite(self) -> int:
        """Operations whose clients were told the outcome is unknown."""
        return sum(row["info"] for row in self.operations.values())

    @property
    def definite_failures(self) -> int:
        return sum(row["fail"] for row in self.operations.values())

    @property
    def longest_unavailable_s(self) -> float | None:
        waits = self.unavailable_after_heal_s
        return None if any(w is None for w in waits) else max(w for w in waits if w is not None)

    @property
    def longest_recovery_s(self) -> float | None:
        """The longest time a replica started again during the faults took to serve (of
        those not faulted again first; one that never served counts as the whole rest of
        the run, and is reported as None)."""
        timed = [v for v in self.recovery.values() if v != "interrupted"]
        if any(v is None for v in timed):
            return None
        return max((float(v) for v in timed if isinstance(v, float)), default=0.0)

    def _faults_json(self) -> list[dict[str, Any]]:
        out = []
        for index, fault in enumerate(self.faults):
            entry = fault.to_json()
            served = {str(r): v for (i, r), v in sorted(self.recovery.items()) if i == index}
            if served:
                entry["serving_after_start_s"] = {
                    r: round(v, 3) if isinstance(v, float) else v for r, v in served.items()
                }
            out.append(entry)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "replicas": self.replicas,
            "seconds": self.seconds,
            "verdict": self.verdict,
            "reasons": self.reasons,
            "faults": self._faults_json(),
            "fault_counts": dict(Counter(f.kind for f in self.faults)),
            "operations": self.operations,
            "indefinite": self.indefinite,
            "definite_failures": self.definite_failures,
            "failure_reasons": self.failure_reasons,
            "history_checked": self.history_counts,
            "unavailable_after_heal_s": [
                None if w is None else round(w, 3) for w in self.unavailable_after_heal_s
            ],
            "longest_unavailable_after_heal_s": (
                None if self.longest_unavailable_s is None
                else round(self.longest_unavailable_s, 3)
            ),
            "longest_recovery_after_start_s": (
                None if self.longest_recovery_s is None else round(self.longest_recovery_s, 3)
            ),
            "longest_stall_s": round(self.longest_stall_s, 3),
            "lincheck": self.lincheck,
            "lincheck_keys": self.lincheck_keys,
            "violations": [window.to_json() for window in self.windows],
            "lincheck_s": round(self.lincheck_s, 3),
            "final_states_equal": self.finals is not None
            and all(f == self.finals[0] for f in self.finals),
            "directory": self.directory,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    replicas: int
    seconds: float
    kinds: tuple[FaultKind, ...]
    max_faulty: int
    heal_bound_s: float
    clients: int
    fsync: bool
    check_timeout_s: float


class Nemesis:
    """Carries out a fault schedule on a running cluster and heals it."""

    def __init__(self, cluster: LocalCluster, replicas: int) -> None:
        self.cluster = cluster
        self.replicas = replicas
        self.down: set[int] = set()  # killed, not started again yet
        self.stopped: set[int] = set()  # SIGSTOPped
        #: link cuts: per replica, what its transport should drop and what it acknowledged
        self.wanted: list[Cut] = [NO_CUT] * replicas
        self.applied: list[Cut] = [NO_CUT] * replicas
        #: the lost links of the link faults in force, by fault index
        self.cuts: dict[int, tuple[Link, ...]] = {}
        self.crashes: list[str] = []
        self._probe_ids = itertools.count(PROBE_ID_BASE)
        #: a replica started again during the faults (kill's end, restart): the fault's
        #: index, when it started, and the probe timing how long until it serves
        self._recovering: dict[int, tuple[int, float, asyncio.Task[float | None]]] = {}
        #: (fault index, replica) -> seconds from its start until it served; None: it did
        #: not serve before the heal measurement ended; "interrupted": faulted again first
        self.recovery: dict[tuple[int, int], float | str | None] = {}
        #: replica -> when it answered the heal measurement's probe (monotonic seconds)
        self._served_after_heal: dict[int, float] = {}

    async def run(self, faults: Sequence[Fault], seconds: float) -> None:
        actions = sorted(
            [(f.start, 1, i, "begin") for i, f in enumerate(faults)]
            + [(f.end, 0, i, "end") for i, f in enumerate(faults) if f.end < seconds]
        )  # at equal times an end goes first: it frees the replica the begin may take
        began = time.monotonic()
        syncer = asyncio.create_task(self._keep_partitions())
        try:
            for at, _, index, what in actions:
                await asyncio.sleep(max(0.0, began + at - time.monotonic()))
                self._note_crashes()
                fault = faults[index]
                if what == "begin":
                    for r in fault.replicas:
                        self._interrupt(r)
                    await self._begin(fault, index)
                else:
                    self._end(fault, index)
            await asyncio.sleep(max(0.0, began + seconds - time.monotonic()))
        finally:
            syncer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await syncer

    async def _begin(self, fault: Fault, index: int) -> None:
        victims = set(fault.replicas)
        if fault.kind in ("kill", "kill-all"):
            running = sorted(victims & set(self.cluster.processes))
            for r in running:  # every signal first: a kill-all crashes them all at once
                self.cluster.processes[r].send_signal(signal.SIGKILL)
            for r in running:
                self.cluster.kill(r)
                self.down.add(r)
                self.stopped.discard(r)
                self.applied[r] = NO_CUT  # a new process starts with no cut
        elif fault.kind == "stop":
            for r in victims & set(self.cluster.processes):
                self.cluster.pause(r)
                self.stopped.add(r)
        elif fault.kind == "restart":
            for r in victims & set(self.cluster.processes):
                await asyncio.to_thread(self._terminate, r)
                self.applied[r] = NO_CUT
                self.cluster.start(r)
                self._track_recovery(r, index)
        else:
            self.cuts[index] = fault.lost
            self._recompute_partitions()
            await self._sync_partitions()

    def _end(self, fault: Fault, index: int) -> None:
        if fault.kind in ("kill", "kill-all"):
            for r in sorted(set(fault.replicas) & self.down):
                self.cluster.start(r)
                self.down.discard(r)
                self._track_recovery(r, index)
        elif fault.kind == "stop":
            for r in set(fault.replicas) & self.stopped:
                self.cluster.resume(r)
                self.stopped.discard(r)
        elif fault.kind in LINK_KINDS:
            del self.cuts[index]
            self._recompute_partitions()

    def _track_recovery(self, replica: int, index: int) -> None:
        started = time.monotonic()
        task = asyncio.create_task(
            self._until_serving(replica, started, math.inf, clear_partition=False)
        )
        self._recovering[replica] = (index, started, task)

    def _interrupt(self, replica: int) -> None:
        """``replica`` is faulted again: a recovery still being timed will not be."""
        index, _, task = self._recovering.pop(replica, (-1, 0.0, None))
        if task is None:
            return
        if task.done():
            self.recovery[(index, replica)] = task.result()
        else:
            task.cancel()
            self.recovery[(index, replica)] = "interrupted"

    async def finish_recoveries(self) -> None:
        """Record every recovery timed so far. One still being timed ends with the heal
        measurement's answer from that replica if there was one (its own probe may be
        waiting on an attempt sent before the replica served): it served by then at the
        latest. Otherwise it did not serve."""
        for replica, (index, started, task) in sorted(self._recovering.items()):
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                self.recovery[(index, replica)] = await task
            if task.cancelled():
                served = self._served_after_heal.get(replica)
                self.recovery[(index, replica)] = None if served is None else served - started
        self._recovering.clear()

    def _terminate(self, replica: int) -> None:
        process = self.cluster.processes.pop(replica)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(TERM_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _recompute_partitions(self) -> None:
        """Each lost link is cut at both ends, the sender's and the receiver's: while one end
        is down, stopped or not told yet, the other still drops its frames."""
        lost = {link for links in self.cuts.values() for link in links}
        self.wanted = [
            Cut(drop_from=frozenset(a for a, b in lost if b == r),
                drop_to=frozenset(b for a, b in lost if a == r))
            for r in range(self.replicas)
        ]

    async def _sync_partitions(self) -> None:
        """Send each running replica its wanted cut if it has not got it (a replica down or
        stopped gets it once it runs again)."""
        addresses = self.cluster.client_addresses
        for r in range(self.replicas):
            if r in self.down or r in self.stopped or self.applied[r] == self.wanted[r]:
                continue
            wanted = self.wanted[r]
            try:
                await send_cut(addresses[r], wanted)
            except (OSError, ConnectionError, TimeoutError, SDPaxosError):
                continue  # not listening yet (just started): the next round retries
            self.applied[r] = wanted

    async def _keep_partitions(self) -> None:
        while True:
            await asyncio.sleep(PARTITION_SYNC_S)
            await self._sync_partitions()

    def _note_crashes(self) -> None:
        for r, process in sorted(self.cluster.processes.items()):
            code = process.poll()
            if code is not None:
                self.crashes.append(f"replica {r} exited by itself (status {code})")
                self.cluster.processes.pop(r)
                self.down.add(r)

    def heal(self) -> None:
        """Every replica running, no partition wanted (sent by ``measure_heal``)."""
        self._note_crashes()
        for r in sorted(self.stopped):
            self.cluster.resume(r)
        for r in sorted(self.down):
            self.applied[r] = NO_CUT
            self.cluster.start(r)
        self.stopped.clear()
        self.down.clear()
        self.cuts.clear()
        self._recompute_partitions()

    async def measure_heal(self, healed_at: float, bound_s: float) -> list[float | None]:
        """Per replica: seconds from the heal until it answered a linearizable read (None:
        not within ``bound_s``). Clears its partition first."""
        waits = list(await asyncio.gather(
            *(self._until_serving(r, healed_at, bound_s) for r in range(self.replicas))
        ))
        self._served_after_heal = {r: healed_at + w for r, w in enumerate(waits)
                                   if w is not None}
        return waits

    async def _until_serving(self, replica: int, since: float, bound_s: float, *,
                             clear_partition: bool = True) -> float | None:
        """Seconds from ``since`` until ``replica`` answered a linearizable read sent to it
        alone (None: not within ``bound_s``)."""
        address = self.cluster.client_addresses[replica]
        probe_key = KEYS[0]
        while True:
            if time.monotonic() > since + bound_s:
                return None
            tried = time.monotonic()
            try:
                if clear_partition and self.applied[replica] != NO_CUT:
                    await cut_off(address, [], timeout_s=CUT_OFF_TIMEOUT_S)  # both ways
                    self.applied[replica] = NO_CUT
                client = Client(next(self._probe_ids), [address],
                                timeout_s=PROBE_TIMEOUT_S, attempts=1)
                try:
                    await client.read(kv_get(probe_key), [probe_key])
                finally:
                    await client.close()
                return time.monotonic() - since
            except (OSError, ConnectionError, TimeoutError, SDPaxosError):
                await asyncio.sleep(max(0.0, tried + PROBE_INTERVAL_S - time.monotonic()))


async def send_cut(address: tuple[str, int], cut: Cut) -> None:
    """Set the link cuts of the replica at client ``address`` (run with
    ``--fault-injection``): ``cut_off``'s request, in the form that may cut one way only."""
    async with asyncio.timeout(CUT_OFF_TIMEOUT_S):
        reader, writer = await asyncio.open_connection(*address)
        try:
            op = encode_partition(cut.drop_from, cut.drop_to)
            request = ClientRequest(1, "partition", Command(client_id=0, seq=0, op=op, keys=()))
            writer.write(frame_to_wire(request.encode()))
            frames = FrameReader()
            while not (answers := frames.feed(await reader.read(1 << 16))):
                if reader.at_eof():
                    raise ConnectionError("the replica closed the connection")
        finally:
            writer.close()
    answer = decode_response(answers[0])
    if answer.status != "ok":
        raise DefiniteFailure(str(answer.payload))


async def _metric(address: tuple[str, int], name: str) -> int | None:
    """One gauge from a replica's metrics endpoint (None if it cannot be read)."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(*address)
            try:
                writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
                body = (await reader.read()).decode()
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return None
    for line in body.splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[1]))
    return None


async def _replica_state(cluster: LocalCluster, replica: int) -> ReplicaState | None:
    spec = cluster.config.replica(replica)
    assert spec.metrics_address is not None  # cluster_toml gives every replica one
    executed = await _metric(spec.metrics_address, "sdpaxos_executed_slots")
    client = Client(FINAL_ID_BASE + replica, [spec.client_address], timeout_s=PROBE_TIMEOUT_S,
                    attempts=1)
    data: dict[str, str | None] = {}
    try:
        for key in KEYS:
            reply = await client.read(kv_get(key), [key], stale=True)
            data[key] = msgpack.unpackb(reply.payload)[1]
    except SDPaxosError:
        return None
    finally:
        await client.close()
    return ReplicaState(executed, data)


async def converge(cluster: LocalCluster, replicas: int, bound_s: float
                   ) -> tuple[list[ReplicaState] | None, list[ReplicaState | None]]:
    """Poll until every replica reports the same executed slot and data; returns (the states,
    or None if that did not happen within ``bound_s``; the last states seen)."""
    deadline = time.monotonic() + bound_s
    while True:
        states = [await _replica_state(cluster, r) for r in range(replicas)]
        complete = [s for s in states if s is not None and s.executed is not None]
        if len(complete) == replicas:
            if all(s == complete[0] for s in complete):
                return complete, states
            # same slot everywhere and still different data: waiting will not fix it
            if len({s.executed for s in complete}) == 1:
                return complete, states
        if time.monotonic() > deadline:
            return None, states
        await asyncio.sleep(PROBE_INTERVAL_S * 4)


async def _wait_serving(cluster: LocalCluster, replicas: int) -> bool:
    nemesis = Nemesis(cluster, replicas)
    waits = await nemesis.measure_heal(time.monotonic(), START_TIMEOUT_S)
    return all(w is not None for w in waits)


def quiet_base_port(replicas: int) -> int:
    """A base port for ``cluster_toml`` whose ports (base + 100 k + i) are free now and lie
    below the kernel's ephemeral port range, so no outgoing connection takes them."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = DEFAULT_EPHEMERAL_LOW
    chooser = random.Random()  # not the seed's: concurrent runs should not collide
    for _ in range(PORT_TRIES):
        base = chooser.randrange(PORT_FLOOR, max(PORT_FLOOR + 1, low - PORT_SPAN))
        if all(_bindable(base + hundred + i) for hundred in range(0, PORT_SPAN, 100)
               for i in range(replicas)):
            return base
    return free_base_port()


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def unrecovered_after_kill_all(
    faults: Sequence[Fault], recovery: dict[tuple[int, int], float | str | None],
    bound_s: float,
) -> list[str]:
    """Liveness failures: replicas that did not serve within ``bound_s`` of their restart
    after a kill-all (nothing else happens in that window: see ``plan_faults``)."""
    late = []
    for index, fault in enumerate(faults):
        if fault.kind != "kill-all":
            continue
        for r in fault.replicas:
            took = recovery.get((index, r))
            if not isinstance(took, float) or took > bound_s:
                when = (f"served after {took:.2f} s" if isinstance(took, float)
                        else "not served before the next fault" if took == "interrupted"
                        else "never served")
                late.append(f"replica {r} did not serve within {bound_s} s of its restart "
                            f"after the kill-all at {fault.start:.3f} s ({when})")
    return late


def tally(records: Sequence[Record]) -> dict[str, dict[str, int]]:
    """Per operation (write, read, cas): how many ended ok, fail and info."""
    counts: dict[str, dict[str, int]] = {}
    for record in records:
        row = counts.setdefault(record.f, {"ok": 0, "fail": 0, "info": 0})
        row[record.outcome or "info"] += 1
    return counts


#: the client's "gave up" prefix, which says nothing about the cause (its last error does)
_GAVE_UP = re.compile(r"^no answer for \(#, #\) after # tries: ")


def failure_reasons(records: Sequence[Record]) -> dict[str, dict[str, int]]:
    """``"info"`` (indefinite) and ``"fail"`` (definite): how many operations were told each
    reason, numbers blanked (``#``) so that like reasons count together, most frequent first.
    Indefinite outcomes with every replica down (a kill-all) say "Connect call failed"."""
    counts: dict[str, Counter[str]] = {"info": Counter(), "fail": Counter()}
    for record in records:
        if record.outcome in counts:
            reason = _GAVE_UP.sub("last try: ", re.sub(r"\d+", "#", record.error or ""))
            if reason.endswith(": ") or not reason:  # a TimeoutError's message is empty
                reason += "(no message: a timeout)"
            counts[record.outcome][reason] += 1
    return {outcome: dict(c.most_common()) for outcome, c in counts.items()}


async def _run_seed(seed: int, options: Options, directory: Path) -> SeedReport:
    faults = plan_faults(seed, options.replicas, options.seconds, options.kinds,
                         options.max_faulty, heal_bound_s=options.heal_bound_s)
    extra = ("--fault-injection",) if options.fsync else ("--fault-injection", "--no-fsync")
    cluster = LocalCluster(directory, options.replicas, extra_args=extra)
    # LocalCluster's ports come from the kernel's ephemeral range, where a replica that is
    # down can find its port taken by some outgoing connection when it restarts (seen: a
    # replica exiting with EADDRINUSE after a kill): move them below that range
    cluster.config_path.write_text(
        cluster_toml(options.replicas, quiet_base_port(options.replicas), wan=False)
    )
    cluster.config = load_cluster_config(cluster.config_path)
    nemesis = Nemesis(cluster, options.replicas)
    load = Load(cluster.client_addresses, options.clients, seed)
    finals: list[ReplicaState] | None = None
    waits: list[float | None] = [None] * options.replicas
    crashes: list[str] = []
    phase_start = phase_end = final_call = final_ret = _now_us()
    cluster.start_all()
    try:
        if not await _wait_serving(cluster, options.replicas):
            crashes.append(f"the cluster did not serve within {START_TIMEOUT_S} s of starting")
        else:
            load.start()
            await asyncio.sleep(WARMUP_S)
            phase_start = _now_us()
            try:
                await nemesis.run(faults, options.seconds)
                nemesis.heal()
                healed_at = time.monotonic()
                waits = await nemesis.measure_heal(healed_at, options.heal_bound_s)
            finally:
                await nemesis.finish_recoveries()
                await load.finish()
            phase_end = final_call = _now_us()  # every operation has returned
            finals, last = await converge(cluster, options.replicas, options.heal_bound_s)
            final_ret = _now_us()
            nemesis._note_crashes()
            crashes.extend(nemesis.crashes)
            crashes.extend(unrecovered_after_kill_all(faults, nemesis.recovery,
                                                      options.heal_bound_s))
            (directory / "final-states.json").write_text(json.dumps(
                [None if s is None else s.to_json() for s in last]))
    finally:
        cluster.stop_all()
    agreed = finals is not None and all(f == finals[0] for f in finals)
    history, history_counts = checkable_history(
        load.records, finals[0].data if finals is not None and agreed else None,
        final_call, final_ret,
    )
    with (directory / "history.jsonl").open("w") as out:
        dump_jsonl(history, out)
    with (directory / "events.jsonl").open("w") as out:
        for record in load.records:
            for event in record.events():
                out.write(json.dumps(event) + "\n")
    judgement = judge(history, finals, waits, options.heal_bound_s, crashes=crashes,
                      check_timeout_s=options.check_timeout_s, records=load.records)
    stall = longest_gap_s(history, phase_start, phase_end) if load.records else 0.0
    return SeedReport(
        seed=seed, replicas=options.replicas, seconds=options.seconds, faults=faults,
        verdict=judgement.verdict, reasons=judgement.reasons, operations=tally(load.records),
        failure_reasons=failure_reasons(load.records),
        unavailable_after_heal_s=waits, longest_stall_s=stall, lincheck=judgement.lincheck,
        lincheck_s=judgement.lincheck_s, finals=finals, directory=str(directory),
        recovery=dict(nemesis.recovery), history_counts=history_counts,
        windows=judgement.windows, lincheck_keys=judgement.keys,
    )


# --------------------------------------------------------------------------- CLI


def _kinds(text: str) -> tuple[FaultKind, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [k for k in chosen if k not in FAULT_KINDS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"fault kinds are a comma-separated subset of {','.join(FAULT_KINDS)}"
        )
    return tuple(k for k in FAULT_KINDS if k in chosen)


def positive(text: str) -> float:
    """An option's positive number (argparse ``type``)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (__doc__ or "").split("\n\n")[0]
    parser.add_argument("--replicas", type=int, choices=(3, 5), default=3,
                        help="how many replicas (sites CA, OR, OH, VA, JP in that order)")
    parser.add_argument("--seconds", type=positive, default=30.0,
                        help="length of the fault phase per seed")
    parser.add_argument("--seed", type=int, action="append", dest="seed_list", metavar="SEED",
                        help="run this seed (repeatable)")
    parser.add_argument("--seeds", type=int, help="run this many consecutive seeds ...")
    parser.add_argument("--start-seed", type=int, default=1, help="... from this one")
    parser.add_argument("--faults", type=_kinds, default=FAULT_KINDS,
                        help=f"comma-separated kinds (default {','.join(FAULT_KINDS)})")
    parser.add_argument("--max-faulty", type=int,
                        help="replicas faulty at once (default: a minority; more is allowed)")
    parser.add_argument("--heal-bound", type=positive, default=HEAL_BOUND_S,
                        help="seconds each replica has to serve again, and to converge, "
                        "after the heal (and to serve again after a kill-all)")
    parser.add_argument("--clients", type=int, default=6,
                        help="closed-loop clients writing during the faults")
    parser.add_argument("--check-timeout", type=positive, default=CHECK_TIMEOUT_S,
                        help="time budget of the linearizability check per seed, seconds")
    parser.add_argument("--dir", help="work directory (default: a temporary one, removed "
                        "if every seed is ok)")
    parser.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True,
                        help="replicas fsync their logs (default on)")
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON on stdout (progress goes to stderr)")


def _seeds(args: argparse.Namespace) -> list[int]:
    if args.seed_list and args.seeds is not None:
        raise ValueError("give --seed or --seeds, not both")
    if args.seed_list:
        return list(args.seed_list)
    count = 1 if args.seeds is None else args.seeds
    if count < 1:
        raise ValueError("--seeds must be at least 1")
    return list(range(args.start_seed, args.start_seed + count))


def _fault_counts(faults: Iterable[Fault]) -> str:
    counts = Counter(f.kind for f in faults)
    return ", ".join(f"{counts[k]} {k}" for k in FAULT_KINDS if counts[k]) or "none"


_TOLD = {"info": "indefinite", "fail": "definite"}


def _describe(report: SeedReport) -> str:
    faults = _fault_counts(report.faults)
    ops = report.operations
    done = ", ".join(f"{f} {row['ok']} ok/{row['fail']} fail/{row['info']} info"
                     for f, row in sorted(ops.items()))
    waits = " ".join("-" if w is None else f"{w:.2f}" for w in report.unavailable_after_heal_s)
    longest = report.longest_unavailable_s
    lines = [
        f"seed {report.seed}: {report.verdict.upper()}  ({report.replicas} replicas, "
        f"{report.seconds:g} s of faults: {faults})",
        f"  operations: {done or 'none'}",
        f"  indefinite operations: {report.indefinite}; definite failures: "
        f"{report.definite_failures}",
        *(f"    {_TOLD[outcome]} {n} x {reason}"
          for outcome, told in report.failure_reasons.items() for reason, n in told.items()),
        f"  unavailable after heal (s, per replica): {waits}; longest "
        f"{'-' if longest is None else f'{longest:.2f}'}; longest stall under faults "
        f"{report.longest_stall_s:.2f} s",
        f"  lincheck: {report.lincheck} ({report.lincheck_s:.1f} s; keys "
        + " ".join(f"{k} {v}" for k, v in report.lincheck_keys.items())
        + f"); final states {'equal' if report.to_json()['final_states_equal'] else 'NOT equal'}",
    ]
    checked = report.history_counts
    if checked.get("indefinite_completed") or checked.get("indefinite_unseen_dropped"):
        lines[-1] += (f"; indefinite writes seen later (completed) "
                      f"{checked['indefinite_completed']}, never seen (left out) "
                      f"{checked['indefinite_unseen_dropped']}")
    timed = [
        f"{report.faults[i].kind} r{r} "
        + ("never" if v is None else v if isinstance(v, str) else f"{v:.2f}")
        for (i, r), v in sorted(report.recovery.items())
    ]
    recovery = report.longest_recovery_s
    if timed:
        lines.append(
            "  serving again after a start under faults (s): " + ", ".join(timed)
            + f"; longest {'never' if recovery is None else f'{recovery:.2f}'}"
        )
    lines += [f"  reason: {reason}" for reason in report.reasons]
    for window in report.windows:
        lines.append(f"  violation on key {window.result.key!r}:")
        lines += [f"    {line}" for line in window.lines()]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        seeds = _seeds(args)
    except ValueError as exc:
        print(f"sdpaxos nemesis: {exc}", file=sys.stderr)
        return 2
    faulty = args.max_faulty if args.max_faulty is not None else (args.replicas - 1) // 2
    if not 1 <= faulty <= args.replicas or args.clients < 1:
        print("sdpaxos nemesis: --max-faulty must be in [1, replicas], --clients at least 1",
              file=sys.stderr)
        return 2
    options = Options(args.replicas, args.seconds, args.faults, faulty, args.heal_bound,
                      args.clients, args.fsync, args.check_timeout)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="sdpaxos-nemesis-"))
    progress = sys.stderr if args.json else sys.stdout
    reports: list[SeedReport] = []
    for seed in seeds:
        directory = root / f"seed-{seed}"
        if directory.exists():
            shutil.rmtree(directory)  # a stale run's logs and WALs would be reused
        report = asyncio.run(_run_seed(seed, options, directory))
        reports.append(report)
        print(_describe(report), file=progress, flush=True)
    failed = [r for r in reports if r.verdict != "ok"]
    waits = [r.longest_unavailable_s for r in reports]
    longest = None if any(w is None for w in waits) else max(w for w in waits if w is not None)
    verdicts = dict(Counter(r.verdict for r in reports))
    recoveries = [r.longest_recovery_s for r in reports]
    slowest = (None if any(v is None for v in recoveries)
               else max((v for v in recoveries if v is not None), default=0.0))
    indefinite = {r.seed: r.indefinite for r in reports}
    definite = {r.seed: r.definite_failures for r in reports}
    all_faults = [f for r in reports for f in r.faults]
    told: dict[str, Counter[str]] = {"info": Counter(), "fail": Counter()}
    for report in reports:
        for outcome, reasons in report.failure_reasons.items():
            told[outcome].update(reasons)
    summary = {
        "runs": len(reports),
        "seeds": seeds,
        "verdicts": verdicts,
        "fault_counts": dict(Counter(f.kind for f in all_faults)),
        "indefinite_per_seed": indefinite,
        "indefinite_total": sum(indefinite.values()),
        "definite_failures_per_seed": definite,
        "definite_failures_total": sum(definite.values()),
        "failure_reasons_total": {k: dict(c.most_common()) for k, c in told.items()},
        "longest_unavailable_after_heal_s": None if longest is None else round(longest, 3),
        "longest_recovery_after_start_s": None if slowest is None else round(slowest, 3),
        "directory": str(root),
    }
    print(f"{len(reports)} runs, seeds {seeds}: "
          + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
          + f"; faults: {_fault_counts(all_faults)}"
          + "; indefinite operations per seed: "
          + ", ".join(f"{seed}: {n}" for seed, n in indefinite.items())
          + f" (total {sum(indefinite.values())}); definite failures: total "
          + f"{sum(definite.values())}"
          + "; longest unavailability after heal "
          + ("-" if longest is None else f"{longest:.2f} s")
          + "; longest recovery after a start under faults "
          + ("never" if slowest is None else f"{slowest:.2f} s") + f"; work in {root}",
          file=progress, flush=True)
    if args.json:
        print(json.dumps({**summary, "options": {
            "replicas": options.replicas, "seconds": options.seconds,
            "faults": list(options.kinds), "max_faulty": options.max_faulty,
            "heal_bound_s": options.heal_bound_s, "clients": options.clients,
            "fsync": options.fsync}, "results": [r.to_json() for r in reports]}, indent=1))
    if not failed and not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sdpaxos nemesis")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
