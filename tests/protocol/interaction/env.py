"""An interaction environment for the SDPaxos core: real ``SDPaxosReplica`` cores (or, with
``add-nodes ... members``, the membership layer's ``MemberReplica`` around them), driven by
text commands (etcd-raft's ``rafttest.InteractionEnv``, for SDPaxos).

The environment owns a deterministic clock (``now``, µs, moved only by ``tick``), one message
queue per link (FIFO; a receiver gets its messages in the order they were sent), each
replica's durable records (the ``persist`` and ``log`` records of every Ready it produced, or
what a snapshot rewrote them to), its state machine (a ``KVStore``) and its latest snapshot.
It relies on the core's public surface only: ``propose``, ``read``, ``step``, ``tick``,
``ready``, ``advance``, ``snapshot_meta``, ``compact``, ``install_snapshot``,
``committed_log`` and the attributes ``dump`` prints.

Commands (``<rs>`` is one or more replica ids, or ``all``: every live replica):

``add-nodes <n> [thrifty] [members] [field=value ...]``
    create the cluster: ``n`` replicas with a ``ProtocolConfig`` (any of its int fields by
    name, e.g. ``lease_us=100000 straggler_windows=2``; ``thrifty`` sets ``thrifty=True``).
    Replica ``r`` gets ``random.Random(r)``. Prints the configuration that differs from the
    defaults. With ``members`` the replicas are members whose set may change
    (``MemberReplica``, consensus.protocol.membership: one SDPaxos core per epoch), replica
    ids are member ids, and the two commands below work.
``start-member``
    (members) a new member's process starts, empty, with the next id; it asks the voters of
    the latest configuration known to let it learn once a change names it.
``change <r> <kind> <member> [replaces=<id>]``
    (members) a membership change (``add``, ``replace``, ``promote``, ``remove``) proposed at
    replica ``r`` (a client of its own); it prints as ``kind(member)`` or
    ``replace(member for id)``.
``propose <r> <key>=<value> [<key>=<value> ...]``
    blind writes (``kv_put``) proposed at replica ``r`` in one turn (so in one batch). Every
    command gets the next sequence number of client 1; it prints as ``key=value``.
``retry <r> <key>=<value>``
    a client retry: the write last proposed as ``key=value`` proposed again at replica ``r``,
    with the same (client id, seq) (as the native client sends it to the next replica after
    a timeout). Only the first copy in the log takes effect (the session table).
``read <r> <key>``
    a linearizable read (``kv_get``, client 2) at replica ``r``; prints as ``get(key)``.
``process-ready <rs>``
    for each replica: ``ready()``, print it (see below), carry it out (records made durable,
    messages queued, commands applied to the state machine, reads served), ``advance()``.
``deliver-msgs <rs> [type=T] [from=S] [only=first|last]``
    deliver (``step``) every queued message for those replicas, of type ``T`` and from
    ``S`` only if given (with ``only``, just the oldest or the newest of them); a message on
    a link the partition cuts is dropped instead.
``drop-msgs <rs> [type=T] [from=S] [only=first|last]``
    lose those messages.
``dup-msgs <rs> [type=T] [from=S] [only=first|last]``
    the network duplicates those messages: a copy of each is queued behind everything its
    link holds.
``tick <rs> <us>``
    advance the clock by ``us`` and call ``tick(now)`` on those replicas (nothing is printed:
    the timers' effects show in the next ``process-ready``).
``stabilize [<rs>]``
    process-ready and deliver-msgs (for all live replicas, or only among ``rs``), round after
    round, until nothing moves (bounded: an error after ``STABILIZE_ROUNDS`` rounds). The
    clock does not move.
``crash <r>``
    forget replica ``r``'s core (what it had not yet processed is lost) and the messages
    queued for it (messages sent to it while it is down are lost too); its durable records
    and its latest snapshot stay.
``crash-mid-turn <r>``
    replica ``r`` takes its ``ready()`` and crashes during its fsync: what needs no
    durability (``send``: a proposer's early Accept) left and is queued, printed with
    ``~>``; nothing else of the turn happens (no record of it is durable). Then as ``crash``.
``restart <r>``
    a new core built from the durable records and the latest snapshot
    (``SDPaxosReplica(config, r, recovered=records, snapshot=meta, rng=...)``), its state
    machine restored from the snapshot (the core executes the rest again). A member restarts
    with the voters it was started with as its contacts.
``partition <r ...> | <r ...> [| ...]`` / ``heal``
    cut every link between replicas in different groups (a replica named in no group is
    alone); ``heal`` restores them (and ends every ``lossy`` rule). Cut links drop messages
    when they are delivered.
``lossy from=<r> type=<T>``
    until ``heal``, every message of type ``T`` from ``r`` is lost when delivered (a replica
    alive but useless at one task, e.g. a sequencer whose orders never arrive).
``dump <rs>``
    a replica's state: ``view``, ``role``, ``view_ready``, ``sequencer``, ``accepted_view``,
    ``exec_slot``, ``next_index``, ``c_high``, ``recoveries_started``, ``committed_log()``,
    ``snapshot_meta()`` and its state machine's contents.
``snapshot <r>``
    snapshot replica ``r``'s state machine at ``snapshot_meta()`` and ``compact`` its core
    there; its durable records become what ``compact`` returns. When a Ready names a peer in
    ``snapshot_requests``, the replica queues its latest snapshot for that peer (a
    ``Snapshot`` item on the link); delivering it installs it (``install_snapshot``) if it is
    ahead of the receiver (for a member: if ``accepts_snapshot``), as the simulator and the
    node do. A Ready that asks for a snapshot (``snapshot_now``: a learner became a voter)
    gets one after it is carried out, as with ``snapshot``.
``run-for <us> [step=<us>]``
    let time pass: every ``step`` (default ``heartbeat_us``) advance the clock, tick every
    live replica and stabilize; prints what stabilize prints, under ``@<now>``.
``hide-msgs <Type ...>`` / ``show-msgs [<Type ...>]``
    do not print messages of those types (they are still sent and delivered: a Ready or a
    delivery made of nothing else prints nothing); ``show-msgs`` prints those types (without
    arguments: every type) again.
    For heartbeats and lease grants.

Output of a Ready (``> r handling Ready``), in the order a driver carries it out::

    persist <Record field=value ...>     records made durable before the messages below
    log <Record ...>                     records written without an fsync of their own
    r->d <Message field=value ...>       send_after_persist (needs the records above)
    r~>d <Message ...>                   send (needs no durability)
    ready <command>                      a command led here became ready (may be acked)
    apply slot=J[.K] <command> [led here]   an execution, applied to the state machine
    read get(key) -> value               a linearizable read served
    failed <command> definite=B: reason  a command led here failed
    result <change>: text                a membership change led here executed
    snapshot-request d                   peer d needs our snapshot

Checked after every step, whatever the script: a request reported failed *definitely*
(``Failure.definite``: it never took effect, nor will) is never executed by any replica, before
or after the report. A violation is an error naming both.

Messages print without ``src`` (the arrow names it) and without ``view`` when it is 0; a
view of a later membership epoch prints as ``e<epoch>.<view>``.
Commands print as ``key=value`` / ``get(key)``; batches as ``[a=1,b=2]`` (``[]``: a no-op);
O-instance entries as ``slot=>owner`` (``noop`` for NO_CL, ``seal`` for SEAL); a ``Vote``'s
entries as ``slot=>owner@ballot``, a ``CPromise``'s as ``index:batch@ballot``; a record or
message inside another as ``{field=value ...}``.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

import msgpack

from consensus.config import ProtocolConfig
from consensus.messages import (
    EVERY_INDEX,
    NO_CL,
    SEAL,
    Command,
    CVote,
    OEntry,
    OVote,
    PeerMessage,
    Record,
)
from consensus.protocol.membership import MemberReplica
from consensus.protocol.membership.config import (
    EPOCH_SHIFT,
    KINDS,
    NO_MEMBER,
    REPLACE,
    Change,
    decode_change,
    encode_change,
)
from consensus.protocol.ready import Ready
from consensus.protocol.sdpaxos import SDPaxosReplica
from consensus.protocol.types import SnapshotMeta
from consensus.statemachine import KVStore, kv_get, kv_put

from .datadriven import Block

__all__ = ["STABILIZE_ROUNDS", "InteractionEnv", "SnapshotTransfer"]

#: ``stabilize`` gives up (an error) after this many rounds of processing and delivery
STABILIZE_ROUNDS = 200
#: client ids of the env's writes and reads (each has its own sequence numbers)
WRITER = 1
READER = 2
#: the client id of the membership changes ``change`` proposes
CHANGER = 3
#: a restarted replica's core gets ``random.Random(r + RESTART_SEED_STRIDE * incarnation)``
RESTART_SEED_STRIDE = 100
#: message fields that hold replica ids, where NO_CL prints as ``noop``
_OWNER_LISTS = frozenset({"owners"})


@dataclass(frozen=True)
class SnapshotTransfer:
    """A replica's snapshot on its way to a peer (what the node sends as SnapshotChunks)."""

    meta: SnapshotMeta
    state: bytes


Item = PeerMessage | SnapshotTransfer


@dataclass
class _InFlight:
    seq: int
    src: int
    dst: int
    item: Item


Core = SDPaxosReplica | MemberReplica


@dataclass
class _Node:
    rid: int
    core: Core | None
    store: KVStore = field(default_factory=KVStore)
    records: list[Record] = field(default_factory=list)
    snapshot: SnapshotTransfer | None = None
    incarnation: int = 0
    #: a member's contacts (the voters it asks to learn from first)
    contacts: tuple[int, ...] = ()


class InteractionEnv:
    """Replicas, links and a clock, driven by the commands in the module docstring."""

    def __init__(self, *, unsafe: frozenset[str] = frozenset()) -> None:
        #: broken-on-purpose variants every core of the cluster runs (teeth tests)
        self.unsafe = unsafe
        self.config: ProtocolConfig | None = None
        #: the replicas are members (``MemberReplica``): ``add-nodes ... members``
        self.members = False
        self.nodes: list[_Node] = []
        self.now = 0
        #: (src, dst) -> messages in flight on that link, oldest first
        self.links: dict[tuple[int, int], list[_InFlight]] = {}
        self._sent = 0
        self.groups: list[frozenset[int]] = []
        #: (src, message type) pairs lost on delivery until ``heal``
        self.drop_rules: set[tuple[int, str]] = set()
        self.hidden: frozenset[str] = frozenset()
        self.labels: dict[tuple[int, int], str] = {}
        self._seqs = {WRITER: 0, READER: 0, CHANGER: 0}
        #: the command last proposed under each label (what ``retry`` proposes again)
        self._proposed: dict[str, Command] = {}
        #: requests reported failed definitely: (client id, seq) -> where
        self._definite: dict[tuple[int, int], str] = {}
        #: requests some replica executed (their first copy): (client id, seq) -> where
        self._executed: dict[tuple[int, int], str] = {}

    # ------------------------------------------------------------------ dispatch
    def handle(self, block: Block) -> str:
        name = block.cmd.replace("-", "_")
        method = getattr(self, f"cmd_{name}", None)
        if method is None:
            raise ValueError(f"unknown command {block.cmd!r}")
        if self.config is None and block.cmd != "add-nodes":
            raise ValueError("add-nodes must come first")
        lines: list[str] = method(block)
        return "\n".join(lines) if lines else "ok"

    # ------------------------------------------------------------------ helpers
    @property
    def _config(self) -> ProtocolConfig:
        assert self.config is not None
        return self.config

    def _replica(self, word: str) -> int:
        rid = int(word)
        if not 0 <= rid < len(self.nodes):
            raise ValueError(f"no replica {rid}")
        return rid

    def _replicas(self, words: list[str]) -> list[int]:
        if not words:
            raise ValueError("name replicas (or 'all')")
        if words == ["all"]:
            return [n.rid for n in self.nodes if n.core is not None]
        return [self._replica(w) for w in words]

    def _core(self, rid: int) -> Core:
        core = self.nodes[rid].core
        if core is None:
            raise ValueError(f"replica {rid} is crashed")
        return core

    def _command(self, client: int, op: bytes, key: str, label: str) -> Command:
        seq = self._seqs[client]
        self._seqs[client] = seq + 1
        self.labels[(client, seq)] = label
        return Command(client_id=client, seq=seq, op=op, keys=(key,), blind=client == WRITER)

    def _cut(self, a: int, b: int) -> bool:
        if not self.groups:
            return False
        group_of = {r: g for g in self.groups for r in g}
        return group_of.get(a, frozenset({a})) != group_of.get(b, frozenset({b}))

    # ------------------------------------------------------------------ formatting
    def fmt_command(self, command: Command) -> str:
        label = self.labels.get((command.client_id, command.seq))
        if label is not None:
            return label
        change = decode_change(command.op)  # one a member proposed itself (a promotion)
        if change is not None:
            return f"{change.kind}({change.member})"
        return f"{command.client_id}:{command.seq}"

    def _fmt_value(self, name: str, value: object) -> str:
        if value is None:
            return "None"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, bytes):
            return f"<{len(value)} bytes>"
        if isinstance(value, Command):
            return self.fmt_command(value)
        if isinstance(value, OEntry):
            return f"{value.slot}=>{_owner(value.owner)}"
        if isinstance(value, OVote):
            return f"{value.slot}=>{_owner(value.owner)}@{value.ballot}"
        if isinstance(value, CVote):
            return f"{value.index}:{self._fmt_value('batch', value.batch)}@{value.ballot}"
        if name == "view" and isinstance(value, int) and value >> EPOCH_SHIFT:
            return f"e{value >> EPOCH_SHIFT}.{value & ((1 << EPOCH_SHIFT) - 1)}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return "{" + self._fields(value, skip_view=False) + "}"  # (LearnedSlot, members)
        if isinstance(value, tuple):
            if name in _OWNER_LISTS:
                return "[" + ",".join(_owner(v) for v in value) + "]"
            return "[" + ",".join(self._fmt_value(name, v) for v in value) + "]"
        if name == "through" and value == EVERY_INDEX:
            return "all"
        return str(value)

    def _fields(self, obj: object, *, skip_view: bool) -> str:
        assert dataclasses.is_dataclass(obj) and not isinstance(obj, type)
        parts = []
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name == "src" or (skip_view and f.name == "view" and value == 0):
                continue
            parts.append(f"{f.name}={self._fmt_value(f.name, value)}")
        return " ".join(parts)

    def fmt_item(self, item: Item) -> str:
        if isinstance(item, SnapshotTransfer):
            counts = ",".join(map(str, item.meta.exec_counts))
            return f"Snapshot slot={item.meta.slot} exec_counts=[{counts}]"
        text = self._fields(item, skip_view=True)
        return f"{type(item).__name__} {text}".rstrip()

    def fmt_record(self, record: Record) -> str:
        return f"{type(record).__name__} {self._fields(record, skip_view=False)}".rstrip()

    # ------------------------------------------------------------------ cluster
    def cmd_add_nodes(self, block: Block) -> list[str]:
        if self.config is not None:
            raise ValueError("the cluster exists already")
        positional = block.positional()
        n = int(positional[0])
        settings: dict[str, object] = {"replicas": n, "unsafe": self.unsafe}
        for word in positional[1:]:
            if word == "members":
                self.members = True
            elif word == "thrifty":
                settings["thrifty"] = True
            else:
                raise ValueError(f"unknown flag {word!r}")
        known = {f.name: f for f in dataclasses.fields(ProtocolConfig)}
        for key, value in block.kwargs().items():
            if key not in known or known[key].type not in ("int", int):
                raise ValueError(f"no int setting {key!r} in ProtocolConfig")
            settings[key] = int(value)
        self.config = ProtocolConfig(**settings)  # type: ignore[arg-type]
        self.nodes = [_Node(rid=r, core=self._new_core(r, random.Random(r))) for r in range(n)]
        defaults = ProtocolConfig(replicas=n, unsafe=self.unsafe)
        changed = [
            f"{name}={getattr(self.config, name)}"
            for name in known
            if name != "replicas" and getattr(self.config, name) != getattr(defaults, name)
        ]
        kind = "members" if self.members else "replicas"
        return [f"{n} {kind} (quorum {self.config.quorum}) " + " ".join(changed)]

    def _new_core(self, rid: int, rng: random.Random, records: list[Record] | None = None,
                  meta: SnapshotMeta | None = None, contacts: tuple[int, ...] = ()) -> Core:
        if self.members:
            return MemberReplica(self._config, rid, recovered=records or [], snapshot=meta,
                                 rng=rng, contacts=contacts)
        return SDPaxosReplica(self._config, rid, recovered=records or [], snapshot=meta,
                              rng=rng)

    def cmd_start_member(self, block: Block) -> list[str]:
        if not self.members:
            raise ValueError("start-member needs add-nodes ... members")
        rid = len(self.nodes)
        live = [n.core for n in self.nodes if isinstance(n.core, MemberReplica)]
        latest = max(live, key=lambda core: core.config.epoch)  # what the newest knows
        contacts = tuple(latest.config.voters)
        self.nodes.append(_Node(rid=rid, core=self._new_core(rid, random.Random(rid),
                                                             contacts=contacts),
                                contacts=contacts))
        return [f"member {rid} started (contacts {','.join(map(str, contacts))})"]

    def cmd_change(self, block: Block) -> list[str]:
        if not self.members:
            raise ValueError("change needs add-nodes ... members")
        positional = block.positional()
        if len(positional) != 3 or positional[1] not in KINDS:
            raise ValueError(f"change <r> <{'|'.join(KINDS)}> <member> [replaces=<id>]")
        rid = self._replica(positional[0])
        kind, member = positional[1], int(positional[2])
        replaces = int(block.kwargs().get("replaces", NO_MEMBER))
        label = (f"{kind}({member} for {replaces})" if kind == REPLACE
                 else f"{kind}({member})")
        seq = self._seqs[CHANGER]
        self._seqs[CHANGER] = seq + 1
        self.labels[(CHANGER, seq)] = label
        op = encode_change(Change(kind, member=member, replaces=replaces))
        self._core(rid).propose(Command(client_id=CHANGER, seq=seq, op=op, keys=()), self.now)
        return []

    # ------------------------------------------------------------------ inputs
    def cmd_propose(self, block: Block) -> list[str]:
        rid = self._replica(block.args[0])
        core = self._core(rid)
        for pair in block.args[1:]:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise ValueError(f"expected key=value, got {pair!r}")
            command = self._command(WRITER, kv_put(key, value), key, pair)
            self._proposed[pair] = command
            core.propose(command, self.now)
        return []

    def cmd_retry(self, block: Block) -> list[str]:
        rid = self._replica(block.args[0])
        label = block.args[1]
        if label not in self._proposed:
            raise ValueError(f"nothing was proposed as {label!r}")
        self._core(rid).propose(self._proposed[label], self.now)
        return []

    def cmd_read(self, block: Block) -> list[str]:
        rid = self._replica(block.args[0])
        key = block.args[1]
        self._core(rid).read(self._command(READER, kv_get(key), key, f"get({key})"), self.now)
        return []

    def cmd_tick(self, block: Block) -> list[str]:
        if len(block.args) < 2:
            raise ValueError("tick <replicas|all> <us>")
        replicas = self._replicas(block.args[:-1])
        elapsed = int(block.args[-1])
        if elapsed < 0:
            raise ValueError("the clock never goes back")
        self.now += elapsed
        for rid in replicas:
            self._core(rid).tick(self.now)
        return [f"now={self.now}"]

    # ------------------------------------------------------------------ ready
    def cmd_process_ready(self, block: Block) -> list[str]:
        out: list[str] = []
        for rid in self._replicas(block.positional()):
            out.extend(self._process(rid))
        return out

    def _process(self, rid: int) -> list[str]:
        """One turn's Ready of ``rid``: printed, carried out, advanced. [] when empty."""
        node = self.nodes[rid]
        core = self._core(rid)
        ready = core.ready()
        lines = self._carry_out(node, ready)
        core.advance(ready)
        if ready.snapshot_now:  # (a learner that became a voter: its core starts from it)
            lines.append(f"snapshot-now: {self._snapshot(node)}")
        if not lines:
            return []
        return [f"> {rid} handling Ready", *(f"  {line}" for line in lines)]

    def _carry_out(self, node: _Node, ready: Ready) -> list[str]:
        rid = node.rid
        lines: list[str] = []
        for record in ready.persist:
            lines.append(f"persist {self.fmt_record(record)}")
        for record in ready.log:
            lines.append(f"log {self.fmt_record(record)}")
        node.records.extend(ready.persist)
        node.records.extend(ready.log)
        for arrow, outgoing in (("->", ready.send_after_persist), ("~>", ready.send)):
            for out in outgoing:
                self._queue(rid, out.to, out.message)
                if type(out.message).__name__ not in self.hidden:
                    lines.append(f"{rid}{arrow}{out.to} {self.fmt_item(out.message)}")
        for command in ready.ready:
            lines.append(f"ready {self.fmt_command(command)}")
        for ex in ready.executions():
            self._note_execution(rid, ex.slot, ex.command, node.store)
            node.store.apply(ex.position, ex.command)
            where = f"{ex.slot}" if ex.offset == 0 else f"{ex.slot}.{ex.offset}"
            mine = " led here" if ex.led_here else ""
            lines.append(f"apply slot={where} {self.fmt_command(ex.command)}{mine}")
        for read in ready.reads:
            lines.append(f"read {self.fmt_command(read)} -> {_read_result(node.store, read)}")
        for failure in ready.failed:
            if failure.definite:
                self._note_definite(rid, failure.command)
            lines.append(
                f"failed {self.fmt_command(failure.command)} "
                f"definite={self._fmt_value('', failure.definite)}: {failure.reason}"
            )
        for command, result in ready.results:
            lines.append(f"result {self.fmt_command(command)}: {result.decode()}")
        for peer in sorted(set(ready.snapshot_requests)):
            lines.append(f"snapshot-request {peer}")
            if node.snapshot is None:
                lines.append("  (no snapshot to send)")
            else:
                self._queue(rid, peer, node.snapshot)
                lines.append(f"{rid}->{peer} {self.fmt_item(node.snapshot)}")
        return lines

    def _note_execution(self, rid: int, slot: int, command: Command, store: KVStore) -> None:
        if store.sessions.lookup(command.client_id, command.seq) is None:  # not a later copy
            self._note(self._executed, self._definite, command,
                       f"executed at replica {rid} in slot {slot}")

    def _note_definite(self, rid: int, command: Command) -> None:
        self._note(self._definite, self._executed, command, f"failed definitely at replica {rid}")

    def _note(self, seen: dict[tuple[int, int], str], other: dict[tuple[int, int], str],
              command: Command, where: str) -> None:
        """Note what became of a request; a definite failure and an execution of the same
        request, in either order, is a violation."""
        key = (command.client_id, command.seq)
        seen.setdefault(key, where)
        if key in other:
            raise AssertionError(f"a definite failure took effect: {self.fmt_command(command)} "
                                 f"{other[key]}, then {where}")

    def _queue(self, src: int, dst: int, item: Item) -> None:
        if self.nodes[dst].core is None:
            return  # a crashed replica receives nothing
        self._sent += 1
        self.links.setdefault((src, dst), []).append(_InFlight(self._sent, src, dst, item))

    # ------------------------------------------------------------------ delivery
    def _matching(self, dst: int, kind: str | None, src: int | None,
                  only: str | None = None) -> list[_InFlight]:
        """The messages queued for ``dst`` (of type ``kind``, from ``src``), in sending order;
        with ``only``, the ``first`` or the ``last`` of them."""
        matching = sorted(
            (flight for (a, b), queue in self.links.items()
             if b == dst and (src is None or a == src)
             for flight in queue if kind is None or _kind(flight.item) == kind),
            key=lambda f: f.seq,
        )
        if only == "first":
            return matching[:1]
        if only == "last":
            return matching[-1:]
        return matching

    def _take(self, dst: int, kind: str | None, src: int | None,
              only: str | None = None) -> list[_InFlight]:
        """Remove and return the matching messages (``_matching``)."""
        taken = self._matching(dst, kind, src, only)
        chosen = {id(flight) for flight in taken}
        for (_, b), queue in self.links.items():
            if b == dst:
                queue[:] = [flight for flight in queue if id(flight) not in chosen]
        return taken

    def _filters(self, block: Block) -> tuple[list[int], str | None, int | None, str | None]:
        kwargs = block.kwargs()
        unknown = set(kwargs) - {"type", "from", "only"}
        if unknown:
            raise ValueError(f"unknown options {sorted(unknown)}")
        only = kwargs.get("only")
        if only not in (None, "first", "last"):
            raise ValueError(f"only=first or only=last, not only={only}")
        src = self._replica(kwargs["from"]) if "from" in kwargs else None
        return self._replicas(block.positional()), kwargs.get("type"), src, only

    def cmd_deliver_msgs(self, block: Block) -> list[str]:
        replicas, kind, src, only = self._filters(block)
        out: list[str] = []
        for rid in replicas:
            out.extend(self._deliver(rid, kind, src, only))
        return out

    def _deliver(self, rid: int, kind: str | None, src: int | None,
                 only: str | None = None) -> list[str]:
        flights = self._take(rid, kind, src, only)
        lines: list[str] = []
        for flight in flights:
            text = f"{flight.src}->{flight.dst} {self.fmt_item(flight.item)}"
            shown = _kind(flight.item) not in self.hidden
            if self._cut(flight.src, flight.dst):
                if shown:
                    lines.append(f"{text} (dropped: partitioned)")
                continue
            if (flight.src, _kind(flight.item)) in self.drop_rules:
                if shown:
                    lines.append(f"{text} (dropped: lossy)")
                continue
            if shown:
                lines.append(text)
            lines.extend(f"  {line}" for line in self._step(rid, flight.item))
        return [f"> {rid} receiving messages", *(f"  {line}" for line in lines)] if lines else []

    def _step(self, rid: int, item: Item) -> list[str]:
        node = self.nodes[rid]
        core = self._core(rid)
        if isinstance(item, PeerMessage):
            core.step(item, self.now)
            return []
        # a peer's snapshot: what the driver does with it (ignored unless it is ahead)
        meta = item.meta
        ahead = (core.accepts_snapshot(meta) if isinstance(core, MemberReplica)
                 else meta.slot > core.exec_slot)
        if not ahead:
            return [f"snapshot at slot {meta.slot} ignored (executed through {core.exec_slot})"]
        node.store.restore(item.state)
        node.snapshot = item
        node.records = list(core.install_snapshot(meta))
        return [f"installed snapshot at slot {meta.slot}; {len(node.records)} durable records"]

    def cmd_drop_msgs(self, block: Block) -> list[str]:
        replicas, kind, src, only = self._filters(block)
        out: list[str] = []
        for rid in replicas:
            out.extend(
                f"dropped {f.src}->{f.dst} {self.fmt_item(f.item)}"
                for f in self._take(rid, kind, src, only)
            )
        return out

    def cmd_dup_msgs(self, block: Block) -> list[str]:
        replicas, kind, src, only = self._filters(block)
        out: list[str] = []
        for rid in replicas:
            for f in self._matching(rid, kind, src, only):
                self._queue(f.src, f.dst, f.item)  # behind what the link holds already
                out.append(f"duplicated {f.src}->{f.dst} {self.fmt_item(f.item)}")
        return out

    def cmd_stabilize(self, block: Block) -> list[str]:
        return self._stabilize(self._replicas(block.positional()) if block.positional() else None)

    def _stabilize(self, named: list[int] | None) -> list[str]:
        out: list[str] = []
        for _ in range(STABILIZE_ROUNDS):
            moved = False
            live = [
                n.rid for n in self.nodes
                if n.core is not None and (named is None or n.rid in named)
            ]
            for rid in live:
                lines = self._process(rid)
                moved = moved or bool(lines)
                out.extend(lines)
            for rid in live:
                src_filter = None if named is None else named
                flights = [
                    f for (a, b), q in self.links.items() if b == rid
                    and (src_filter is None or a in src_filter) for f in q
                ]
                if not flights:
                    continue
                moved = True
                if src_filter is None:
                    out.extend(self._deliver(rid, None, None))
                else:
                    for a in src_filter:
                        out.extend(self._deliver(rid, None, a))
            if not moved:
                return out
        raise ValueError(f"stabilize did not settle in {STABILIZE_ROUNDS} rounds")

    def cmd_run_for(self, block: Block) -> list[str]:
        positional = block.positional()
        if len(positional) != 1:
            raise ValueError("run-for <us> [step=<us>]")
        total = int(positional[0])
        step = int(block.kwargs().get("step", self._config.heartbeat_us))
        if total < 0 or step <= 0:
            raise ValueError("run-for needs a duration >= 0 and a step > 0")
        out: list[str] = []
        end = self.now + total
        while self.now < end:
            self.now = min(end, self.now + step)
            for node in self.nodes:
                if node.core is not None:
                    node.core.tick(self.now)
            lines = self._stabilize(None)
            if lines:
                out.append(f"@{self.now}")
                out.extend(lines)
        out.append(f"now={self.now}")
        return out

    def cmd_hide_msgs(self, block: Block) -> list[str]:
        self.hidden = self.hidden | frozenset(block.args)
        return []

    def cmd_show_msgs(self, block: Block) -> list[str]:
        self.hidden = self.hidden - frozenset(block.args) if block.args else frozenset()
        return []

    # ------------------------------------------------------------------ faults
    def cmd_crash(self, block: Block) -> list[str]:
        rid = self._replica(block.args[0])
        self._core(rid)
        self.nodes[rid].core = None
        lost = self._take(rid, None, None)
        return [f"{rid} crashed ({len(self.nodes[rid].records)} durable records; "
                f"{len(lost)} messages to it lost)"]

    def cmd_crash_mid_turn(self, block: Block) -> list[str]:
        rid = self._replica(block.args[0])
        ready = self._core(rid).ready()
        lines = [f"> {rid} crashing during its fsync"]
        for record in ready.persist:
            lines.append(f"  lost {self.fmt_record(record)}")
        for out in ready.send:
            self._queue(rid, out.to, out.message)
            if type(out.message).__name__ not in self.hidden:
                lines.append(f"  {rid}~>{out.to} {self.fmt_item(out.message)}")
        return [*lines, *self.cmd_crash(block)]

    def cmd_restart(self, block: Block) -> list[str]:
        rid = self._replica(block.args[0])
        node = self.nodes[rid]
        if node.core is not None:
            raise ValueError(f"replica {rid} is running")
        node.incarnation += 1
        node.store = KVStore()
        meta = None
        if node.snapshot is not None:
            meta = node.snapshot.meta
            node.store.restore(node.snapshot.state)
        node.core = self._new_core(
            rid, random.Random(rid + RESTART_SEED_STRIDE * node.incarnation),
            list(node.records), meta, node.contacts,
        )
        start = "" if meta is None else f" and its snapshot at slot {meta.slot}"
        return [f"{rid} restarted from {len(node.records)} durable records{start}"]

    def cmd_partition(self, block: Block) -> list[str]:
        groups: list[frozenset[int]] = []
        current: list[int] = []
        for word in [*block.args, "|"]:
            if word == "|":
                if not current:
                    raise ValueError("an empty side in the partition")
                groups.append(frozenset(current))
                current = []
            else:
                current.append(self._replica(word))
        self.groups = groups
        return []

    def cmd_heal(self, block: Block) -> list[str]:
        self.groups = []
        self.drop_rules.clear()
        return []

    def cmd_lossy(self, block: Block) -> list[str]:
        kwargs = block.kwargs()
        if set(kwargs) != {"from", "type"}:
            raise ValueError("lossy from=<r> type=<MessageType>")
        self.drop_rules.add((self._replica(kwargs["from"]), kwargs["type"]))
        return []

    # ------------------------------------------------------------------ state
    def cmd_dump(self, block: Block) -> list[str]:
        out: list[str] = []
        words = block.positional()
        replicas = [n.rid for n in self.nodes] if words == ["all"] else self._replicas(words)
        for rid in replicas:
            out.extend(self._dump(rid))
        return out

    def _dump(self, rid: int) -> list[str]:
        node = self.nodes[rid]
        core = node.core
        if core is None:
            return [f"{rid}: crashed ({len(node.records)} durable records)"]
        log = core.committed_log()
        slots = " ".join(
            f"{slot}:{self._fmt_value('batch', log[slot])}" for slot in sorted(log)
        )
        meta = core.snapshot_meta()
        data = node.store.data
        kv = " ".join(f"{k}={data[k]}" for k in sorted(data))
        if isinstance(core, MemberReplica):
            config = core.config
            return [
                f"{rid}: epoch={config.epoch} voters=[{','.join(map(str, config.voters))}] "
                f"role={core.status().role.value} view={self._fmt_value('view', core.view)} "
                f"sequencer={core.sequencer}",
                f"   exec_slot={core.exec_slot}",
                f"   log: {slots or '(empty)'}",
                f"   kv: {kv or '(empty)'}",
            ]
        c_high = ",".join(map(str, core.c_store.high))
        return [
            f"{rid}: view={core.view} role={core.role.value} "
            f"view_ready={self._fmt_value('', core.view_ready)} sequencer={core.sequencer} "
            f"accepted_view={core.o_log.accepted_view}",
            f"   exec_slot={core.exec_slot} next_index={core.c_store.next_index} c_high=[{c_high}] "
            f"recoveries_started={core.recoveries_started}",
            f"   log: {slots or '(empty)'}",
            f"   snapshot_meta: slot={meta.slot} "
            f"exec_counts=[{','.join(map(str, meta.exec_counts))}]",
            f"   kv: {kv or '(empty)'}",
        ]

    def cmd_snapshot(self, block: Block) -> list[str]:
        rid = self._replica(block.args[0])
        node = self.nodes[rid]
        self._core(rid)
        return [f"{rid} {self._snapshot(node)}"]

    def _snapshot(self, node: _Node) -> str:
        """Snapshot ``node``'s state machine and compact its core there."""
        core = node.core
        assert core is not None
        meta = core.snapshot_meta()
        node.snapshot = SnapshotTransfer(meta, node.store.snapshot())
        node.records = list(core.compact(meta))
        counts = ",".join(map(str, meta.exec_counts))
        return (f"snapshot at slot={meta.slot} exec_counts=[{counts}]; "
                f"{len(node.records)} durable records kept")


def _owner(owner: int) -> str:
    return "noop" if owner == NO_CL else "seal" if owner == SEAL else str(owner)


def _kind(item: Item) -> str:
    return "Snapshot" if isinstance(item, SnapshotTransfer) else type(item).__name__


def _read_result(store: KVStore, read: Command) -> str:
    """A served read's value, from the state machine (``nil`` when the key has none)."""
    result = msgpack.unpackb(store.query(read.op))
    value = result[1] if isinstance(result, list) and len(result) == 2 else result
    return "nil" if value is None else str(value)
