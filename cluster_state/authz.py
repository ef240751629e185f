"""Who may do what to the allocation store: the roles of a TLS cluster's principals.

A TLS cluster (``consensus.runtime.tls``) seals every client operation with the principal its
certificate names, and every replica asks the store, as it applies the command, whether that
principal may (``consensus.auth``). ``AuthorizedStore`` is the ``ClusterStore`` that answers:

* ``admin``: everything — updates, node health, reconfiguration, every query.
* ``reader``: every query; no update.
* ``scheduler`` of virtual clusters S: ``submit`` and ``bind`` of groups in S, ``release``
  (conditional or not) and ``claim`` of groups in S (a group of another VC is refused; an
  unknown name gets the store's own answer),
  and the queries about S: a group in S (or unknown), a VC in S, the groups of a VC in S,
  inspect of a VC in S or of a group in S, and the watch stream with the events of S's groups
  only. Node health, reconfiguration, its plan, the cluster summary, the digest, the physical
  inspect tree and all groups at once are an admin's (or a reader's) business.

The verdict depends on the principal, the operation and the store's state at the command's
place in the log, so every replica reaches the same one; a refused command changes nothing
(it is not even remembered in the session table: a retry is judged again).

Verdicts on updates read replicated state only (the store's groups), so every replica reaches
the same. Reads are judged by the serving replica alone, and events are attributed to a VC by
their group: through the store's groups, then the VCs this replica saw groups submitted or
bound into (kept in memory, not in snapshots: it only filters what a scheduler reads). An
event whose group's VC is unknown here (a group released before this replica restarted from a
snapshot) is not shown to a scheduler: filtering fails closed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from cluster_state import ops
from cluster_state.errors import RequestError
from cluster_state.events import ChangeEvent
from cluster_state.store import ClusterStore
from consensus.auth import ADMIN, READER, SCHEDULER, Principal
from consensus.messages import Command

__all__ = ["SKIPPED", "AuthorizedStore", "group_event_kinds"]

#: the kind of the placeholder that ends a scheduler's watch page whose last events it may not
#: see: only its revision matters (where the watcher resumes); ``AllocationStore.watch`` drops
#: it
SKIPPED = "skipped"

#: event kinds whose subject is a group (the others — node health, reconfiguration — are the
#: whole cluster's)
_GROUP_EVENTS = frozenset({"placed", "preempting", "downgraded", "reserved", "cancelled",
                           "released", "trimmed", "claimed"})


#: how a submit's and a bind's op begin after their msgpack array header (``ops.submit``)
_SUBMIT = msgpack.packb("submit")
_BIND = msgpack.packb("bind")


def group_event_kinds() -> frozenset[str]:
    return _GROUP_EVENTS


class AuthorizedStore(ClusterStore):
    """The allocation store that judges principals (``consensus.auth.Authorizer``) and trims
    watch pages to them (``consensus.auth.AnswerFilter``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: group -> VC of every group seen submitted or bound here (read filtering only)
        self._seen_vcs: dict[str, str] = {}

    # ------------------------------------------------------------------ bookkeeping
    def apply_batch(self, position: int, commands: Sequence[Command]) -> list[bytes]:
        # (``apply`` comes here too) only submits and binds name a group's VC: the others
        # are not decoded twice
        for command in commands:
            data = command.op
            if data[1:8] == _SUBMIT or data[1:6] == _BIND:
                try:
                    op = ops.decode_op(data)
                except RequestError:
                    op = None
                if isinstance(op, ops.Submit | ops.Bind):
                    self._seen_vcs[op.spec.name] = op.spec.vc
        return super().apply_batch(position, commands)

    def vc_of(self, group: str) -> str | None:
        """The VC of ``group`` if the store holds it: replicated state only, what the
        verdicts on updates may depend on (every replica must reach the same)."""
        found = self.allocator.groups.get(group)
        return found.spec.vc if found is not None else None

    def seen_vc_of(self, group: str) -> str | None:
        """``vc_of``, or the VC this replica saw the group submitted or bound into: for
        filtering what a scheduler reads (not replicated: never for a verdict on an
        update)."""
        return self.vc_of(group) or self._seen_vcs.get(group)

    # ------------------------------------------------------------------ the verdicts
    def authorize(self, principal: Principal, op: bytes, *, read: bool) -> str | None:
        if principal.role == ADMIN:
            return None
        if principal.role == READER:
            return None if read else f"{principal.describe()} may not change the store"
        if principal.role != SCHEDULER:
            return f"unknown role {principal.role!r}"
        return self._query_verdict(principal, op) if read else self._update_verdict(
            principal, op)

    def _update_verdict(self, principal: Principal, data: bytes) -> str | None:
        who = principal.describe()
        try:
            op = ops.decode_op(data)
        except RequestError:
            return f"{who} may only submit, bind and release groups"
        if isinstance(op, ops.Submit | ops.Bind):
            if op.spec.vc not in principal.vcs:
                return f"{who} may not place groups in virtual cluster {op.spec.vc!r}"
            owner = self.vc_of(op.spec.name)
            if owner is not None and owner not in principal.vcs:
                return f"{who} may not touch group {op.spec.name!r} (another virtual cluster)"
            return None
        if isinstance(op, ops.Release | ops.ReleaseIf | ops.Claim):
            owner = self.vc_of(op.name)
            if owner is not None and owner not in principal.vcs:
                verb = "claim pods of" if isinstance(op, ops.Claim) else "release"
                return f"{who} may not {verb} group {op.name!r} of another virtual cluster"
            return None
        return f"{who} may not {type(op).__name__.lower()}: that is an admin's"

    def _query_verdict(self, principal: Principal, data: bytes) -> str | None:
        who = principal.describe()
        try:
            query = ops.decode_query(data)
        except RequestError:
            return f"{who} may only read its own virtual clusters"
        mine = principal.vcs
        if isinstance(query, ops.GetEvents):
            return None  # the page is trimmed to its VCs (filter_answer)
        if isinstance(query, ops.GetGroup) or (
            isinstance(query, ops.Inspect) and query.kind == "group"
        ):
            owner = self.seen_vc_of(query.name)
            return None if owner is None or owner in mine else (
                f"{who} may not read group {query.name!r} of another virtual cluster")
        if isinstance(query, ops.GetVC | ops.ListGroups) or (
            isinstance(query, ops.Inspect) and query.kind == "vc"
        ):
            vc = query.vc if isinstance(query, ops.ListGroups) else query.name
            return None if vc in mine else f"{who} may not read virtual cluster {vc!r}"
        return f"{who} may not read the whole cluster's state"

    # ------------------------------------------------------------------ the watch stream
    def visible(self, principal: Principal, event: ChangeEvent) -> bool:
        """Whether ``principal`` may see ``event``."""
        return self.visible_kind(principal, event.kind, event.subject)

    def visible_kind(self, principal: Principal, kind: str, subject: str) -> bool:
        """Whether ``principal`` may see an event of ``kind`` about ``subject``."""
        if principal.role != SCHEDULER:
            return True
        if kind not in _GROUP_EVENTS:
            return False
        return self.seen_vc_of(subject) in principal.vcs

    def filter_answer(self, principal: Principal, op: bytes, answer: bytes) -> bytes:
        if principal.role != SCHEDULER:
            return answer
        try:
            query = ops.decode_query(op)
        except RequestError:
            return answer
        if not isinstance(query, ops.GetEvents):
            return answer
        decoded = msgpack.unpackb(answer)
        if decoded[0] != "events":
            return answer  # compacted: no events in it
        page = decoded[2]
        kept = [wire for wire in page if self.visible(principal, ChangeEvent.from_wire(wire))]
        if page and (not kept or kept[-1] is not page[-1]):
            # the watcher resumes after the page's last revision: without this it would read
            # the same page of other VCs' events again and again
            kept.append([page[-1][0], SKIPPED, "", []])
        packed: bytes = msgpack.packb([decoded[0], decoded[1], kept])
        return packed
