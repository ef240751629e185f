"""``ClusterStore``: the allocation state machine behind the ``consensus`` ``StateMachine``
protocol.

``apply(position, command)`` decodes ``command.op`` (see ``cluster_state.ops``), runs it on the
``Allocator`` and answers msgpack result bytes. A retried command — the same
``(client_id, seq)`` proposed again, possibly at another replica — answers its first result
without running again (``SessionTable``). An invalid op answers ``["error", reason]`` and
changes nothing; when the verdict depends on the op alone (malformed, unknown VC, priority out
of range, ...) it is not even remembered in the session table, since running a retry again
gives the same answer, so the snapshot stays byte-identical.

**Releasing twice** is no error: a release of a group that is gone answers
``Released(..., already_released=True)`` (nothing changes) while the kept events still show
its end; one the store has no trace of is an error, ``no group 'name'`` (``NotFound`` at the
client, gRPC ``NOT_FOUND``).

**Revisions.** ``revision`` is the global log position of the last command that changed the
store (allocations, health, a remembered session result or the log time: a log-time command
of ``consensus.sessions``). A placement's *fencing token* is the position it took effect at;
every change event carries the position that made it, and
``events_since(revision)`` feeds watchers. Leaves remember the revision of their last change,
which is what a conditional ``bind`` checks.

**Snapshots** hold only the facts (groups, bindings, bad nodes, leaf revisions, recent events,
sessions) in a canonical order; ``restore`` rebuilds every derived structure from them, so two
replicas that applied the same log produce identical bytes, and ``restore(s).snapshot() == s``.

**Reconfiguration** is a logged command (``ops.reconfigure(yaml_text)``): every replica parses
and validates the text itself and rebuilds its allocator for the new configuration keeping the
groups (``cluster_state.reconfiguration``: work-preserving, deterministic), so replicas stay
identical.

**The log holds the configuration it began with.** A store built ``configured=False`` (a
serving replica of a cluster created by this build: ``cluster_state.plugin``) runs nothing
until the log's first configuration file proposal (``reconfigure`` with ``from_file``), which
sets its configuration from scratch whatever the store was built with; any other update
before it, an operator's ``reconfigure`` included, is refused (``ops.NOT_CONFIGURED``; the
client sends the operation again as a new request), on every replica alike. So a replica
that executes its log from slot 0 — a new member, a wiped disk, one whose file was edited
since — runs it under the configuration the log ran with. A store built with its
configuration (``configured=True``, the default: embedded and test stores, and replicas of
clusters from before this rule, which kept the configuration their log began with beside it)
runs it from the start.

**The rule for a changed configuration file** (the serve path proposes a replica's file with
``from_file``): the log is the truth. The store remembers the digests of the configurations
its log ran (``CONFIGS_KEPT``, in the snapshot); a file's proposal changes nothing when its
configuration is among them. So a file edit takes effect once, proposed by whichever replica
restarts with it first (the others find it ran); a replica restarted with an older file does
not bring the older configuration back; and ``sdpaxos ctl config apply`` (no ``from_file``) is
not undone by a restart of a replica whose file was not edited. To go back to a configuration
the log ran before, apply it with ``ctl config apply``.

A snapshot carries the configuration it was taken under, whether the log had set one, and the
digests of those it ran; ``restore`` adopts them whatever this store was built with (a
snapshot of an earlier format counts as configured, with its own configuration as the only one
it ran).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import msgpack

from cluster_state.allocator import Allocator
from cluster_state.cells import Topology, topology_of
from cluster_state.config import NODES_START_BAD, ClusterConfig, parse_config
from cluster_state.errors import EventsCompacted, GpuConfigError, RequestError, SnapshotError
from cluster_state.events import ChangeEvent, EventLog
from cluster_state.frozen import slot_setters
from cluster_state.gc_pause import freeze_if_frozen, gc_paused
from cluster_state.hived_view import HivedView
from cluster_state.ops import (
    NOT_CONFIGURED,
    Bind,
    Claim,
    Error,
    GetDigest,
    GetEvents,
    GetGroup,
    GetSummary,
    GetVC,
    GroupSpec,
    HivedInspect,
    Inspect,
    ListGroups,
    Op,
    PlanReconfigure,
    PlanSubmit,
    Reconfigure,
    Reconfigured,
    Release,
    Released,
    ReleaseIf,
    Result,
    SetNodeHealth,
    Submit,
    decode_op,
    decode_query,
    encode_result,
    get_digest,
)
from cluster_state.reconfiguration import reconfigured
from cluster_state.snapshot_encoding import PackedEvents, packed_array_header, unpack_snapshot
from consensus.messages import Command
from consensus.sessions import LOG_TIME_CLIENT, SessionTable, is_log_time_op

__all__ = ["CONFIGS_KEPT", "SNAPSHOT_FORMAT", "ClusterStore"]

#: Bumped whenever the snapshot layout changes (2: the configuration is in the snapshot;
#: 3: it is kept packed, compact, as one bytes field, so a restore under the same
#: configuration never decodes it: a 100k-GPU configuration is 4 MB of nested maps written out
#: in full, 0.4 MB compact, and decoding it dominated the restore; 4: the session table's own
#: versioned state (``consensus.sessions``) and an eighth field, ``[configured, [digest, ...]]``:
#: whether the log set the configuration, and the digests of those it ran).
SNAPSHOT_FORMAT = 4
#: The format before the session table's version 2 and the log's configurations (still read).
_SNAPSHOT_FORMAT_PACKED_CONFIG = 3
#: The format with the configuration as nested maps (still read).
_SNAPSHOT_FORMAT_CONFIG_MAP = 2
#: The format before the configuration was kept (still read when the digests match).
_SNAPSHOT_FORMAT_NO_CONFIG = 1

#: the formats ``restore`` reads
_FORMATS_READ = frozenset({SNAPSHOT_FORMAT, _SNAPSHOT_FORMAT_PACKED_CONFIG,
                           _SNAPSHOT_FORMAT_CONFIG_MAP, _SNAPSHOT_FORMAT_NO_CONFIG})

#: a snapshot's fields (format 4) and those of its event log (``EventLog.to_state``)
_SNAPSHOT_FIELDS = 8
_EVENT_LOG_FIELDS = 2

#: the digest query (``ops.get_digest``), answered off the loop (``defer_query``)
_DIGEST_OP = get_digest()
#: the digests of the configurations a log ran that a store keeps (the oldest are forgotten: a
#: file that old is proposed as a new one)
CONFIGS_KEPT = 64

#: about this many events per page of the watch stream (whole revisions only)
EVENTS_PAGE = 512
#: the event kinds whose subject is a group, and those that mean it is gone
_GROUP_EVENTS = frozenset({"placed", "preempting", "downgraded", "reserved", "cancelled",
                           "released", "trimmed", "claimed"})
_GROUP_ENDS = frozenset({"released", "cancelled"})


# (every change makes an event: made without ``__init__``, see ``cluster_state.frozen``)
_new = object.__new__
_set_revision, _set_kind, _set_subject, _set_data = slot_setters(
    ChangeEvent, "revision", "kind", "subject", "data")


def _page(events: list[ChangeEvent]) -> list[ChangeEvent]:
    if len(events) <= EVENTS_PAGE:
        return events
    end = EVENTS_PAGE
    while end < len(events) and events[end].revision == events[end - 1].revision:
        end += 1
    return events[:end]


def _pack(value: object) -> bytes:
    packed: bytes = msgpack.packb(value)
    return packed


#: the snapshot field of the last few topologies (a replica snapshots the same one repeatedly)
_packed_configs: dict[bytes, bytes] = {}
_PACKED_CONFIGS_KEPT = 4


def _packed_config(topology: Topology) -> bytes:
    """The configuration as a snapshot keeps it: its compact form, packed (canonical: every
    replica writes the same bytes for the same configuration)."""
    packed = _packed_configs.get(topology.digest)
    if packed is None:
        packed = _pack(topology.config.to_dict(compact=True))
        if len(_packed_configs) >= _PACKED_CONFIGS_KEPT:
            _packed_configs.pop(next(iter(_packed_configs)))
        _packed_configs[topology.digest] = packed
    return packed


class ClusterStore:
    """A replicated GPU allocation store (HiveD's model); implements ``StateMachine``."""

    __slots__ = ("_packed_events", "allocator", "applied_position", "configs", "configured",
                 "events", "revision", "sessions", "topology")

    def __init__(self, config: ClusterConfig | Topology, *, event_limit: int = 4096,
                 configured: bool = True) -> None:
        """``configured=False``: the configuration is the log's to set (its first file
        proposal); ``config`` only answers queries until then (see the module)."""
        self.topology = config if isinstance(config, Topology) else topology_of(config)
        # Packed now, at start, rather than by the first snapshot (on the replica's event
        # loop: a 100k-GPU configuration takes a few hundred milliseconds).
        _packed_config(self.topology)
        self.allocator = Allocator(self.topology)
        if self.topology.config.options.initial_node_health == NODES_START_BAD:
            self.allocator.start_all_bad()
        self.sessions = SessionTable()
        self.events = EventLog(event_limit)
        self._packed_events = PackedEvents()  # the events' wire form, kept for snapshots
        self.revision = -1
        self.applied_position = -1  # not part of the snapshot: the driver's meta has it
        #: whether the store runs the configuration the log set (or was built with it)
        self.configured = configured
        #: the digests of the configurations the log ran, oldest first (``CONFIGS_KEPT``)
        self.configs: dict[bytes, None] = {self.topology.digest: None} if configured else {}

    # ------------------------------------------------------------------ writes
    def apply(self, position: int, command: Command) -> bytes:
        return self.apply_batch(position, (command,))[0]

    def apply_batch(self, position: int, commands: Sequence[Command]) -> list[bytes]:
        """``apply`` of each command in turn, at ``position``, ``position + 1``, ... (one
        slot's batch: ``consensus.statemachine.batch_applier``): the same results, events and
        revisions, for less per command."""
        sessions, events = self.sessions, self.events
        admit, record, append = sessions.admit, sessions.record, events.append
        results: list[bytes] = []
        for offset, command in enumerate(commands):
            at = position + offset
            previous = admit(command)  # a retry's first result, a cancel's...
            if previous is not None:
                if command.client_id == LOG_TIME_CLIENT and is_log_time_op(command.op):
                    self.revision = at  # the session table changed (the log time moved)
                results.append(previous)
                continue
            remember = True
            try:
                result = self._execute(decode_op(command.op), at)
            except RequestError as exc:
                result = Error(exc.reason)
                remember = not exc.static
            encoded = encode_result(result)
            # (the allocator of now: a reconfiguration replaces it)
            for kind, subject, data in self.allocator.finish():
                event = _new(ChangeEvent)
                _set_revision(event, at)
                _set_kind(event, kind)
                _set_subject(event, subject)
                _set_data(event, tuple(data))
                append(event)
            if remember:
                record(command.client_id, command.seq, encoded)
                self.revision = at
            results.append(encoded)
        if commands:
            self.applied_position = position + len(commands) - 1
        return results

    def _execute(self, op: Op, position: int) -> Result:
        if not self.configured and not (isinstance(op, Reconfigure) and op.from_file):
            # remembered, as any verdict that depends on the state: a late copy of it is
            # refused too, and the client sends the operation again as a new request
            raise RequestError(NOT_CONFIGURED, static=False)
        allocator = self.allocator
        # (the commonest two first, without a class pattern's look-ups)
        if isinstance(op, Submit):
            return allocator.submit(op.spec, position, op.suggested)
        if isinstance(op, Release):
            name = op.name
            if name not in allocator.groups and self._ended(name):
                return Released(name, (), already_released=True)
            return allocator.release(name, position)
        match op:
            case Bind(spec, pods, revision):
                return allocator.bind(spec, pods, revision, position)
            case SetNodeHealth(node, healthy):
                return allocator.set_node_health(node, healthy, position)
            case Reconfigure(text, from_file):
                return self._reconfigure(text, position, from_file=from_file)
            case ReleaseIf(name, incarnation):
                return allocator.release_if(name, incarnation, position)
            case Claim(name, incarnation, slot, uid, pod, previous):
                return allocator.claim(name, incarnation, slot, (uid, pod), previous)

    def _ended(self, name: str) -> bool:
        """Whether the kept events end with group ``name`` gone (released, cancelled or
        dropped): a release of it again is answered "already released", not an error. The
        events are replicated state, so every replica answers the same; a group whose end
        is older than the kept events is unknown (an error) like one that never was."""
        for event in reversed(self.events.events):
            if event.subject == name and event.kind in _GROUP_EVENTS:
                return event.kind in _GROUP_ENDS
        return False

    # ------------------------------------------------------------------ reconfiguration
    @staticmethod
    def _parse(text: str) -> Topology:
        try:
            return topology_of(parse_config(text))
        except GpuConfigError as exc:
            raise RequestError(f"invalid configuration: {exc}") from None

    def _reconfigure(self, text: str, position: int, *, from_file: bool = False) -> Result:
        topo = self._parse(text)
        if not self.configured:  # the log's first: its configuration from the start
            self._begin(topo)
            return Reconfigured(topo.digest.hex(), True, {})
        if topo.digest == self.topology.digest or (from_file and topo.digest in self.configs):
            return Reconfigured(topo.digest.hex(), False, {})
        old = self.allocator
        self.allocator, report = reconfigured(old, topo, position)
        self.topology = topo
        self._ran(topo.digest)
        self.allocator.events.append(("reconfigured", "", [topo.digest.hex()]))
        return Reconfigured(topo.digest.hex(), True, report)

    def _begin(self, topo: Topology) -> None:
        """The log's first configuration: a fresh allocator on it (nothing ran before it)."""
        _packed_config(topo)
        self.topology = topo
        self.allocator = Allocator(topo)
        if topo.config.options.initial_node_health == NODES_START_BAD:
            self.allocator.start_all_bad()
        self.configured = True
        self._ran(topo.digest)

    def _ran(self, digest: bytes) -> None:
        """The log runs the configuration of ``digest`` from now on: the latest it ran."""
        self.configs.pop(digest, None)
        self.configs[digest] = None
        while len(self.configs) > CONFIGS_KEPT:
            del self.configs[next(iter(self.configs))]

    def needs_reconfiguration(self, config: ClusterConfig) -> bool:
        """Whether the store runs another configuration than ``config``."""
        return topology_of(config).digest != self.topology.digest

    def file_is_new(self, config: ClusterConfig) -> bool:
        """Whether a replica should propose ``config``, its configuration file's, through the
        log (``ops.reconfigure(text, from_file=True)``): the log set no configuration yet, or
        never ran this one (the module's rule)."""
        return not self.configured or topology_of(config).digest not in self.configs

    def plan_reconfiguration(self, text: str) -> dict[str, Any]:
        """What applying ``reconfigure(text)`` now would do (on a copy; nothing changes)."""
        topo = self._parse(text)
        if topo.digest == self.topology.digest:
            return {"changed": False}
        copy = Allocator(self.topology)
        copy.import_state(self.allocator.export_state())
        _, report = reconfigured(copy, topo, self.revision + 1)
        return {"changed": True, **report}

    def plan_submit(self, spec: GroupSpec, suggested: AbstractSet[str] | None = None) -> list[Any]:
        """The wire form of what ``submit(spec, suggested)`` would answer now, run on a copy
        (nothing changes, nothing is reserved: HiveD's filtering phase, which cancels no
        preemption either)."""
        copy = Allocator(self.topology)
        copy.import_state(self.allocator.export_state())
        planned = copy.submit(spec, self.revision + 1, suggested, filtering=True)
        result: list[Any] = msgpack.unpackb(encode_result(planned))
        return result

    # ------------------------------------------------------------------ reads
    def query(self, op: bytes) -> bytes:
        """Answer a read-only query (``cluster_state.ops.get_group`` & co)."""
        try:
            query = decode_query(op)
            allocator = self.allocator
            info: Any
            match query:
                case GetGroup(name):
                    kind, info = "group", allocator.group_info(name)
                case GetVC(name):
                    kind, info = "vc", allocator.vc_info(name)
                case GetSummary():
                    kind, info = "summary", allocator.summary()
                case ListGroups(vc):
                    if vc and vc not in self.topology.vc_pinned:
                        raise RequestError(f"unknown virtual cluster {vc!r}")
                    kind, info = "groups", allocator.list_groups(vc)
                case GetEvents(since):
                    try:
                        events = self.events.since(since)
                    except EventsCompacted as exc:
                        return _pack(["compacted", since, exc.oldest])
                    kind, info = "events", [e.to_wire() for e in _page(events)]
                case GetDigest():
                    return self._digest_later()()
                case Inspect("physical", name):
                    kind, info = "inspect", allocator.inspect_physical(name)
                case Inspect("vc", name):
                    kind, info = "inspect", allocator.inspect_vc(name)
                case Inspect(_, name):
                    kind, info = "inspect", allocator.inspect_group(name)
                case HivedInspect(what, name):
                    kind, info = "hived", self._hived(what, name)
                case PlanReconfigure(text):
                    kind, info = "plan", self.plan_reconfiguration(text)
                case PlanSubmit(spec, suggested):
                    kind, info = "plan_submit", self.plan_submit(spec, suggested)
        except RequestError as exc:
            return _pack(["error", exc.reason])
        return _pack([kind, self.revision, info])

    def defer_query(self, op: bytes) -> Callable[[], bytes] | None:
        """The digest query off the replica's event loop (``consensus.statemachine.
        DefersQueries``): the snapshot it hashes is captured now (``capture_snapshot``, a few
        ms at 100k GPUs), packed and hashed later (15-75 ms on the loop, before). The other
        queries are answered now."""
        return self._digest_later() if op == _DIGEST_OP else None

    def _digest_later(self) -> Callable[[], bytes]:
        """The digest query's answer as of now, made when called (in any thread)."""
        snapshot, revision = self.capture_snapshot(), self.revision

        def answer() -> bytes:
            digest = hashlib.sha256(snapshot()).hexdigest()
            return _pack(["digest", revision, {"revision": revision, "sha256": digest}])

        return answer

    def _hived(self, kind: str, name: str) -> Any:
        """HiveD's inspect object ``kind`` (``cluster_state.hived_view``)."""
        view = HivedView(self.allocator)
        if kind == "vc":
            tree = view.virtual_cluster(name)
            if tree is None:
                raise RequestError(f"unknown virtual cluster {name!r}")
            return tree
        if kind == "group":
            return view.affinity_group(name)
        return {"groups": view.affinity_groups, "cluster": view.cluster_status,
                "physical": view.physical_cluster, "vcs": view.virtual_clusters}[kind]()

    def events_since(self, revision: int) -> list[ChangeEvent]:
        """Every change after ``revision`` (``EventsCompacted`` if some are gone)."""
        return self.events.since(revision)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> bytes:
        """``_pack([SNAPSHOT_FORMAT, digest, packed configuration, revision,
        allocator.export_state(), events.to_state(), sessions.to_state(), [configured,
        [digest, ...]]])``, byte for byte,
        made of pieces packed once and kept while they do not change (the configuration, each
        group's record, each event; see ``cluster_state.snapshot_encoding``)."""
        return self.capture_snapshot()()

    def capture_snapshot(self) -> Callable[[], bytes]:
        """``snapshot()`` in two parts (``consensus.runtime.snapshot_writer``): what must be
        read now — the groups' kept pieces, packed here where they changed, and copies of
        the rest; about 3 ms at 100k GPUs, on the replica's event loop — and the function
        that packs and joins them into the snapshot's bytes later, in any thread (it reads
        nothing the store changes; the events it packs, kept for the next time, are
        immutable: packing the thousands a loaded replica logs between two snapshots took
        ~10 ms of the loop, ~100 ms for a full log). The records packed here are garbage at
        once: no collector passes meanwhile. (``snapshot`` is this, finished at once: a
        subclass changes both or neither.)"""
        with gc_paused():
            events = self.events
            head = b"".join((
                packed_array_header(_SNAPSHOT_FIELDS),
                _pack(SNAPSHOT_FORMAT),
                _pack(self.topology.digest),
                _pack(_packed_config(self.topology)),
                _pack(self.revision),
            ))
            state = self.allocator.capture_packed()
            log_head = packed_array_header(_EVENT_LOG_FIELDS) + _pack(events.floor)
            logged = list(events.events)  # the events are immutable: packed later
            sessions = self.sessions.to_state()  # new lists of the (immutable) results
            configs = _pack([self.configured, list(self.configs)])
        packed_events = self._packed_events

        def finish() -> bytes:
            with gc_paused():  # what it packs is garbage at once (as above)
                return b"".join((head, state(), log_head, packed_events.pack(logged),
                                 _pack(sessions), configs))

        return finish

    def restore(self, data: bytes) -> None:
        """Load a snapshot, adopting the configuration it was taken under (a store built
        with another one runs the snapshot's until a ``reconfigure`` command changes it).
        The state is loaded in bulk, without collector passes over what it makes (nor after
        it, where the process freezes its long-lived objects: ``freeze_if_frozen``).
        (``prepare_restore``, finished at once: a subclass changes both or neither.)"""
        self.prepare_restore(data)()

    def prepare_restore(self, data: bytes) -> Callable[[], object]:
        """``restore(data)`` in two parts (``consensus.runtime.snapshot_writer``): this call,
        in any thread, builds the snapshot's state *beside* the store's (0.35-0.45 s at 98k
        GPUs, which held a replica's event loop when it installed a peer's snapshot); the
        function returned makes it the store's, at once (on the loop), and returns what it
        replaced (to be let go of off the loop: a 98k-GPU allocator takes 50-100 ms to
        free, ``snapshot_writer.release_gradually``). The build reads
        nothing of the store but its topology (an immutable object, whichever one it reads)
        and changes nothing of it, so the store goes on applying commands meanwhile; what
        they changed is replaced by the snapshot's state when the function runs. The event
        log and the session table stay the same objects (an ``AuthorizingMachine`` holds the
        table): their contents are moved in. ``SnapshotError`` (from this call) for a
        snapshot that does not load; the store is then untouched."""
        with gc_paused():
            loaded = self._load(data)
            freeze_if_frozen()  # before the collector runs again: no pass over it at all

        def adopt() -> object:
            (topology, allocator, events, sessions, revision, packed_events, configured,
             configs) = loaded
            replaced = [self.allocator, self.events.events, self._packed_events]
            replaced.append(self.sessions.take(sessions))
            self.topology = topology
            self.allocator = allocator
            self.events.floor, self.events.events = events.floor, events.events
            self.revision = revision
            self._packed_events = packed_events
            self.configured, self.configs = configured, configs
            return replaced

        return adopt

    def _load(self, data: bytes) -> tuple[Topology, Allocator, EventLog, SessionTable, int,
                                          PackedEvents, bool, dict[bytes, None]]:
        """A snapshot's state, built beside the store's (see ``prepare_restore``)."""
        try:
            fields, pieces = unpack_snapshot(data, SNAPSHOT_FORMAT, _SNAPSHOT_FIELDS)
            fmt = fields[0]
        except Exception as exc:
            raise SnapshotError(f"not a cluster_state snapshot: {exc}") from None
        if fmt not in _FORMATS_READ:
            raise SnapshotError(f"snapshot format {fmt!r}, this build reads formats "
                                f"{sorted(_FORMATS_READ)}")
        try:
            configured, configs = True, None  # an earlier format: configured, as kept beside
            if fmt == _SNAPSHOT_FORMAT_NO_CONFIG:
                _, digest, revision, state, events, sessions = fields
                config = None
            elif fmt == SNAPSHOT_FORMAT:
                _, digest, config, revision, state, events, sessions, (configured, configs) = (
                    fields)
                configs = [bytes(d) for d in configs]
            else:
                _, digest, config, revision, state, events, sessions = fields
        except Exception as exc:
            raise SnapshotError(f"not a cluster_state snapshot: {exc}") from None
        topology = self.topology
        if digest != topology.digest:
            if config is None:
                raise SnapshotError(
                    "the snapshot was taken with a different cluster configuration"
                )
            try:
                if fmt in (SNAPSHOT_FORMAT, _SNAPSHOT_FORMAT_PACKED_CONFIG):
                    config = msgpack.unpackb(config)
                topology = topology_of(parse_config(config))
            except GpuConfigError as exc:
                raise SnapshotError(f"the snapshot's configuration is invalid: {exc}") from None
            if topology.digest != digest:
                raise SnapshotError("the snapshot's configuration does not match its digest")
        try:
            allocator = Allocator(topology, bulk=True)  # indexes built once, at the end
            allocator.import_state(state)
            event_log = EventLog(self.events.limit)
            event_log.load_state(events)
            table = SessionTable(self.sessions.limits)
            table.load_state(sessions)
            revision = int(revision)
        except Exception as exc:
            raise SnapshotError(f"the snapshot's state does not load: {exc!r}") from None
        packed_events = PackedEvents()
        kept = dict.fromkeys(configs if configs is not None else [topology.digest])
        if pieces is not None:  # the snapshot's own bytes of what was just loaded from it
            allocator.keep_packed(state[0], pieces.groups)
            packed_events.keep(event_log.events, pieces.events)
        return (topology, allocator, event_log, table, revision, packed_events,
                bool(configured), kept)
