"""SDPaxos message builders and small fixtures shared by the tests of this package.

View 0's sequencer is replica 0 throughout. Generic helpers (commands, one turn by hand, the
message bag) are in ``tests/protocol/util.py``.
"""

from __future__ import annotations

import random

from util import cmd, core, drain, msgs

from consensus.messages import (
    CAccept,
    CAck,
    CCommit,
    CRequest,
    NewView,
    NewViewRecord,
    OAccept,
    OAcceptedRecord,
    OAck,
    OCommit,
    OEntry,
    PeerMessage,
    Record,
    ViewRecord,
)
from consensus.protocol.ready import Ready
from consensus.protocol.sdpaxos import SDPaxosReplica

A = cmd(7, 0)
B = cmd(7, 1)
C = cmd(8, 0)
D = cmd(9, 0)


def caccept(src: int, owner: int, index: int, batch: tuple, *, ballot: int | None = None,
            view: int = 0) -> CAccept:
    return CAccept(src=src, view=view, owner=owner, index=index,
                   ballot=owner if ballot is None else ballot, batch=batch)


def cack(src: int, owner: int, index: int, *, ballot: int | None = None,
         view: int = 0) -> CAck:
    return CAck(src=src, view=view, owner=owner, index=index,
                ballot=owner if ballot is None else ballot)


def ccommit(src: int, owner: int, index: int, batch: tuple | None, *,
            ballot: int | None = None, view: int = 0) -> CCommit:
    return CCommit(src=src, view=view, owner=owner, index=index,
                   ballot=owner if ballot is None else ballot, batch=batch)


def crequest(src: int, index: int, *, o_prefix: int = 0, view: int = 0) -> CRequest:
    return CRequest(src=src, view=view, owner=src, index=index, keys=(), o_prefix=o_prefix)


def oaccept(*entries: tuple[int, int], view: int = 0, src: int = 0) -> OAccept:
    return OAccept(src=src, view=view, entries=tuple(OEntry(slot=s, owner=o) for s, o in entries))


def ocommit(src: int, *entries: tuple[int, int], view: int = 0) -> OCommit:
    return OCommit(src=src, view=view, entries=tuple(OEntry(slot=s, owner=o) for s, o in entries))


def oack(src: int, *slots: int) -> OAck:
    return OAck(src=src, view=0, slots=slots)


def o_entries(ready: Ready) -> list[tuple[int, int]]:
    """(slot, owner) of every O-instance persisted in ``ready``."""
    return [
        (e.slot, e.owner)
        for r in ready.persist
        if isinstance(r, OAcceptedRecord)
        for e in r.entries
    ]


def all_out(ready: Ready) -> list[tuple[int, PeerMessage]]:
    return msgs(ready.send_after_persist) + msgs(ready.send)


def in_view_1(me: int) -> SDPaxosReplica:
    """A replica that joined view 1 (sequencer: replica 1) and accepted its NewView."""
    r = core(3, me)
    r.step(NewView(src=1, view=1, start=0, owners=()), 0)
    ready = drain(r)
    assert ready.persist == [
        ViewRecord(view=1),
        NewViewRecord(view=1, start=0, owners=()),
    ]
    assert r.view == 1
    return r


def compacted_at(me: int, owner: int) -> SDPaxosReplica:
    """A replica that executed ``owner``'s C[owner][0] in slot 0 and compacted it away."""
    r = core(3, me)
    r.step(caccept(owner, owner, 0, (A,)), 0)
    r.step(ccommit(owner, owner, 0, (A,)), 0)
    r.step(ocommit(0, (0, owner)), 0)
    assert [e.command for e in drain(r).executions()] == [A]
    r.compact(r.snapshot_meta())
    drain(r)
    return r


def restarted(r: SDPaxosReplica, records: list[Record]) -> tuple[SDPaxosReplica, Ready]:
    again = SDPaxosReplica(r.config, r.me, recovered=records, rng=random.Random(0))
    return again, drain(again)
