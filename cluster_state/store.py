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
store (allocations, health or a remembered session result). A placement's *fencing token* is
the position it took effect at; every change event carries the position that made it, and
``events_since(revision)`` feeds watchers. Leaves remember the revision of their last change,
which is what a conditional ``bind`` checks.

**Snapshots** hold only the facts (groups, bindings, bad nodes, leaf revisions, recent events,
sessions) in a canonical order; ``restore`` rebuilds every derived structure from them, so two
replicas that applied the same log produce identical bytes, and ``restore(s).snapshot() == s``.

**Reconfiguration** is a logged command (``ops.reconfigure(yaml_text)``): every replica parses
and validates the text itself and rebuilds its allocator for the new configuration keeping the
groups (``cluster_state.reconfiguration``: work-preserving, deterministic), so replicas stay
identical.
A snapshot carries the configuration it was taken under, and ``restore`` adopts it whatever
this store was built with, so a replica restarted with an edited configuration file first
catches up under the configuration the log ran with. **What a serving replica must do at
start** (the serve path owns it): build the store from the configuration the log *began* with
(keep that file beside the log), restore the snapshot and replay the log as usual, then — once
the node serves — if ``store.needs_reconfiguration(file_config)``, propose
``ops.reconfigure(file_text)`` through the log like any update. Several replicas proposing the
same text is harmless: a configuration the store already runs answers ``changed: false``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any

import msgpack

from cluster_state.allocator import Allocator
from cluster_state.cells import Topology, topology_of
from cluster_state.config import NODES_START_BAD, ClusterConfig, parse_config
from cluster_state.errors import EventsCompacted, GpuConfigError, RequestError, SnapshotError
from cluster_state.events import ChangeEvent, EventLog
from cluster_state.gc_pause import freeze_if_frozen, gc_paused
from cluster_state.ops import (
    Bind,
    Claim,
    Error,
    GetDigest,
    GetEvents,
    GetGroup,
    GetSummary,
    GetVC,
    GroupSpec,
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
)
from cluster_state.reconfiguration import reconfigured
from cluster_state.snapshot_encoding import PackedEvents, packed_array_header, unpack_snapshot
from consensus.messages import Command
from consensus.statemachine import SessionTable

__all__ = ["SNAPSHOT_FORMAT", "ClusterStore"]

#: Bumped whenever the snapshot layout changes (2: the configuration is in the snapshot;
#: 3: it is kept packed, compact, as one bytes field, so a restore under the same
#: configuration never decodes it: a 100k-GPU configuration is 4 MB of nested maps written out
#: in full, 0.4 MB compact, and decoding it dominated the restore).
SNAPSHOT_FORMAT = 3
#: The format with the configuration as nested maps (still read).
_SNAPSHOT_FORMAT_CONFIG_MAP = 2
#: The format before the configuration was kept (still read when the digests match).
_SNAPSHOT_FORMAT_NO_CONFIG = 1

#: a snapshot's fields (format 3) and those of its event log (``EventLog.to_state``)
_SNAPSHOT_FIELDS = 7
_EVENT_LOG_FIELDS = 2

#: about this many events per page of the watch stream (whole revisions only)
EVENTS_PAGE = 512
#: the event kinds whose subject is a group, and those that mean it is gone
_GROUP_EVENTS = frozenset({"placed", "preempting", "downgraded", "reserved", "cancelled",
                           "released", "trimmed"})
_GROUP_ENDS = frozenset({"released", "cancelled"})


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

    __slots__ = ("_packed_events", "allocator", "applied_position", "events", "revision",
                 "sessions", "topology")

    def __init__(self, config: ClusterConfig | Topology, *, event_limit: int = 4096) -> None:
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

    # ------------------------------------------------------------------ writes
    def apply(self, position: int, command: Command) -> bytes:
        self.applied_position = position
        previous = self.sessions.settled(command)  # a retry's first result, or a cancel's
        if previous is not None:
            return previous
        remember = True
        try:
            result = self._execute(decode_op(command.op), position)
        except RequestError as exc:
            result = Error(exc.reason)
            remember = not exc.static
        encoded = encode_result(result)
        for kind, subject, data in self.allocator.finish():
            self.events.append(ChangeEvent(position, kind, subject, tuple(data)))
        if remember:
            self.sessions.record(command.client_id, command.seq, encoded)
            self.revision = position
        return encoded

    def _execute(self, op: Op, position: int) -> Result:
        allocator = self.allocator
        match op:
            case Submit(spec, suggested):
                return allocator.submit(spec, position, suggested)
            case Bind(spec, pods, revision):
                return allocator.bind(spec, pods, revision, position)
            case Release(name):
                if name not in allocator.groups and self._ended(name):
                    return Released(name, (), already_released=True)
                return allocator.release(name, position)
            case SetNodeHealth(node, healthy):
                return allocator.set_node_health(node, healthy, position)
            case Reconfigure(text):
                return self._reconfigure(text, position)
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

    def _reconfigure(self, text: str, position: int) -> Result:
        topo = self._parse(text)
        if topo.digest == self.topology.digest:
            return Reconfigured(topo.digest.hex(), False, {})
        old = self.allocator
        self.allocator, report = reconfigured(old, topo, position)
        self.topology = topo
        self.allocator.events.append(("reconfigured", "", [topo.digest.hex()]))
        return Reconfigured(topo.digest.hex(), True, report)

    def needs_reconfiguration(self, config: ClusterConfig) -> bool:
        """Whether the store runs another configuration than ``config`` (then propose
        ``ops.reconfigure`` with its text)."""
        return topology_of(config).digest != self.topology.digest

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
                    digest = hashlib.sha256(self.snapshot()).hexdigest()
                    kind, info = "digest", {"revision": self.revision, "sha256": digest}
                case Inspect("physical", name):
                    kind, info = "inspect", allocator.inspect_physical(name)
                case Inspect("vc", name):
                    kind, info = "inspect", allocator.inspect_vc(name)
                case Inspect(_, name):
                    kind, info = "inspect", allocator.inspect_group(name)
                case PlanReconfigure(text):
                    kind, info = "plan", self.plan_reconfiguration(text)
                case PlanSubmit(spec, suggested):
                    kind, info = "plan_submit", self.plan_submit(spec, suggested)
        except RequestError as exc:
            return _pack(["error", exc.reason])
        return _pack([kind, self.revision, info])

    def events_since(self, revision: int) -> list[ChangeEvent]:
        """Every change after ``revision`` (``EventsCompacted`` if some are gone)."""
        return self.events.since(revision)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> bytes:
        """``_pack([SNAPSHOT_FORMAT, digest, packed configuration, revision,
        allocator.export_state(), events.to_state(), sessions.to_state()])``, byte for byte,
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
        packed_events = self._packed_events

        def finish() -> bytes:
            with gc_paused():  # what it packs is garbage at once (as above)
                return b"".join((head, state(), log_head, packed_events.pack(logged),
                                 _pack(sessions)))

        return finish

    def restore(self, data: bytes) -> None:
        """Load a snapshot, adopting the configuration it was taken under (a store built
        with another one runs the snapshot's until a ``reconfigure`` command changes it).
        The state is loaded in bulk, without collector passes over what it makes (nor after
        it, where the process freezes its long-lived objects: ``freeze_if_frozen``)."""
        with gc_paused():
            self._restore(data)
            freeze_if_frozen()  # before the collector runs again: no pass over it at all

    def _restore(self, data: bytes) -> None:
        try:
            fields, pieces = unpack_snapshot(data, SNAPSHOT_FORMAT)
            fmt = fields[0]
        except Exception as exc:
            raise SnapshotError(f"not a cluster_state snapshot: {exc}") from None
        if fmt not in (SNAPSHOT_FORMAT, _SNAPSHOT_FORMAT_CONFIG_MAP, _SNAPSHOT_FORMAT_NO_CONFIG):
            raise SnapshotError(f"snapshot format {fmt!r}, this build reads {SNAPSHOT_FORMAT}")
        try:
            if fmt == _SNAPSHOT_FORMAT_NO_CONFIG:
                _, digest, revision, state, events, sessions = fields
                config = None
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
                if fmt == SNAPSHOT_FORMAT:
                    config = msgpack.unpackb(config)
                topology = topology_of(parse_config(config))
            except GpuConfigError as exc:
                raise SnapshotError(f"the snapshot's configuration is invalid: {exc}") from None
            if topology.digest != digest:
                raise SnapshotError("the snapshot's configuration does not match its digest")
        try:
            allocator = Allocator(topology, bulk=True)  # indexes built once, at the end
            allocator.import_state(state)
        except Exception as exc:
            raise SnapshotError(f"the snapshot's state does not load: {exc!r}") from None
        self.topology = topology
        self.allocator = allocator
        self.events.load_state(events)
        self.sessions.load_state(sessions)
        self.revision = int(revision)
        if pieces is not None:  # the snapshot's own bytes of what was just loaded from it
            allocator.keep_packed(state[0], pieces.groups)
            self._packed_events.keep(self.events.events, pieces.events)
