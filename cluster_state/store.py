"""``ClusterStore``: the allocation state machine behind the ``consensus`` ``StateMachine``
protocol.

``apply(position, command)`` decodes ``command.op`` (see ``cluster_state.ops``), runs it on the
``Allocator`` and answers msgpack result bytes. A retried command — the same
``(client_id, seq)`` proposed again, possibly at another replica — answers its first result
without running again (``SessionTable``). An invalid op answers ``["error", reason]`` and
changes nothing; when the verdict depends on the op alone (malformed, unknown VC, priority out
of range, ...) it is not even remembered in the session table, since running a retry again
gives the same answer, so the snapshot stays byte-identical.

**Revisions.** ``revision`` is the global log position of the last command that changed the
store (allocations, health or a remembered session result). A placement's *fencing token* is
the position it took effect at; every change event carries the position that made it, and
``events_since(revision)`` feeds watchers. Leaves remember the revision of their last change,
which is what a conditional ``bind`` checks.

**Snapshots** hold only the facts (groups, bindings, bad nodes, leaf revisions, recent events,
sessions) in a canonical order; ``restore`` rebuilds every derived structure from them, so two
replicas that applied the same log produce identical bytes, and ``restore(s).snapshot() == s``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from cluster_state.allocator import Allocator
from cluster_state.cells import Topology
from cluster_state.config import ClusterConfig
from cluster_state.errors import EventsCompacted, RequestError, SnapshotError
from cluster_state.events import ChangeEvent, EventLog
from cluster_state.ops import (
    Bind,
    Error,
    GetDigest,
    GetEvents,
    GetGroup,
    GetSummary,
    GetVC,
    ListGroups,
    Op,
    Release,
    Result,
    SetNodeHealth,
    Submit,
    decode_op,
    decode_query,
    encode_result,
)
from consensus.messages import Command
from consensus.statemachine import SessionTable

__all__ = ["SNAPSHOT_FORMAT", "ClusterStore"]

#: Bumped whenever the snapshot layout changes.
SNAPSHOT_FORMAT = 1

#: about this many events per page of the watch stream (whole revisions only)
EVENTS_PAGE = 512


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


class ClusterStore:
    """A replicated GPU allocation store (HiveD's model); implements ``StateMachine``."""

    __slots__ = ("allocator", "applied_position", "events", "revision", "sessions", "topology")

    def __init__(self, config: ClusterConfig | Topology, *, event_limit: int = 4096) -> None:
        self.topology = config if isinstance(config, Topology) else Topology(config)
        self.allocator = Allocator(self.topology)
        self.sessions = SessionTable()
        self.events = EventLog(event_limit)
        self.revision = -1
        self.applied_position = -1  # not part of the snapshot: the driver's meta has it

    # ------------------------------------------------------------------ writes
    def apply(self, position: int, command: Command) -> bytes:
        self.applied_position = position
        previous = self.sessions.lookup(command.client_id, command.seq)
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
            case Submit(spec):
                return allocator.submit(spec, position)
            case Bind(spec, pods, revision):
                return allocator.bind(spec, pods, revision, position)
            case Release(name):
                return allocator.release(name, position)
            case SetNodeHealth(node, healthy):
                return allocator.set_node_health(node, healthy, position)

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
        except RequestError as exc:
            return _pack(["error", exc.reason])
        return _pack([kind, self.revision, info])

    def events_since(self, revision: int) -> list[ChangeEvent]:
        """Every change after ``revision`` (``EventsCompacted`` if some are gone)."""
        return self.events.since(revision)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> bytes:
        return _pack(
            [
                SNAPSHOT_FORMAT,
                self.topology.digest,
                self.revision,
                self.allocator.export_state(),
                self.events.to_state(),
                self.sessions.to_state(),
            ]
        )

    def restore(self, data: bytes) -> None:
        try:
            fmt, digest, revision, state, events, sessions = msgpack.unpackb(data)
        except Exception as exc:
            raise SnapshotError(f"not a cluster_state snapshot: {exc}") from None
        if fmt != SNAPSHOT_FORMAT:
            raise SnapshotError(f"snapshot format {fmt!r}, this build reads {SNAPSHOT_FORMAT}")
        if digest != self.topology.digest:
            raise SnapshotError("the snapshot was taken with a different cluster configuration")
        allocator = Allocator(self.topology)
        allocator.import_state(state)
        self.allocator = allocator
        self.events.load_state(events)
        self.sessions.load_state(sessions)
        self.revision = int(revision)
