"""The watch stream: a bounded, in-memory list of change events with revisions.

Each event records one change an applied operation made, tagged with the operation's global
log position (its *revision*); one operation may emit several events with the same revision.
``events_since(r)`` returns every kept event with revision > ``r``; once older events have
been dropped to respect the bound, a watcher that is further behind gets ``EventsCompacted``
and must re-read the state (as with etcd's compacted watch revisions).

Kinds and data:

=================  =======================  ===============================================
kind               subject                  data
=================  =======================  ===============================================
``placed``         group                    ``[chain, pods, token]`` (as the placed result)
``preempting``     group                    ``[victim, ...]``
``downgraded``     group (lazily preempted) ``[preemptor]`` ("" for a reconfiguration)
``reserved``       group (a preemptor)      ``[]``: its victims are gone; confirm it
``cancelled``      group (a preemptor)      ``[reason]``
``released``       group                    ``[]``
``node_health``    node                     ``[healthy]``
``trimmed``        group                    ``[chain, pods, token]``: a reconfiguration
                                            dropped some of its leaves
``reconfigured``   ""                       ``[sha256 of the new configuration]``
``claimed``        group                    ``[incarnation, slot, uid, pod, previous]``: pod
                                            ``uid`` ("namespace/name" ``pod``) took member
                                            pod ``slot`` (from ``previous``, "" for nobody)
=================  =======================  ===============================================

``ChangeEvent.details`` gives the data as named fields (``PlacedDetails`` & co, by kind).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from cluster_state.errors import EventsCompacted
from cluster_state.ops import Pod

__all__ = [
    "CancelledDetails",
    "ChangeEvent",
    "ClaimedDetails",
    "DowngradedDetails",
    "EventDetails",
    "EventLog",
    "NodeHealthDetails",
    "PlacedDetails",
    "PreemptingDetails",
    "ReconfiguredDetails",
]


@dataclass(frozen=True, slots=True)
class PlacedDetails:
    """``placed`` (and ``trimmed``: the smaller placement left)."""

    chain: str
    pods: tuple[Pod, ...]
    token: int


@dataclass(frozen=True, slots=True)
class PreemptingDetails:
    victims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DowngradedDetails:
    preemptor: str  # "" for a reconfiguration


@dataclass(frozen=True, slots=True)
class CancelledDetails:
    reason: str


@dataclass(frozen=True, slots=True)
class NodeHealthDetails:
    healthy: bool


@dataclass(frozen=True, slots=True)
class ReconfiguredDetails:
    digest: str  # sha256 hex of the new configuration


@dataclass(frozen=True, slots=True)
class ClaimedDetails:
    """A pod took a member pod of a placed group (``cluster_state.ops``' claim)."""

    incarnation: int
    slot: int
    uid: str
    pod: str  # "namespace/name"
    previous: str  # the pod UID that held it before ("" for nobody)


#: None for ``released`` and ``reserved`` (nothing more to say)
EventDetails = (PlacedDetails | PreemptingDetails | DowngradedDetails | CancelledDetails
                | NodeHealthDetails | ReconfiguredDetails | ClaimedDetails | None)


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    revision: int
    kind: str
    subject: str
    data: tuple[Any, ...]  # the wire form (see the table above); ``details`` names it

    @property
    def details(self) -> EventDetails:
        """``data`` as named fields, by ``kind``."""
        data = self.data
        match self.kind:
            case "placed" | "trimmed":
                chain, pods, token = data
                return PlacedDetails(chain, tuple(Pod(n, node, tuple(d)) for n, node, d in pods),
                                     token)
            case "preempting":
                return PreemptingDetails(tuple(data))
            case "downgraded":
                return DowngradedDetails(data[0])
            case "cancelled":
                return CancelledDetails(data[0])
            case "node_health":
                return NodeHealthDetails(bool(data[0]))
            case "reconfigured":
                return ReconfiguredDetails(data[0])
            case "claimed":
                incarnation, slot, uid, pod, previous = data
                return ClaimedDetails(int(incarnation), int(slot), str(uid), str(pod),
                                      str(previous))
        return None

    def to_wire(self) -> list[Any]:
        return [self.revision, self.kind, self.subject, list(self.data)]

    @classmethod
    def from_wire(cls, wire: list[Any]) -> ChangeEvent:
        revision, kind, subject, data = wire
        return cls(int(revision), str(kind), str(subject), tuple(data))


class EventLog:
    """At most ``limit`` events; ``floor`` is the revision a watcher must have seen at least
    (every event with a revision above it is still here)."""

    __slots__ = ("events", "floor", "limit")

    def __init__(self, limit: int = 4096) -> None:
        if limit < 1:
            raise ValueError("the event log needs room for at least one event")
        self.limit = limit
        self.events: deque[ChangeEvent] = deque()
        self.floor = -1

    def append(self, event: ChangeEvent) -> None:
        self.events.append(event)
        while len(self.events) > self.limit:
            dropped = self.events.popleft()
            # A watcher that saw revision R needs nothing at or below R; one still behind
            # the dropped event's revision would miss it.
            self.floor = dropped.revision

    def since(self, revision: int) -> list[ChangeEvent]:
        if revision < self.floor:
            raise EventsCompacted(revision, self.floor)
        if not self.events or self.events[-1].revision <= revision:
            return []
        # Events are in revision order; scan back from the newest (watchers are usually near).
        out = []
        for event in reversed(self.events):
            if event.revision <= revision:
                break
            out.append(event)
        out.reverse()
        return out

    def to_state(self) -> list[Any]:
        return [self.floor, [e.to_wire() for e in self.events]]

    def load_state(self, state: list[Any]) -> None:
        floor, events = state
        self.floor = int(floor)
        self.events = deque(ChangeEvent.from_wire(e) for e in events)
