"""Deterministic simulation of a cluster of protocol cores, with faults and checkers.

Everything random comes from one ``random.Random(seed)`` (sub-generators are derived from
it); time is an integer clock in µs driven by an event heap ``(time, seq, event)`` whose
``seq`` breaks ties (the events: ``consensus.sim.events``); nothing iterates an unordered
container. The same seed and options therefore replay the same run exactly — a failing run
prints the command line that replays it.

A replica's loop turn mirrors the asyncio driver: everything that arrived at one instant is
fed to the core, then its ``Ready`` is carried out — what needs no durability (``send``: a
proposer's Accept that leaves in parallel with its own fsync, requests) sent at once, records
persisted, then (after ``fsync_us``) the acknowledgements sent, commands applied to a
``KVStore`` and clients answered; events arriving while the "fsync" runs wait for the next
turn (group commit). A crash during the fsync keeps a random prefix of its records while what
the turn sent at once is still delivered (the window the index reservations and the rule that
an Accept proves nothing of its sender's acceptance are there for: ``reuse_index`` and
``learn_from_accept`` are the broken variants a pinned seed catches).

Faults: message loss, duplication and reordering; crash (the records not yet durable are lost,
except a random prefix: a torn tail) and restart from the durable records; symmetric,
asymmetric and flapping partitions (isolating the sequencer, splitting off a minority);
paused replicas; clock drift within the configured bound. A chaos phase injects them, then a
heal phase removes every fault and requires each client operation to complete and every
replica to converge to the same state.

Snapshots (``snapshot_every``), as the asyncio driver takes them: after every so many applied
commands a replica snapshots its state machine, compacts its core to its previous snapshot and
rewrites its durable records to what the new one does not cover (one atomic step here);
a replica behind a peer's compaction point is sent that peer's latest snapshot over the
faulty network; a restart starts from the durable snapshot and the records after it.

Every send step goes through the codec as the node's does (``consensus.runtime.framing``: a
frame per destination, split at the transport's frame limit), and what is delivered is what
the receiver decodes (snapshots too, in their file encoding); a message that cannot be
encoded, that the receiver would refuse, or that decodes to something else is a violation of
the seed. ``use_codec=False`` delivers the objects as they are.

Long-log mode (``long_log``): blind writes from many clients until the global log holds so
many slots, then restarts ("one": the sequencer, down for two election timeouts; "all":
every replica at once), each of which the cluster must survive within ``recovery_bound_us``
of simulated time: a read through the log answered at every site and every replica through
the same slot, at least where the log was. A restarted replica without a snapshot re-learns
the whole log, through catch-up, view changes and C-instance recovery: the messages sized by
the log are what this mode exercises.

Checked after every loop turn: every replica executes the same commands in the same global
order (a replica restarted from scratch re-executes and is checked again from the start); no
acknowledgement leaves before the records it relies on are durable (by construction of the
turn). At the end: ``committed_log`` agreement, linearizability of the client history
(``consensus.sim.lincheck``) and convergence.
"""

from __future__ import annotations

import bisect
import heapq
import importlib
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, assert_never

import msgpack

from consensus.attempts import Answer, Attempts, Kind, Step
from consensus.codec import DEFAULT_MAX_FRAME, decode_frame
from consensus.config import SITES, ProtocolConfig, site_rtt_ms
from consensus.errors import ConfigError, DecodeError, LocalProtocolError
from consensus.messages import Command, PeerMessage, Record
from consensus.protocol import checks
from consensus.protocol.base import DrivenCore
from consensus.protocol.membership import MemberReplica
from consensus.protocol.membership.config import (
    ADD,
    REMOVE,
    REPLACE,
    Change,
    Configuration,
    encode_change,
    next_epoch,
)
from consensus.protocol.ready import Outgoing, Ready
from consensus.protocol.registry import PROTOCOLS
from consensus.protocol.types import SnapshotMeta
from consensus.runtime.framing import frames_by_peer
from consensus.sessions import (
    COUNTER_LIMIT,
    LAST,
    LOG_TIME_STAGGERS,
    SESSION_EXPIRED,
    SessionLimits,
    SessionTable,
    log_time_command,
    session_seq,
)
from consensus.sim.events import (
    Chaos,
    Check,
    ClientTimeout,
    Durable,
    Event,
    FaultCrash,
    FaultRestart,
    Frame,
    Heal,
    InboxEvent,
    Issue,
    LongLogRecover,
    LongLogStep,
    MemberRetry,
    Propose,
    Read,
    RestartAll,
    Resume,
    SnapshotArrival,
    Tick,
    Turn,
)
from consensus.sim.history import Operation
from consensus.sim.lincheck import Verdict, check_history
from consensus.sim.network import LinkFaults, Network
from consensus.statemachine import CANCEL_OP, SESSION_MARK, KVStore, kv_cas, kv_get, kv_put
from consensus.storage.snapshot import decode_snapshot, encode_snapshot

__all__ = [
    "FAULT_CLASSES",
    "PROTOCOLS",
    "RECOVERY_BOUND_US",
    "RESTART_KINDS",
    "ReadyHook",
    "RunResult",
    "SimOptions",
    "Simulation",
]

#: every fault class the simulator implements (``--faults all``); "member" only changes
#: the members of a protocol that can (SDPaxos)
FAULT_CLASSES = ("loss", "dup", "reorder", "crash", "partition", "pause", "drift", "member")

#: membership faults keep this many voters at least, and this many members at most (the
#: sizes the issue asks for: 3 -> 4 -> 5 -> 4 -> 3)
MIN_VOTERS = 3
MAX_MEMBERS = 5

#: the client id of the membership changes the simulator proposes (not a checked client)
MEMBER_CLIENT = 999
#: how often a membership change that did not take effect is proposed again
MEMBER_RETRY_US = 500_000

#: the frame limit the node's transport uses (``PeerTransport.max_frame``'s default)
MAX_FRAME = DEFAULT_MAX_FRAME

#: message fields that are arrays, several of them sized by the log (view change, recovery,
#: catch-up): a codec violation names the longest, whose limit is the likeliest to break
ARRAY_FIELDS = ("entries", "owners", "accepted", "slots", "batch", "commands", "keys")

#: long-log mode: what may be restarted ("one": the sequencer; "all": every replica at once)
RESTART_KINDS = ("one", "all")

#: long-log mode: how long after a restart the cluster may take to serve again by default
#: (simulated µs: with LAN timing a view change takes about 0.3 to 0.6 s, catching up on
#: 70,000 slots about 1.6 s)
RECOVERY_BOUND_US = 5_000_000

#: long-log mode: how often the phase is looked at (simulated µs)
LONG_LOG_CHECK_US = 10_000

#: long-log mode: the timer period, the node's with a 50 ms heartbeat (``ReplicaNode``: a
#: fifth of it, at most 10 ms). It matters here: a replica behind asks for one catch-up batch
#: per tick, and the core's tick scans its unexecuted log, after a restart the whole log (at
#: the LAN's 5 ms ticks dominated the run's time)
LONG_LOG_TICK_US = 10_000

#: long-log mode: a run ends here at the latest (simulated µs; a stall fails the run long
#: before: a restart's bound, or a bound's time without executing anything)
LONG_LOG_HORIZON_US = 600_000_000

#: about this many clients share a key (the checker's cost grows with per-key concurrency)
CLIENTS_PER_KEY = 4
#: a client's unanswered attempts at an update before it settles it (``consensus.attempts``;
#: the native client's default)
CLIENT_ATTEMPTS = 3

#: sessions mode: a unit of log time is this much simulated time (µs), and log time starts
#: here; the session table's bounds, tight enough that evictions happen in every run
LOG_TIME_UNIT_US = 10_000
LOG_TIME_START = 1_000_000
SIM_SESSION_LIMITS = SessionLimits(max_sessions=3, max_per_principal=3, idle_ttl_s=150,
                                   time_step_s=10, max_step_s=100)
#: sessions mode: a client's sessions open within this much log time, and this share of its
#: operations are one-shot sessions (the last request of a session: a CLI verb)
SIM_OPEN_WINDOW = 100
ONE_SHOT_SHARE = 0.3


@dataclass(frozen=True, slots=True, kw_only=True)
class SimOptions:
    protocol: str = "sdpaxos"
    replicas: int = 3
    faults: frozenset[str] = frozenset()
    ops: int = 200  # client operations per run
    concurrency: int = 2  # clients per site, one operation open each
    network: str = "wan"  # "wan": the paper's RTTs; "lan": 0.2 ms RTT
    reads: str = "mixed"  # gets through "log", the "lease" read path, or "mixed"
    workload: str = "mixed"  # "mixed" writes, reads and CAS; or only "writes" or only "reads"
    think_us: int = 0
    use_codec: bool = True
    unsafe: frozenset[str] = frozenset()
    fsync_us: int | None = None  # default: 0 without crash faults, else 1 ms
    chaos_us: int | None = None  # length of the fault phase (default from the network)
    heal_us: int | None = None  # how long the heal phase may take
    tick_us: int | None = None
    protocol_overrides: tuple[tuple[str, Any], ...] = ()
    snapshot_every: int = 0  # applied commands between a replica's snapshots (0: none)
    #: share of updates (writes, CAS) that name no keys, as a store's commands may: the
    #: sequencer's read history must count them as updating every key
    keyless: float = 0.0
    lincheck_timeout_s: float = 10.0
    #: long-log mode (0: off): blind writes until the global log holds this many slots, then
    #: the restarts of ``restarts`` in turn, each followed by a liveness check
    long_log: int = 0
    #: "one" restarts the sequencer, "all" the whole cluster at once
    restarts: tuple[str, ...] = ("one", "all")
    #: how long after a restart the cluster may take to serve again (simulated time)
    recovery_bound_us: int = RECOVERY_BOUND_US
    #: sessions mode: clients open sessions with open-by times (many of them one-shot), the
    #: replicas propose log-time commands, the session table has tight bounds
    #: (``SIM_SESSION_LIMITS``), and no request may run twice
    sessions: bool = False


@dataclass
class RunResult:
    seed: int
    violation: str | None = None
    violation_time_us: int = 0
    liveness: str | None = None
    ops_completed: int = 0
    #: operations that ended in a definite failure (settled as never applied): no operation
    #: in the history, which the checker takes to say they never took effect
    ops_failed: int = 0
    ready_latency_us: dict[str, list[int]] = field(default_factory=dict)
    executed_latency_us: dict[str, list[int]] = field(default_factory=dict)
    history: list[Operation] = field(default_factory=list)
    trace_tail: list[str] = field(default_factory=list)
    messages: dict[str, int] = field(default_factory=dict)  # sent, by message type
    elapsed_s: float = 0.0
    sim_time_us: int = 0
    #: False when the linearizability check ran out of its time budget (verdict unknown)
    checked: bool = True
    snapshots_taken: int = 0
    snapshots_installed: int = 0  # sent by a peer
    restarts_from_snapshot: int = 0
    #: long-log mode: each restart, the log's length at it, and how long serving took again
    long_log: list[dict[str, Any]] = field(default_factory=list)
    #: sessions mode: ``SessionExpired`` answers clients got, and the operations whose outcome
    #: that left unknown (a copy sent before may have run)
    sessions_expired: int = 0
    outcomes_unknown: int = 0

    @property
    def ok(self) -> bool:
        return self.violation is None and self.liveness is None


class Violation(Exception):
    pass


class Stalled(Exception):
    """Long-log mode: the cluster did not serve again in time after a restart."""


@dataclass
class _Replica:
    rid: int
    core: DrivenCore
    store: KVStore
    durable: list[Record] = field(default_factory=list)
    #: records written without an fsync (``Ready.log``): durable with the next fsync, lost
    #: in a crash before it
    unsynced: list[Record] = field(default_factory=list)
    #: the durable snapshot the durable records continue from, and its encoded state
    snapshot: tuple[SnapshotMeta, bytes] | None = None
    applied_since_snapshot: int = 0
    alive: bool = True
    incarnation: int = 0
    busy_until: int = -1  # a "fsync" in progress
    paused_until: int = -1
    inbox: list[InboxEvent] = field(default_factory=list)
    canon_position: int = 0  # how many executions of the canonical order it has done
    #: partial-order cores (EPaxos): per conflict key, how many of its executions it has done
    key_positions: dict[str, int] = field(default_factory=dict)
    rate: float = 1.0  # clock drift
    offset: int = 0
    turn_pending: bool = False
    #: its disk was wiped: it never comes back under its id (it is replaced)
    wiped: bool = False
    #: a member added during the run: the members it asks first
    contacts: tuple[int, ...] = ()
    #: sessions mode: its clock reading (log-time units) when it last proposed a log time
    log_time_proposed: int = 0
    #: membership faults: where it runs, as its core publishes it through the log (a
    #: ``member_move`` gives it another, as a replica restarted on new addresses)
    info: str = ""


@dataclass
class _Client:
    cid: int
    home: int
    seq: int = 0
    op: dict[str, Any] | None = None  # the open operation
    #: sessions mode: its session's open-by time (0: none yet) and next request number
    #: (``COUNTER_LIMIT``: the session is closed)
    open_by: int = 0
    counter: int = 0


class _CheckedStore(KVStore):
    """Sessions mode: the key-value store, failing the run if a request runs at two places of
    the global log (a retry that ran again). ``ran`` is the run's, shared by every replica:
    request -> the log position it ran at; ``position``: where the command applied now is."""

    __slots__ = ("_running", "position", "ran")

    def __init__(self, sessions: SessionTable, ran: dict[tuple[int, int], int]) -> None:
        super().__init__(sessions)
        self.ran = ran
        self.position = 0
        self._running = (0, 0)

    def apply(self, position: int, command: Command) -> bytes:
        self._running = (command.client_id, command.seq)
        self.position = position
        return super().apply(position, command)

    def _execute(self, op_bytes: bytes) -> bytes:
        first = self.ran.setdefault(self._running, self.position)
        if first != self.position:
            raise Violation(f"request {self._running} ran at log position {self.position}, "
                            f"after it ran at {first}")
        return super()._execute(op_bytes)


#: ``Simulation.on_ready(replica, command, called_at_us)``: a client's command became ready
#: (may be acknowledged) at ``replica``; the client called the operation at ``called_at_us``
ReadyHook = Callable[[int, Command, int], None]


class Simulation:
    """One seeded run. ``run()`` plays it whole; a driver that plays its own scenario
    (``bench.sim_failover``) calls ``start()``, adds events with ``schedule`` and plays
    them with ``run_until``, watching commands become ready through ``on_ready``."""

    def __init__(self, options: SimOptions, seed: int) -> None:
        checks.enable()  # the cores verify their state owners' invariants as they change
        self.options = options
        self.seed = seed
        root = random.Random(seed)
        self.rng_net = random.Random(root.getrandbits(64))
        self.rng_work = random.Random(root.getrandbits(64))
        self.rng_fault = random.Random(root.getrandbits(64))
        core_seeds = [root.getrandbits(64) for _ in range(options.replicas)]
        self.rng_core = [random.Random(s) for s in core_seeds]
        n = options.replicas
        self.n = n
        self.f = n // 2
        wan = options.network == "wan"
        if wan:
            delays = [
                [int(site_rtt_ms(SITES[a], SITES[b]) * 1000) // 2 for b in range(n)]
                for a in range(n)
            ]
            timing: dict[str, Any] = {
                "heartbeat_us": 100_000,
                "election_timeout_us": 1_000_000,
                "lease_us": 800_000,
                "retransmit_us": 400_000,
                "catchup_us": 500_000,
                "straggler_window_us": 1_000_000,
            }
        else:
            delays = [[0 if a == b else 100 for b in range(n)] for a in range(n)]
            timing = {
                "heartbeat_us": 50_000,
                "election_timeout_us": 300_000,
                "lease_us": 250_000,
                "retransmit_us": 100_000,
                "catchup_us": 150_000,
                "straggler_window_us": 500_000,
            }
        timing.update(dict(options.protocol_overrides))
        self.config = ProtocolConfig(replicas=n, unsafe=options.unsafe, **timing)
        faults = options.faults
        self.tick_us = options.tick_us or (
            20_000 if wan else LONG_LOG_TICK_US if options.long_log else 5_000
        )
        # With crashes, a slow disk (per seed) widens the window in which unsynced records
        # can be lost: an acknowledgement sent too early is then likely to be exposed.
        self.fsync_us = (
            options.fsync_us
            if options.fsync_us is not None
            else (self.rng_fault.randrange(500, 20_000) if "crash" in faults else 0)
        )
        self.chaos_us = options.chaos_us or (8_000_000 if wan else 3_000_000)
        self.heal_us = options.heal_us or (30_000_000 if wan else 15_000_000)
        if options.long_log:
            if faults:
                raise ConfigError("the long-log mode runs without faults: its restarts are the "
                                  "fault")
            unknown = sorted(set(options.restarts) - set(RESTART_KINDS))
            if unknown or not options.restarts:
                raise ConfigError(f"restarts must be a list of {', '.join(RESTART_KINDS)}, "
                                  f"got {list(options.restarts)}")
            self.heal_us = options.heal_us or LONG_LOG_HORIZON_US
        r = self.rng_fault
        link = LinkFaults(
            loss=r.uniform(0, 0.08) if "loss" in faults else 0.0,
            duplicate=r.uniform(0, 0.08) if "dup" in faults else 0.0,
            reorder=r.uniform(0, 0.2) if "reorder" in faults else 0.0,
            reorder_us=int(delays[0][-1] * 1.5) + 2_000 if "reorder" in faults else 0,
        )
        self.link_faults = link
        self.network = Network(delays, self.rng_net, link)
        module_name, _, name = PROTOCOLS[options.protocol].partition(":")
        self.factory: Callable[..., DrivenCore] = getattr(
            importlib.import_module(module_name), name
        )
        #: sessions mode: request -> the log position it ran at (``_CheckedStore``)
        self._ran: dict[tuple[int, int], int] = {}
        if options.sessions and getattr(self.factory, "partial_order", False):
            raise ConfigError("sessions mode checks requests by their global log position: "
                              "a protocol with a total order only")
        #: membership faults (``member``): members join, leave, are replaced and move (publish
        #: new info) during the chaos phase (a protocol whose core is ``MemberReplica``)
        self.membership = "member" in faults and isinstance(self.factory, type) and issubclass(
            self.factory, MemberReplica)
        self._moves = 0
        self.replicas: list[_Replica] = []
        for i in range(n):
            self.replicas.append(self._new_replica(i))
        self._member_seq = 0
        #: the membership change under way (proposed again until it took effect)
        self._wanted: Change | None = None
        if "drift" in faults:
            bound = self.config.max_drift_ppm / 1_000_000 * 0.9
            for rep in self.replicas:
                rep.rate = 1 + r.uniform(-bound, bound)
                rep.offset = r.randrange(0, 1_000_000)
        self.clients = [
            _Client(1000 + i, i % n) for i in range(n * options.concurrency)
        ]
        self.keys = tuple(f"k{i}" for i in range(max(4, len(self.clients) // CLIENTS_PER_KEY)))
        # With faults, spread the operations over the whole chaos phase: faults that hit an
        # idle cluster test little.
        self.think_us = options.think_us or (
            self.chaos_us * len(self.clients) // max(1, options.ops) if faults else 0
        )
        #: operations the clients may issue in all (long-log mode: until the log is long)
        self.ops_budget = options.ops if not options.long_log else 1 << 62
        #: long-log mode: the phase ("load", "drain", "down", "recover", "done"), the restarts
        #: still to do, when the last one happened, the log's length then, clients that owe
        #: a probe read
        self._phase = "load"
        self._restarts_left = list(options.restarts)
        self._restarted_at = 0
        self._frontier = 0
        self._probes: set[int] = set()
        #: long-log mode: the highest execution frontier, and when it was reached
        self._progress = (0, 0)
        self._heap: list[tuple[int, int, Event]] = []
        self._seq = 0
        #: called when a client's open command becomes ready (see ``ReadyHook``)
        self.on_ready: ReadyHook | None = None
        self._handlers = self._event_handlers()
        self.now = 0
        self.canon: list[tuple[int, int, int, int]] = []
        #: a core that orders only conflicting commands (``partial_order``, EPaxos) is checked
        #: per conflict key: every replica runs the commands naming a key in the same order (a
        #: command naming no keys conflicts with all, so it counts under every key and "*")
        self.partial_order = bool(getattr(self.factory, "partial_order", False))
        self.key_canon: dict[str, list[tuple[int, int]]] = {}
        self._key_positions_at: dict[SnapshotMeta, dict[str, int]] = {}
        self.issued = 0
        self.result = RunResult(seed=seed)
        self.trace: list[str] = []
        self.chaos_over = False
        self.down_since: dict[int, int] = {}
        self._isolated_until = 0

    # ------------------------------------------------------------------ plumbing
    def _new_replica(
        self,
        rid: int,
        durable: list[Record] | None = None,
        snapshot: tuple[SnapshotMeta, bytes] | None = None,
        contacts: tuple[int, ...] = (),
    ) -> _Replica:
        """``contacts``: the members a member added during the run asks first."""
        meta = snapshot[0] if snapshot is not None else None
        extra: dict[str, Any] = {"contacts": contacts} if contacts else {}
        info = ""
        if self.membership:  # what it publishes (a restart keeps where it moved to)
            old = self.replicas[rid] if rid < len(self.replicas) else None
            info = old.info if old is not None else f"sim:{rid}"
            extra["info"] = info
        core = self.factory(
            self.config, rid, recovered=list(durable or ()), rng=self.rng_core[rid], snapshot=meta,
            **extra,
        )
        rep = _Replica(rid=rid, core=core, store=self._new_store(), snapshot=snapshot,
                       contacts=contacts, info=info)
        if durable:
            rep.durable = list(durable)
        if snapshot is not None:
            rep.store.restore(snapshot[1])
            rep.canon_position = self._canon_index(snapshot[0].slot)
            rep.key_positions = dict(self._key_positions_at.get(snapshot[0], {}))
        return rep

    def _new_store(self) -> KVStore:
        if not self.options.sessions:
            return KVStore()
        table = SessionTable(SIM_SESSION_LIMITS, unsafe=self.options.unsafe)
        return _CheckedStore(table, self._ran)

    def _canon_index(self, slot: int) -> int:
        """Where the canonical execution order reaches global slot ``slot``: a replica
        continuing from a snapshot at ``slot`` is checked from there."""
        return bisect.bisect_left(self.canon, (slot,))

    def _push(self, at: int, event: Event) -> None:
        heapq.heappush(self._heap, (at, self._seq, event))
        self._seq += 1

    def _log(self, text: str) -> None:
        self.trace.append(f"{self.now / 1000:10.3f} {text}")
        if len(self.trace) > 200:
            del self.trace[:100]

    def _local(self, rep: _Replica) -> int:
        return int(self.now * rep.rate) + rep.offset

    # ------------------------------------------------------------------ the run
    def start(self) -> None:
        """Schedule the first events: every replica's timer, every client's first request."""
        for rep in self.replicas:
            self._push(0, Tick(rep.rid))
        for client in self.clients:
            self._push(1_000 + self.rng_work.randrange(1_000), Issue(client.cid))

    def schedule(self, at: int, event: Event) -> None:
        """Add ``event`` at simulated time ``at`` (µs), after the events already there for
        that instant."""
        self._push(at, event)

    def run_until(self, done: Callable[[], bool], *, deadline_us: int) -> bool:
        """Play the scheduled events in order until ``done()`` holds (looked at before each
        event), none is left, or the next one is after ``deadline_us``; whether ``done()``
        held. Checkers and faults act as in ``run`` (a violation raises)."""
        while self._heap and not done():
            if self._heap[0][0] > deadline_us:
                break
            at, _, event = heapq.heappop(self._heap)
            self.now = at
            self._dispatch(event)
        return done()

    def run(self) -> RunResult:
        started = time.perf_counter()
        self.start()
        chaotic = self.options.faults & {"crash", "partition", "pause", "member"}
        link_faults = self.options.faults & {"loss", "dup", "reorder"}
        if chaotic:
            self._push(self.rng_fault.randrange(200_000, 600_000), Chaos())
        heal_at = self.chaos_us if chaotic or link_faults else 0
        self._push(heal_at, Heal())
        if self.options.long_log:
            self._push(LONG_LOG_CHECK_US, LongLogStep())
        deadline = heal_at + self.heal_us
        try:
            while self._heap:
                at, _, event = heapq.heappop(self._heap)
                if at > deadline:
                    self.now = deadline
                    break
                self.now = at
                self._dispatch(event)
                if isinstance(event, Check) and self.chaos_over and self._finished():
                    break
            self._final_checks()
        except Violation as exc:
            self.result.violation = str(exc)
            self.result.violation_time_us = self.now
        except Stalled as exc:
            self.result.liveness = str(exc)
        except Exception as exc:  # a core that raises is a bug the sweep must report, replayable
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.result.violation = (
                f"{type(exc).__name__} raised at {where.filename}:{where.lineno} "
                f"({where.name}): {exc}"
            )
            self.result.violation_time_us = self.now
        self.result.trace_tail = self.trace[-20:]
        self.result.elapsed_s = time.perf_counter() - started
        self.result.sim_time_us = self.now
        return self.result

    def _dispatch(self, event: Event) -> None:
        self._handlers[type(event)](event)

    def _event_handlers(self) -> dict[type, Callable[[Any], None]]:
        """Each kind of event's handler (``_dispatch`` looks it up by the event's class:
        cheaper than trying kinds in turn, and a simulation plays millions of events)."""
        return {
            Frame: self._on_delivery,
            SnapshotArrival: self._on_delivery,
            Turn: self._on_turn,
            Tick: self._on_tick,
            Durable: self._on_durable,
            Propose: self._on_request,
            Read: self._on_request,
            Issue: self._on_issue,
            ClientTimeout: self._on_client_timeout,
            Resume: self._on_resume,
            Check: self._on_check,
            Chaos: lambda _: self._chaos(),
            Heal: lambda _: self._heal(),
            FaultCrash: self._on_fault_crash,
            FaultRestart: self._on_fault_restart,
            LongLogStep: lambda _: self._long_log_step(),
            LongLogRecover: lambda _: self._start_recovery_check(),
            RestartAll: self._on_restart_all,
            MemberRetry: lambda _: self._member_retry(),
        }

    def _on_delivery(self, event: Frame | SnapshotArrival) -> None:
        rep = self.replicas[event.rid]
        if event.incarnation != rep.incarnation:
            return  # sent to a replica that crashed since: the connection broke
        self._deliver(rep, event)

    def _on_turn(self, event: Turn) -> None:
        rep = self.replicas[event.rid]
        rep.turn_pending = False
        ready_to_run = rep.busy_until <= self.now and rep.paused_until <= self.now
        if rep.alive and event.incarnation == rep.incarnation and rep.inbox and ready_to_run:
            self._turn(rep)

    def _on_tick(self, event: Tick) -> None:
        self._push(self.now + self.tick_us, event)  # the same timer again (events are values)
        self._deliver(self.replicas[event.rid], event)

    def _on_durable(self, event: Durable) -> None:
        self._durable(self.replicas[event.rid], event)

    def _on_request(self, event: Propose | Read) -> None:
        self._deliver(self.replicas[event.rid], event)

    def _on_issue(self, event: Issue) -> None:
        self._issue(self._client(event.cid))

    def _on_client_timeout(self, event: ClientTimeout) -> None:
        self._client_timeout(self._client(event.cid), event)

    def _on_resume(self, event: Resume) -> None:
        rep = self.replicas[event.rid]
        if rep.alive and rep.paused_until <= self.now and rep.inbox:
            self._schedule_turn(rep)

    def _on_check(self, event: Check) -> None:
        if not self._finished():
            self._push(self.now + 50_000, Check())

    def _on_fault_crash(self, event: FaultCrash) -> None:
        rep = self.replicas[event.rid]
        down = sum(1 for r in self.replicas if not r.alive)
        f = self.f
        if self.membership:
            down, f = self._fault_budget()
        if rep.alive and down < f and not self.chaos_over:
            self._crash(rep)

    def _on_fault_restart(self, event: FaultRestart) -> None:
        if not self.replicas[event.rid].alive and not self.chaos_over:
            self._restart(self.replicas[event.rid])

    def _on_restart_all(self, event: RestartAll) -> None:
        for rep in self.replicas:
            if not rep.alive:
                self._restart(rep)

    def _deliver(self, rep: _Replica, event: InboxEvent) -> None:
        """Into the replica's inbox, for its next loop turn (a crashed replica drops it)."""
        if not rep.alive:
            return
        rep.inbox.append(event)
        self._schedule_turn(rep)

    def _schedule_turn(self, rep: _Replica) -> None:
        """Everything that arrives at one instant makes one turn (busy or paused: later)."""
        if rep.turn_pending or rep.busy_until > self.now or rep.paused_until > self.now:
            return
        rep.turn_pending = True
        self._push(self.now, Turn(rep.rid, rep.incarnation))

    def _client(self, cid: int) -> _Client:
        return self.clients[cid - 1000]

    # ------------------------------------------------------------------ a loop turn
    def _turn(self, rep: _Replica) -> None:
        items, rep.inbox = rep.inbox, []
        core = rep.core
        local = self._local(rep)
        for item in items:
            match item:  # the most frequent first: a match tries its cases in turn
                case Tick():
                    core.tick(local)
                    if self.options.sessions:
                        self._propose_log_time(rep, local)
                case Frame(messages=messages):
                    for message in messages:
                        core.step(message, local)
                case Propose(command=command):
                    core.propose(command, local)
                case Read(command=command):
                    core.read(command, local)
                case SnapshotArrival(snapshot=snapshot):
                    self._install_snapshot(rep, snapshot)
                case _:
                    assert_never(item)
        ready = core.ready()
        self._count_messages(ready)
        self._send(rep, ready.send)
        if not ready.persist:
            rep.unsynced.extend(ready.log)
        elif self.fsync_us > 0:
            rep.busy_until = self.now + self.fsync_us
            self._push(rep.busy_until, Durable(rep.rid, rep.incarnation, ready))
            return
        else:
            self._synced(rep, ready)
        self._after_persist(rep, ready)

    def _propose_log_time(self, rep: _Replica, local: int) -> None:
        """Sessions mode: what the node does (``TurnLoop._propose_log_time``), on the
        replica's clock in log-time units."""
        clock = LOG_TIME_START + local // LOG_TIME_UNIT_US
        table = rep.store.sessions
        if clock < rep.log_time_proposed + table.limits.time_step_s:
            return
        if not table.time_due(clock - rep.rid % LOG_TIME_STAGGERS):
            return
        rep.log_time_proposed = clock
        rep.core.propose(log_time_command(clock), local)

    @staticmethod
    def _synced(rep: _Replica, ready: Ready) -> None:
        """An fsync of ``ready.persist`` completed: it covers what was written before it."""
        rep.durable.extend(rep.unsynced)
        rep.unsynced.clear()
        rep.durable.extend(ready.persist)
        rep.durable.extend(ready.log)

    def _durable(self, rep: _Replica, event: Durable) -> None:
        ready = event.ready
        if event.incarnation != rep.incarnation or not rep.alive:
            return
        rep.busy_until = -1
        self._synced(rep, ready)
        self._after_persist(rep, ready)
        if rep.inbox:
            self._schedule_turn(rep)

    def _check_conflict_order(self, rep: _Replica, command: Command) -> None:
        """Partial-order cores: ``command`` comes next under each of its keys on every
        replica."""
        identity = (command.client_id, command.seq)
        for key in command.keys or (*self.keys, "*"):
            canon = self.key_canon.setdefault(key, [])
            position = rep.key_positions.get(key, 0)
            if position < len(canon):
                if canon[position] != identity:
                    raise Violation(
                        f"replica {rep.rid} executed {identity} as command {position} on key "
                        f"{key!r}, others executed {canon[position]}"
                    )
            else:
                canon.append(identity)
            rep.key_positions[key] = position + 1

    def _after_persist(self, rep: _Replica, ready: Ready) -> None:
        self._send(rep, ready.send_after_persist)
        for execution in ready.executions():
            if self.partial_order:
                self._check_conflict_order(rep, execution.command)
                result = rep.store.apply(execution.position, execution.command)
                if execution.led_here:
                    self._executed(rep, execution.command, result)
                continue
            identity = (
                execution.slot,
                execution.offset,
                execution.command.client_id,
                execution.command.seq,
            )
            position = rep.canon_position
            if position < len(self.canon):
                if self.canon[position] != identity:
                    raise Violation(
                        f"replica {rep.rid} executed {identity} at position {position}, "
                        f"others executed {self.canon[position]}"
                    )
            else:
                self.canon.append(identity)
            rep.canon_position += 1
            result = rep.store.apply(execution.position, execution.command)
            if execution.led_here:
                self._executed(rep, execution.command, result)
        for command in ready.ready:
            self._ready(rep, command)
        for command in ready.reads:
            self._read_done(rep, command, rep.store.query(command.op))
        for failure in ready.failed:
            self._failed(failure.command, failure.definite)
        for peer in sorted(set(ready.snapshot_requests)):
            self._send_snapshot(rep, peer)
        rep.core.advance(ready)
        rep.applied_since_snapshot += ready.applied_count()
        every = self.options.snapshot_every
        if ready.snapshot_now or (every and rep.applied_since_snapshot >= every):
            self._take_snapshot(rep)

    # ------------------------------------------------------------------ snapshots
    def _take_snapshot(self, rep: _Replica) -> None:
        """As the driver does: the core is compacted to the previous snapshot (its memory
        keeps the last interval for peers a little behind)."""
        meta = rep.core.snapshot_meta()
        previous, rep.snapshot = rep.snapshot, (meta, rep.store.snapshot())
        if self.partial_order:
            self._key_positions_at[meta] = dict(rep.key_positions)
        # the first snapshot compacts nothing; later ones compact to the one before
        records = rep.core.durable_records() if previous is None else rep.core.compact(
            previous[0]
        )
        rep.durable = list(records)
        rep.unsynced.clear()  # the rewritten records cover everything beyond the snapshot
        rep.applied_since_snapshot = 0
        self.result.snapshots_taken += 1

    def _send_snapshot(self, rep: _Replica, peer: int) -> None:
        if rep.snapshot is None:
            return
        snapshot = rep.snapshot
        if self.options.use_codec:
            # as the node sends it: its snapshot file's encoding, decoded by the receiver
            meta, state = snapshot
            try:
                snapshot = decode_snapshot(encode_snapshot(meta, state))
            except DecodeError as exc:
                raise Violation(
                    f"replica {peer} refuses replica {rep.rid}'s snapshot at slot {meta.slot}: "
                    f"{exc}"
                ) from None
            if snapshot != (meta, state):
                raise Violation(f"replica {rep.rid}'s snapshot at slot {meta.slot} decodes "
                                "to another one")
        for at in self.network.arrivals(rep.rid, peer, self.now):
            self._push(at, SnapshotArrival(peer, self.replicas[peer].incarnation, snapshot))

    def _install_snapshot(self, rep: _Replica, snapshot: tuple[SnapshotMeta, bytes]) -> None:
        """What the driver does with a peer's snapshot: ignore it unless it is ahead."""
        meta, state = snapshot
        accepts = getattr(rep.core, "accepts_snapshot", None)
        if accepts is not None:
            if not accepts(meta):
                return
        elif meta.slot <= rep.core.exec_slot or len(meta.exec_counts) != self.n:
            return
        records = rep.core.install_snapshot(meta)
        if rep.core.exec_slot != meta.slot:
            return  # the core refused it (EPaxos: it does not cover all we executed)
        self._log(f"replica {rep.rid} installs a snapshot at slot {meta.slot}")
        rep.store.restore(state)
        rep.snapshot = snapshot
        rep.durable = list(records)
        rep.key_positions = dict(self._key_positions_at.get(meta, {}))
        rep.unsynced.clear()
        rep.canon_position = self._canon_index(meta.slot)
        rep.applied_since_snapshot = 0
        self.result.snapshots_installed += 1

    def _send(self, rep: _Replica, outgoing: list[Outgoing]) -> None:
        """One send step of ``rep``: per destination, the frames the node would send (with
        the codec, decoded as the receiver would; without, the messages as they are), each
        over the network on its own."""
        if not outgoing:
            return
        frames: dict[int, list[list[PeerMessage]]]
        if self.options.use_codec:
            frames = self._through_codec(rep, outgoing)
        else:
            frames = {}
            for out in outgoing:
                frames.setdefault(out.to, [[]])[0].append(out.message)
        for to in sorted(frames):
            for messages in frames[to]:
                for at in self.network.arrivals(rep.rid, to, self.now):
                    self._push(at, Frame(to, self.replicas[to].incarnation, messages))

    def _through_codec(
        self, rep: _Replica, outgoing: list[Outgoing]
    ) -> dict[int, list[list[PeerMessage]]]:
        """Encode as the node does (``frames_by_peer`` with the transport's frame limit),
        then decode every frame as its receiver would, lost or not: the decoded messages are
        what is delivered. A message the codec cannot carry is a violation of this seed (a
        real cluster would drop the frame and its connection, and stall or worse)."""
        try:
            encoded = frames_by_peer(outgoing, MAX_FRAME)
        except (LocalProtocolError, TypeError) as exc:
            raise Violation(
                f"replica {rep.rid} cannot encode what it sends ({_summary(outgoing)}): "
                f"{type(exc).__name__}: {exc}"
            ) from None
        delivered: dict[int, list[list[PeerMessage]]] = {}
        for to, payloads in encoded.items():
            frames = []
            for payload in payloads:
                try:
                    if len(payload) > MAX_FRAME:  # the receiver's FrameReader refuses it
                        raise DecodeError(f"frame of {len(payload)} bytes is over {MAX_FRAME}")
                    frames.append(decode_frame(payload, lazy_batches=True))
                except DecodeError as exc:
                    sent = [out for out in outgoing if out.to == to]
                    raise Violation(
                        f"replica {to} refuses a frame of {len(payload)} bytes from replica "
                        f"{rep.rid} ({_summary(sent)}): {exc}"
                    ) from None
            delivered[to] = frames
            # a codec that decodes something else than it encoded breaks the protocol
            # silently: compare (frozen dataclasses compare by value)
            sent_messages = [out.message for out in outgoing if out.to == to]
            if [m for frame in frames for m in frame] != sent_messages:
                raise Violation(
                    f"replica {to} decodes other messages than replica {rep.rid} encoded "
                    f"({_summary([out for out in outgoing if out.to == to])})"
                )
        return delivered

    def _count_messages(self, ready: Ready) -> None:
        counts = self.result.messages
        for out in ready.send_after_persist + ready.send:
            name = type(out.message).__name__
            counts[name] = counts.get(name, 0) + 1

    # ------------------------------------------------------------------ clients
    def _issue(self, client: _Client) -> None:
        if client.cid in self._probes and client.op is None:
            self._issue_probe(client)
            return
        if self.issued >= self.ops_budget:
            return
        if self._phase == "load" and self.options.long_log:
            # stop at the length asked for (the phase check comes too rarely for that)
            executed = self.replicas[client.home].core.executed_through()
            if executed >= self.options.long_log:
                self._phase = "drain"
                self.ops_budget = self.issued
                self._log(f"long log: {executed:,} slots executed; draining")
                return
        self.issued += 1
        client.seq += 1
        rng = self.rng_work
        key = rng.choice(self.keys)
        value = f"{client.cid}-{client.seq}"
        choice = rng.random()
        workload = "writes" if self.options.long_log else self.options.workload
        if workload != "mixed":
            choice = 0.0 if workload == "writes" else 0.5
        reads = self.options.reads
        op: dict[str, Any]
        if choice < 0.35:
            op = {"kind": "write", "input": value, "bytes": kv_put(key, value), "blind": True}
        elif choice < 0.8:
            via_lease = reads == "lease" or (reads == "mixed" and rng.random() < 0.5)
            op = {"kind": "read", "input": None, "bytes": kv_get(key), "blind": False,
                  "lease": via_lease}
        else:
            expected = rng.choice([None, *[f"{c.cid}-{c.seq}" for c in self.clients[:3]]])
            op = {"kind": "cas", "input": (expected, value), "bytes": kv_cas(key, expected, value),
                  "blind": False}
        # drawn only when asked for, so that runs without keyless updates replay as before
        share = self.options.keyless
        keyless = op["kind"] != "read" and share > 0 and rng.random() < share
        command = Command(client_id=client.cid, seq=client.seq, op=op["bytes"],
                          keys=() if keyless else (key,), blind=op["blind"])
        if self.options.sessions:
            # a request of a session that may be evicted is answered once it ran (the node
            # drops ``blind``), and some are a one-shot session's only one
            last = rng.random() < ONE_SHOT_SHARE
            command = command._replace(seq=self._session_seq(client, last=last), blind=False)
        op.update(key=key, command=command, call=self.now, attempt=0, site=client.home,
                  attempts=self._attempts(Kind.READ if op["kind"] == "read" else Kind.COMMAND))
        client.op = op
        self._submit(client)

    def _attempts(self, kind: Kind) -> Attempts:
        """A client's account of one operation (``consensus.attempts``), as the native client
        keeps it: an update is settled after ``CLIENT_ATTEMPTS`` unanswered attempts, and the
        settling goes on until it is answered (the run heals in the end); a read is sent
        again until it is answered."""
        limit = CLIENT_ATTEMPTS if kind is Kind.COMMAND else None
        return Attempts(kind, limit, None,
                        trust_definite="trust_definite" in self.options.unsafe)

    def _session_seq(self, client: _Client, *, last: bool = False) -> int:
        """Sessions mode: the client's next sequence number (``consensus.sessions``), in a new
        session if it has none open."""
        if not client.open_by or client.counter >= COUNTER_LIMIT:
            self._renew(client, 0)
        number = session_seq(client.open_by, client.counter, last=last)
        client.counter = COUNTER_LIMIT if last else client.counter + 1  # closed: a new one
        return number

    def _renew(self, client: _Client, log_time: int) -> None:
        """Sessions mode: open a new session, from the true time or ``log_time`` (what a
        ``SessionExpired`` said), whichever is later."""
        start = max(LOG_TIME_START + self.now // LOG_TIME_UNIT_US, log_time)
        client.open_by = max(start + SIM_OPEN_WINDOW, client.open_by + 1)
        client.counter = 0

    def _submit(self, client: _Client) -> None:
        op = client.op
        assert op is not None
        if self.membership:
            # a client knows the members (as ``sdpaxos member list`` tells it): it asks the
            # voters of the latest configuration, in turn
            voters = self._latest_config().voters
            target = voters[(client.home + op["attempt"]) % len(voters)]
        else:
            target = (client.home + op["attempt"]) % self.n
        request = Read if op.get("lease") else Propose
        self._push(self.now, request(target, op.get("cancel", op["command"])))
        op["proposed_at"] = op.get("proposed_at", self.now)
        timeout = 2 * self.config.election_timeout_us
        self._push(self.now + timeout, ClientTimeout(client.cid, client.seq, op["attempt"]))

    def _client_timeout(self, client: _Client, event: ClientTimeout) -> None:
        op = client.op
        if op is None or client.seq != event.seq or op["attempt"] != event.attempt:
            return
        self._next_attempt(client, op, Answer.UNKNOWN)

    def _next_attempt(self, client: _Client, op: dict[str, Any], answer: Answer) -> None:
        """What the client does after an attempt that gave no result (``Attempts.after``):
        the same (client id, seq) to the next replica, or its cancel once settling, or —
        after a definite failure that ends it — nothing: the operation never happened, and
        stays out of the history (what the checker must find true)."""
        step = op["attempts"].after(answer)
        if step is Step.DONE:  # a refusal that ends the operation
            self.result.ops_failed += 1
            client.op = None
            self._push(self.now + self.rng_work.randrange(self.think_us + 1), Issue(client.cid))
            return
        assert step is not Step.GIVE_UP, "simulated clients never give up"
        if step is Step.SETTLE and "cancel" not in op:
            command = op["command"]
            op["cancel"] = Command(client_id=command.client_id, seq=command.seq, op=CANCEL_OP,
                                   keys=(), blind=False)
        op["attempt"] += 1  # the next replica
        self._submit(client)

    def _open(self, command: Command) -> tuple[_Client, dict[str, Any]] | None:
        """The open operation an answer about ``command`` is for: a client settling an
        operation listens to its cancel alone (late answers to the operation's own copies go
        to connections it left, as the native client's do)."""
        if not 1000 <= command.client_id < 1000 + len(self.clients):
            return None
        client = self._client(command.client_id)
        op = client.op
        if op is None or op["command"].seq != command.seq or ("cancel" in op) != (
            command.op == CANCEL_OP
        ):
            return None
        return client, op

    def _ready(self, rep: _Replica, command: Command) -> None:
        opened = self._open(command)
        if opened is None:
            return
        client, op = opened
        if self.on_ready is not None:
            self.on_ready(rep.rid, command, op["call"])
        if "ready_at" not in op:
            op["ready_at"] = self.now
            site = SITES[rep.rid] if rep.rid < len(SITES) else str(rep.rid)
            self.result.ready_latency_us.setdefault(site, []).append(self.now - op["call"])
        if command.blind:
            self._complete(client, op, None)

    def _executed(self, rep: _Replica, command: Command, result: bytes) -> None:
        opened = self._open(command)
        if opened is None:
            return
        client, op = opened
        if result.startswith(SESSION_MARK):  # cancelled: the request never ran, nor will
            self._next_attempt(client, op, Answer.REFUSED)
            return
        if result is SESSION_EXPIRED:
            self._session_expired(client, op, rep.store.sessions.now)
            return
        if command.blind:
            return  # answered when it was ready
        decoded = msgpack.unpackb(result)
        if decoded[0] == "expired":
            raise Violation(f"session expired for {command.client_id}:{command.seq}")
        # get: the value; cas: swapped; a write settled after it ran: ["ok"]
        output = None if op["kind"] == "write" else decoded[1]
        site = SITES[rep.rid] if rep.rid < len(SITES) else str(rep.rid)
        self.result.executed_latency_us.setdefault(site, []).append(self.now - op["call"])
        self._complete(client, op, output)

    def _session_expired(self, client: _Client, op: dict[str, Any], log_time: int) -> None:
        """Sessions mode: the request's session is gone, it was not applied. If no other copy
        may have run (``Attempts``: nothing uncertain), it never ran: again in a new session,
        as the native client does. Otherwise a copy may have run before the session went: its
        outcome is unknown (a history operation without a return), and the client moves on."""
        self.result.sessions_expired += 1
        self._renew(client, log_time)
        if op["attempts"].after(Answer.EXPIRED) is Step.DONE:  # no other copy may have run
            command = op["command"]
            op["command"] = command._replace(
                seq=self._session_seq(client, last=bool(command.seq & LAST)))
            op["attempts"] = self._attempts(op["attempts"].kind)  # a new request
            self._submit(client)
            return
        self.result.history.append(Operation(
            client=client.cid, key=op["key"], op=op["kind"], input=op["input"], output=None,
            call=op["call"], ret=None))
        self.result.outcomes_unknown += 1
        client.op = None
        self._push(self.now + self.rng_work.randrange(self.think_us + 1), Issue(client.cid))

    def _read_done(self, rep: _Replica, command: Command, result: bytes) -> None:
        opened = self._open(command)
        if opened is None:
            return
        client, op = opened
        self._complete(client, op, msgpack.unpackb(result)[1])

    def _failed(self, command: Command, definite: bool) -> None:
        opened = self._open(command)
        if opened is None:
            return
        client, op = opened
        self._next_attempt(client, op, Answer.REFUSED if definite else Answer.UNKNOWN)

    def _complete(self, client: _Client, op: dict[str, Any], output: Any) -> None:
        self.result.history.append(
            Operation(
                client=client.cid,
                key=op["key"],
                op=op["kind"],
                input=op["input"],
                output=output,
                call=op["call"],
                ret=self.now,
            )
        )
        self.result.ops_completed += 1
        client.op = None
        if op.get("probe"):
            self._probes.discard(client.cid)
        self._push(self.now + self.rng_work.randrange(self.think_us + 1), Issue(client.cid))

    # ------------------------------------------------------------------ long-log mode
    def _long_log_step(self) -> None:
        """The long-log mode's phases, looked at every ``LONG_LOG_CHECK_US``: load until the
        log holds ``long_log`` slots; drain (no operation open, every replica executed the
        same prefix); crash what the next restart names and restart it; then the cluster
        must serve again (a log read at every site answered, every replica executed what
        the others did) within ``recovery_bound_us``, or the run fails with what was stuck."""
        if self._phase == "done":
            return
        self._push(self.now + LONG_LOG_CHECK_US, LongLogStep())
        executed = max(r.core.executed_through() for r in self.replicas)
        if executed > self._progress[0] or self._phase in ("down", "recover"):
            self._progress = (executed, self.now)
        elif self.now - self._progress[1] > self.options.recovery_bound_us:
            # loading or draining, nothing executed for a whole bound: stuck before a restart
            raise Stalled(
                f"long log: nothing executed for {self.options.recovery_bound_us / 1000:.0f} "
                f"ms of simulated time in the {self._phase} phase, at {executed:,} slots; "
                f"{self._replica_states()}"
            )
        if self._phase == "drain" and self._converged(0):
            self._crash_for(self._restarts_left.pop(0), self.replicas[0].core.executed_through())
        elif self._phase == "recover":
            took = self.now - self._restarted_at
            if not self._probes and self._converged(self._frontier):
                self.result.long_log[-1]["recovered_ms"] = took / 1000
                self._log(f"long log: serving again {took / 1000:.1f} ms after the restart")
                if self._restarts_left:
                    self._phase = "drain"
                else:
                    self._phase = "done"
            elif took > self.options.recovery_bound_us:
                event = self.result.long_log[-1]
                open_sites = sorted(SITES[c.home] if c.home < len(SITES) else str(c.home)
                                    for c in self.clients if c.cid in self._probes)
                snapshot = "" if self.options.snapshot_every else " (snapshots off)"
                raise Stalled(
                    f"long log: the cluster did not serve again within the bound of "
                    f"{self.options.recovery_bound_us / 1000:.0f} ms of simulated time after "
                    f"restarting {event['restart']} (replicas {event['replicas']}) with "
                    f"{event['slots']:,} slots in the log{snapshot}: log reads still "
                    f"unanswered at {', '.join(open_sites) or 'no site'}; "
                    f"{self._replica_states()}"
                )

    def _converged(self, at_least: int) -> bool:
        """No client operation open; every replica up and through the same slot, at least
        ``at_least`` (an inbox may hold a tick: checks and ticks share instants)."""
        if any(c.op is not None for c in self.clients):
            return False
        if not all(r.alive for r in self.replicas):
            return False
        executed = {r.core.executed_through() for r in self.replicas}
        return len(executed) == 1 and min(executed) >= at_least

    def _crash_for(self, kind: str, slots: int) -> None:
        """Crash what restart ``kind`` names. The sequencer comes back after twice the
        election timeout (the others change views without it meanwhile), the whole cluster
        one tick later (nobody is left to notice the difference)."""
        victims = [self._sequencer_guess()] if kind == "one" else list(range(self.n))
        self.result.long_log.append(
            {"restart": "the sequencer" if kind == "one" else "every replica",
             "replicas": victims, "slots": slots}
        )
        for rid in victims:
            self._crash(self.replicas[rid])
        self._frontier = slots
        self._phase = "down"
        down = 2 * self.config.election_timeout_us if kind == "one" else self.tick_us
        self._restarted_at = self.now + down
        self._push(self._restarted_at, RestartAll())
        self._push(self._restarted_at, LongLogRecover())

    def _start_recovery_check(self) -> None:
        """Restarted: every site's first client owes a read through the log (answered once
        its replica executed up to it, so the restarted one must have caught up)."""
        self._phase = "recover"
        for client in self.clients[: self.n]:
            self._probes.add(client.cid)
            self._push(self.now, Issue(client.cid))

    def _issue_probe(self, client: _Client) -> None:
        self.issued += 1
        self.ops_budget += 1
        client.seq += 1
        key = self.rng_work.choice(self.keys)
        command = Command(client_id=client.cid, seq=client.seq, op=kv_get(key), keys=(key,),
                          blind=False)
        client.op = {"kind": "read", "input": None, "bytes": command.op, "blind": False,
                     "lease": False, "probe": True, "key": key, "command": command,
                     "call": self.now, "attempt": 0, "site": client.home,
                     "attempts": self._attempts(Kind.READ)}
        self._submit(client)

    def _replica_states(self) -> str:
        """Each replica's execution frontier and view, for a stall's message."""
        parts = []
        for r in self.replicas:
            view = getattr(r.core, "view", None)
            ready = getattr(r.core, "view_ready", None)
            state = "up" if r.alive else "down"
            parts.append(f"replica {r.rid} {state}, executed through {r.core.executed_through():,}"
                         + (f", view {view}" if view is not None else "")
                         + (" (not ready)" if ready is False else ""))
        return "; ".join(parts)

    # ------------------------------------------------------------------ faults
    def _chaos(self) -> None:
        if self.chaos_over:
            return
        rng, faults = self.rng_fault, self.options.faults
        actions = []
        unavailable = sum(1 for r in self.replicas if not r.alive or r.paused_until > self.now)
        f = self.f
        if self.membership:
            unavailable, f = self._fault_budget()
        if "crash" in faults:
            if unavailable < f:
                actions += ["crash", "crash_sequencer", "crash_burst"]
            if any(not r.alive and not r.wiped for r in self.replicas):
                actions += ["restart", "restart"]
        if "partition" in faults:
            actions += ["isolate_sequencer", "split", "one_way"]
            if self.now >= self._isolated_until:
                actions += ["heal_links", "heal_links"]
            if "crash" in faults and unavailable == 0 and f >= 2:
                actions.append("split_sequencer_pair")
        if "pause" in faults and unavailable < f:
            actions.append("pause")
        if self.membership:
            actions += self._member_actions(unavailable, f)
        if actions:
            self._apply_fault(rng.choice(actions))
        self._push(self.now + rng.randrange(100_000, 1_000_000), Chaos())

    def _sequencer_guess(self) -> int:
        """The replica the protocol leans on most: the stable leader of a core that has one
        (Multi-Paxos), else the sequencer of the highest view (SDPaxos; 0 for Mencius)."""
        leader = getattr(self.replicas[0].core, "leader", None)
        if isinstance(leader, int):
            return leader
        if self.membership:
            alive = [r for r in self.replicas if r.alive] or self.replicas
            furthest = max(alive, key=lambda r: (r.core.view, r.rid))
            sequencer: int = furthest.core.sequencer  # type: ignore[attr-defined]
            return sequencer
        views = [getattr(r.core, "view", 0) for r in self.replicas if r.alive]
        return max(views, default=0) % self.n

    def _apply_fault(self, action: str) -> None:
        rng, n = self.rng_fault, self.n
        f = self.f
        if self.membership:
            n = len(self.replicas)
            f = self._fault_budget()[1]
            if action.startswith("member_"):
                self._member_fault(action)
                return
        alive = [r.rid for r in self.replicas if r.alive]
        if action in ("crash", "crash_sequencer"):
            victim = self._sequencer_guess() if action == "crash_sequencer" else rng.choice(alive)
            if victim in alive:
                self._crash(self.replicas[victim])
        elif action == "restart":
            down = [r.rid for r in self.replicas if not r.alive and not r.wiped]
            self._restart(self.replicas[rng.choice(down)])
        elif action == "isolate_sequencer":
            # long enough for the rest to elect a new sequencer and write, while clients of
            # the old one still talk to it (the case sequencer leases exist for)
            self.network.isolate(self._sequencer_guess(), n)
            self._isolated_until = self.now + rng.randrange(1_000_000, 2_500_000)
            self._log(f"fault: isolate replica {self._sequencer_guess()}")
        elif action == "split":
            side = set(rng.sample(range(n), rng.randrange(1, f + 1)))
            self.network.split(side, n)
            self._log(f"fault: split off {sorted(side)}")
        elif action == "one_way":
            a, b = rng.sample(range(n), 2)
            self.network.cut(a, b)
            self._log(f"fault: cut {a}->{b}")
        elif action == "crash_burst":
            # kill -9 in quick succession: crash, restart within a few ms, crash another
            first = self.replicas[rng.choice(alive)]
            self._crash(first)
            again = self.now + rng.randrange(500, 5_000)
            self._push(again, FaultRestart(first.rid))
            others = [r for r in alive if r != first.rid]
            self._push(again + rng.randrange(0, 3_000), FaultCrash(rng.choice(others)))
        elif action == "split_sequencer_pair":
            # the sequencer and one replica go on alone, then both die (Figure 7's case)
            sequencer = self._sequencer_guess()
            partner = rng.choice([r for r in range(n) if r != sequencer])
            self.network.split({sequencer, partner}, n)
            self._log(f"fault: split off sequencer {sequencer} with {partner}")
            later = self.now + rng.randrange(5_000, 200_000)
            self._push(later, FaultCrash(sequencer))
            self._push(later + rng.randrange(0, 2_000), FaultCrash(partner))
        elif action == "heal_links":
            self.network.heal()
            self._log("fault: links healed")
        elif action == "pause":
            paused = self.replicas[rng.choice(alive)]
            paused.paused_until = self.now + rng.randrange(100_000, 1_500_000)
            self._push(paused.paused_until, Resume(paused.rid))
            self._log(f"fault: pause replica {paused.rid} until {paused.paused_until / 1000:.0f}")

    # ------------------------------------------------------------------ membership faults
    def _latest_config(self) -> Configuration:
        """The configuration of the member furthest along (epoch, then execution)."""
        known = [r for r in self.replicas if not r.wiped] or self.replicas
        furthest = max(known, key=lambda r: (r.core.config.epoch,  # type: ignore[attr-defined]
                                             r.core.exec_slot, -r.rid))
        config: Configuration = furthest.core.config  # type: ignore[attr-defined]
        return config

    def _fault_budget(self) -> tuple[int, int]:
        """(voters that matter and are unavailable, how many may be): the voters of the
        latest configuration and, while its epoch closes, of the next one."""
        config = self._latest_config()
        sets = [config.voters]
        if config.closing:
            sets.append(next_epoch(config, config.base).voters)
        voters = set().union(*sets)
        unavailable = sum(
            1 for rid in voters
            if rid >= len(self.replicas) or not self.replicas[rid].alive
            or self.replicas[rid].paused_until > self.now
        )
        return unavailable, min((len(v) - 1) // 2 for v in sets)

    def _member_actions(self, unavailable: int, f: int) -> list[str]:
        config = self._latest_config()
        if config.closing or config.learners or self._wanted is not None:
            # one change at a time: a second one is refused (a move publishes at any time)
            return ["member_refused", "member_move"]
        actions = ["member_move"]
        if len(config.members) < MAX_MEMBERS:
            actions += ["member_add", "member_replace"]
            # a disk is lost only while every live member is in the latest epoch: an epoch
            # some member still has to finish must keep a majority of its own voters' disks
            # (two of three lost there is beyond what any Paxos survives)
            settled = all(r.core.config.epoch == config.epoch  # type: ignore[attr-defined]
                          for r in self.replicas if r.alive and not r.wiped)
            if unavailable < f and settled:
                actions.append("member_replace_wiped")
        if len(config.voters) > MIN_VOTERS:
            actions += ["member_remove", "member_remove_sequencer"]
        return actions

    def _member_fault(self, action: str) -> None:
        """Propose a membership change at a voter (and start the new member it names)."""
        rng = self.rng_fault
        config = self._latest_config()
        new = len(self.replicas)
        if action == "member_move":
            self._move(rng.choice([m.id for m in config.members]))
            return
        if action == "member_refused":
            change = Change(ADD, member=0)  # refused whatever else is under way: ids are
            # never reused (and one change at a time)
        elif action == "member_add":
            change = Change(ADD, member=new)
        elif action in ("member_replace", "member_replace_wiped"):
            victim = rng.choice(config.voters)
            if action == "member_replace_wiped":
                rep = self.replicas[victim]
                if rep.alive:
                    self._crash(rep)
                rep.wiped = True  # its disk is gone: never restarted as itself
                rep.durable, rep.snapshot = [], None
                self._log(f"fault: replica {victim}'s disk wiped")
            change = Change(REPLACE, member=new, replaces=victim)
        elif action == "member_remove_sequencer":
            change = Change(REMOVE, member=self._sequencer_guess())
        else:
            change = Change(REMOVE, member=rng.choice(config.voters))
        if change.kind in (ADD, REPLACE) and action != "member_refused":
            self._add_replica(new)
        if action != "member_refused":
            if self._wanted is None:
                self._push(self.now + MEMBER_RETRY_US, MemberRetry())
            self._wanted = change
        self._propose_change(change)

    def _move(self, rid: int) -> None:
        """Member ``rid`` runs somewhere else from now on (its core publishes where; a
        restart keeps it): as a replica restarted with new addresses in its cluster file."""
        rep = self.replicas[rid]
        self._moves += 1
        rep.info = f"sim:{rid}.{self._moves}"
        if isinstance(rep.core, MemberReplica):
            rep.core.info = rep.info
        self._log(f"member: {rid} moves to {rep.info}")

    def _propose_change(self, change: Change) -> None:
        config = self._latest_config()
        voters = [v for v in config.voters if self.replicas[v].alive]
        if not voters:
            return
        at = self.rng_fault.choice(voters)
        self._member_seq += 1
        command = Command(client_id=MEMBER_CLIENT, seq=self._member_seq,
                          op=encode_change(change), keys=())
        self._log(f"member: propose {change.kind} {change.member}"
                  + (f" replacing {change.replaces}" if change.kind == REPLACE else "")
                  + f" at replica {at}")
        self._push(self.now, Propose(at, command))

    def _member_retry(self) -> None:
        change = self._wanted
        if change is None:
            return
        config = self._latest_config()
        if (config.member(change.member) is None) == (change.kind == REMOVE):
            self._wanted = None  # it took effect
            return
        if not config.closing and not (config.learners and change.kind != REMOVE):
            self._propose_change(change)
        self._push(self.now + MEMBER_RETRY_US, MemberRetry())

    def _add_replica(self, rid: int) -> None:
        """A new member's process starts (empty: it learns once the change is executed)."""
        self.rng_core.append(random.Random(self.rng_fault.getrandbits(64)))
        delays = self.network.one_way_us
        if self.options.network == "wan":
            site = SITES[rid % len(SITES)]
            link = [int(site_rtt_ms(SITES[a % len(SITES)], site) * 1000) // 2
                    for a in range(rid)]
        else:
            link = [100] * rid
        for a, row in enumerate(delays):
            row.append(link[a])
        delays.append([*link, 0])
        rep = self._new_replica(rid, contacts=self._latest_config().voters)
        if "drift" in self.options.faults:
            bound = self.config.max_drift_ppm / 1_000_000 * 0.9
            rep.rate = 1 + self.rng_fault.uniform(-bound, bound)
            rep.offset = self.rng_fault.randrange(0, 1_000_000)
        self.replicas.append(rep)
        self._push(self.now, Tick(rid))

    def _active(self) -> list[_Replica]:
        """The replicas that must converge: every member of the latest configuration (all of
        them without membership faults)."""
        if not self.membership:
            return self.replicas
        config = self._latest_config()
        return [r for r in self.replicas if config.member(r.rid) is not None]

    def _crash(self, rep: _Replica) -> None:
        self._log(f"fault: crash replica {rep.rid}")
        if rep.busy_until > self.now:
            # the fsync in flight did not finish: a random prefix of its records made it
            for _, _, event in self._heap:
                if (isinstance(event, Durable) and event.rid == rep.rid
                        and event.incarnation == rep.incarnation):
                    records = event.ready.persist
                    rep.durable.extend(records[: self.rng_fault.randrange(len(records) + 1)])
        rep.unsynced.clear()
        rep.alive = False
        rep.incarnation += 1
        rep.inbox.clear()
        rep.busy_until = -1
        rep.turn_pending = False
        self.down_since[rep.rid] = self.now

    def _restart(self, rep: _Replica) -> None:
        if rep.wiped:
            return  # its identity is gone: it is replaced, never restarted as itself
        at = ""
        if rep.snapshot is not None:
            at = f" after a snapshot at slot {rep.snapshot[0].slot}"
            self.result.restarts_from_snapshot += 1
        self._log(f"fault: restart replica {rep.rid} from {len(rep.durable)} durable records{at}")
        fresh = self._new_replica(rep.rid, rep.durable, rep.snapshot, rep.contacts)
        fresh.incarnation = rep.incarnation
        fresh.rate, fresh.offset = rep.rate, rep.offset
        self.replicas[rep.rid] = fresh
        self.down_since.pop(rep.rid, None)
        self._push(self.now, Tick(rep.rid))

    def _heal(self) -> None:
        self.chaos_over = True
        self._push(self.now + 50_000, Check())
        self._log("heal: all faults off")
        self.network.heal()
        self.network.faults = LinkFaults()
        for rep in list(self.replicas):
            if not rep.alive:
                self._restart(rep)
            elif rep.paused_until > self.now:
                rep.paused_until = self.now
                self._push(self.now, Resume(rep.rid))
        for client in self.clients:  # waiting on a replica that was down: go again now
            if client.op is not None:
                # the attempt under way is left unanswered, as a timeout leaves it: its copy
                # may still run, which the client's account must know (an EXPIRED answer to
                # the next copy then does not make it send the operation as a new request)
                self._next_attempt(client, client.op, Answer.UNKNOWN)

    # ------------------------------------------------------------------ the end
    def _finished(self) -> bool:
        if self._phase not in ("load", "done"):
            return False
        if self.issued < self.ops_budget or any(c.op is not None for c in self.clients):
            return False
        active = self._active()
        if not all(r.alive and not r.inbox for r in active):
            return False
        executed = {r.core.executed_through() for r in active}
        if len(executed) != 1:
            return False
        if self.membership and not self._published(active):
            return False
        snapshots = {self._state_of(r) for r in active}
        return len(snapshots) == 1

    def _published(self, active: list[_Replica]) -> bool:
        """Every voter's entry holds the info it runs with (``publish``), as each member's
        configuration has it."""
        for rep in active:
            config: Configuration = rep.core.config  # type: ignore[attr-defined]
            for voter in config.voters:
                entry = config.member(voter)
                if entry is None or entry.info != self.replicas[voter].info:
                    return False
        return True

    def _state_of(self, rep: _Replica) -> bytes:
        """The replica's state, to compare with the others'. A partial-order core may run one
        client's independent commands in different orders on different replicas, and the
        session table keeps its results in execution order: compared sorted by seq."""
        state = rep.store.snapshot()
        if not self.partial_order:
            return state
        position, items, (fmt, now, pinned, sessions, gone) = msgpack.unpackb(state)
        canonical = [fmt, now, [[client, floor, sorted(results)]
                                for client, floor, results in pinned],
                     [[*session[:3], sorted(session[3]), *session[4:]] for session in sessions],
                     gone]
        packed: bytes = msgpack.packb([position, items, canonical])
        return packed

    def _final_checks(self) -> None:
        logs = [r.core.committed_log() for r in self.replicas]
        for slot in sorted(set().union(*logs)):
            values = {tuple((c.client_id, c.seq) for c in log[slot]) for log in logs if slot in log}
            if len(values) > 1:
                raise Violation(f"slot {slot} holds different commands on different replicas")
        if self.membership:
            self._check_configurations()
        pending = [c for c in self.clients if c.op is not None]
        history = list(self.result.history)
        for client in pending:
            op = client.op
            assert op is not None
            history.append(
                Operation(client=client.cid, key=op["key"], op=op["kind"], input=op["input"],
                          output=None, call=op["call"], ret=None)
            )
        verdict = check_history(history, timeout_s=self.options.lincheck_timeout_s)
        if verdict.verdict is Verdict.ILLEGAL:
            raise Violation(f"history not linearizable: {verdict.detail}")
        self.result.checked = verdict.verdict is Verdict.OK
        if self.options.long_log and self._phase != "done":
            self.result.liveness = (
                f"long log: still in its {self._phase} phase when the run's horizon of "
                f"{self.heal_us / 1e6:.0f} s of simulated time ended; {self._replica_states()}"
            )
        elif pending or self.issued < self.ops_budget:
            self.result.liveness = (
                f"{len(pending)} client operations still open and "
                f"{self.ops_budget - self.issued} never issued after the heal phase"
            )
        elif not self._finished():
            states = [(r.rid, r.core.executed_through(), r.alive) for r in self._active()]
            self.result.liveness = f"replicas did not converge after the heal phase: {states}"


    def _check_configurations(self) -> None:
        """Members that executed the same log hold the same configuration (its changes are
        applied in log order, ``publish`` included)."""
        held: dict[int, tuple[int, Configuration]] = {}
        for rep in self._active():
            config: Configuration = rep.core.config  # type: ignore[attr-defined]
            position = rep.core.executed_through()
            other = held.setdefault(position, (rep.rid, config))
            if other[1] != config:
                raise Violation(
                    f"replicas {other[0]} and {rep.rid} executed through slot {position} with "
                    f"different configurations: {other[1]} and {config}")


def _summary(outgoing: list[Outgoing]) -> str:
    """``1 CAccept to 2, 2 Vote to 0, longest array: Vote.entries of 70,001``: what a send
    step held, for a violation's text."""
    counts: dict[tuple[str, int], int] = {}
    for out in outgoing:
        key = (type(out.message).__name__, out.to)
        counts[key] = counts.get(key, 0) + 1
    parts = [f"{count} {name} to {to}" for (name, to), count in sorted(counts.items())]
    longest = max(
        ((len(value), type(out.message).__name__, name)
         for out in outgoing
         for name in ARRAY_FIELDS
         if isinstance(value := getattr(out.message, name, None), tuple)),
        default=None,
    )
    if longest is not None:
        parts.append(f"longest array: {longest[1]}.{longest[2]} of {longest[0]:,}")
    return ", ".join(parts)
