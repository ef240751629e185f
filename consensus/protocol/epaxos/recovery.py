"""EPaxos explicit prepare: an instance known here and not committed in time is recovered at
a higher ballot (see ``_decide`` for what a majority's answers allow)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from consensus.messages import EPreAccept, EPrepare, EPrepareReply
from consensus.protocol.ballot import ballot_of, next_ballot
from consensus.protocol.epaxos.state import (
    ACCEPTED,
    COMMITTED,
    HEARTBEAT_WINDOW,
    NONE,
    PREACCEPT_PHASE,
    PREACCEPTED,
    PREACCEPTED_EQ,
    PREPARE_PHASE,
    RECOVERIES_PER_TICK,
    Batch,
    Drive,
    Instance,
    InstanceId,
    merge,
)

if TYPE_CHECKING:
    from consensus.messages import PeerMessage

__all__ = ["RecoveryMixin"]


class RecoveryMixin:
    """The recovery part of ``EPaxosReplica`` (which provides the state declared here)."""

    if TYPE_CHECKING:
        n: int
        f: int
        q: int
        me: int
        now: int
        rng: random.Random
        exec_counts: list[int]
        instances: dict[InstanceId, Instance]
        _known_high: list[int]
        _drives: dict[InstanceId, Drive]
        _waiting: dict[InstanceId, int]
        _none_deps: tuple[int, ...]

        def _send(self, to: int, message: PeerMessage) -> None: ...
        def _broadcast(self, message: PeerMessage) -> None: ...
        def _persist(self, iid: InstanceId, inst: Instance) -> None: ...
        def _deadline(self) -> int: ...
        def _wait_for(self, iid: InstanceId) -> None: ...
        def _below_snapshot(self, iid: InstanceId, src: int) -> bool: ...
        def _refused(self, iid: InstanceId, ballot: int) -> None: ...
        def _start_accept(self, iid: InstanceId, drive: Drive) -> None: ...
        def _preaccept_progress(
            self, iid: InstanceId, drive: Drive, *, timed_out: bool
        ) -> None: ...
        def _attributes(self, batch: Batch, iid: InstanceId) -> tuple[int, tuple[int, ...]]: ...
        def _note(self, iid: InstanceId, batch: Batch, seq: int) -> None: ...
        def _commit(
            self, iid: InstanceId, ballot: int, batch: Batch, seq: int, deps: tuple[int, ...]
        ) -> None: ...

    # ------------------------------------------------------------------ recovery
    def _on_heartbeat(self, src: int, next_index: int) -> None:
        """``src`` created its instances below ``next_index``: we must learn them all."""
        start = max(self._known_high[src], self.exec_counts[src])
        stop = min(next_index, self.exec_counts[src] + HEARTBEAT_WINDOW)
        for index in range(start, stop):
            self._wait_for((src, index))
        if stop > self._known_high[src]:
            self._known_high[src] = stop

    def _wait_for_frontiers(self) -> None:
        """An owner's next instance to execute, if not committed here, blocks everything
        after it: wait for the ones known to exist (a lost message may be all we missed)."""
        for owner in range(self.n):
            start = self.exec_counts[owner]
            inst = self.instances.get((owner, start))
            if inst is not None and inst.status == COMMITTED:
                continue
            stop = min(self._known_high[owner], start + HEARTBEAT_WINDOW)
            for index in range(start, stop):
                self._wait_for((owner, index))

    def _start_recoveries(self) -> None:
        due = sorted(
            (deadline, iid) for iid, deadline in self._waiting.items()
            if deadline <= self.now and iid not in self._drives
        )
        for _, iid in due[:RECOVERIES_PER_TICK]:
            self._recover(iid)

    def _recover(self, iid: InstanceId) -> None:
        inst = self.instances.get(iid)
        if inst is not None and inst.status == COMMITTED:
            self._waiting.pop(iid, None)
            return
        if inst is None:
            inst = self.instances[iid] = Instance(0, 0, NONE, (), 0, self._none_deps)
        ballot = next_ballot(inst.ballot, self.me)
        inst.ballot = ballot
        self._persist(iid, inst)
        drive = Drive(PREPARE_PHASE, ballot, (), 0, self._none_deps, self.now)
        drive.replies[self.me] = self._prepare_reply(iid, inst, ballot)
        self._drives[iid] = drive
        self._waiting[iid] = self._deadline()
        self._broadcast(EPrepare(src=self.me, view=0, owner=iid[0], index=iid[1], ballot=ballot))
        if len(drive.replies) >= self.q:
            self._decide(iid, drive)

    def _prepare_reply(self, iid: InstanceId, inst: Instance, ballot: int) -> EPrepareReply:
        return EPrepareReply(
            src=self.me, view=0, owner=iid[0], index=iid[1], ballot=ballot, ok=True,
            status=inst.status, vballot=inst.vballot, batch=inst.batch, seq=inst.seq,
            deps=inst.deps,
        )

    def _on_prepare(self, msg: EPrepare) -> None:
        iid = (msg.owner, msg.index)
        if self._below_snapshot(iid, msg.src):
            return
        inst = self.instances.get(iid)
        if inst is not None and inst.status == COMMITTED:
            self._send(msg.src, self._prepare_reply(iid, inst, msg.ballot))
            return
        if inst is not None and inst.ballot >= msg.ballot:
            if inst.ballot > msg.ballot:
                self._send(msg.src, EPrepareReply(
                    src=self.me, view=0, owner=msg.owner, index=msg.index, ballot=inst.ballot,
                    ok=False, status=NONE, vballot=0, batch=(), seq=0, deps=self._none_deps))
            else:
                self._send(msg.src, self._prepare_reply(iid, inst, msg.ballot))  # a duplicate
            return
        if inst is None:
            inst = self.instances[iid] = Instance(msg.ballot, 0, NONE, (), 0, self._none_deps)
        inst.ballot = msg.ballot
        # a higher ballot took over: ours (if we drove it) can no longer decide it
        self._drives.pop(iid, None)
        self._persist(iid, inst)
        self._wait_for(iid)
        self._send(msg.src, self._prepare_reply(iid, inst, msg.ballot))

    def _on_prepare_reply(self, msg: EPrepareReply) -> None:
        iid = (msg.owner, msg.index)
        drive = self._drives.get(iid)
        if drive is None or drive.phase != PREPARE_PHASE:
            return
        if not msg.ok:
            self._refused(iid, msg.ballot)
            return
        if msg.status == COMMITTED:
            self._commit(iid, msg.vballot, msg.batch, msg.seq, msg.deps)
            return
        if msg.ballot != drive.ballot or msg.src in drive.replies:
            return
        drive.replies[msg.src] = msg
        if len(drive.replies) >= self.q:
            self._decide(iid, drive)

    def _decide(self, iid: InstanceId, drive: Drive) -> None:
        """A majority answered the prepare: choose what may have been chosen (see the module
        docstring; why each case is safe is in the comments)."""
        owner = iid[0]
        replies = [reply for _, reply in sorted(drive.replies.items()) if reply is not None]
        accepted = [r for r in replies if r.status == ACCEPTED]
        pre = [r for r in replies if r.status in (PREACCEPTED, PREACCEPTED_EQ)]
        default = ballot_of(0, owner)
        unchanged = [
            r for r in replies
            if r.src != owner and r.status == PREACCEPTED_EQ and r.vballot == default
        ]
        owner_answered = any(r.src == owner for r in replies)
        if accepted:
            # Paxos: a value accepted at the highest ballot may have been chosen
            best = max(accepted, key=lambda r: r.vballot)
            drive.batch, drive.seq, drive.deps = best.batch, best.seq, best.deps
            self._start_accept(iid, drive)
        elif unchanged and not owner_answered and len(unchanged) >= self.f:
            # A fast-path commit had 2F replicas holding the proposed attributes; without
            # the owner, at least F of any majority are among them. Choosing those
            # attributes is safe even if they were not chosen: with the owner, F + 1
            # replicas hold them, so any conflicting command's quorum met one of them.
            # (When the owner answers PREACCEPTED it never committed: it persists a commit
            # before anyone hears of it, and gave up driving when it promised our ballot.)
            best = unchanged[0]
            drive.batch, drive.seq, drive.deps = best.batch, best.seq, best.deps
            self._start_accept(iid, drive)
        elif pre:
            # Not chosen (no fast-path quorum and nothing accepted in a majority): run the
            # pre-accept phase again at our ballot, then the slow path
            batch = pre[0].batch
            seq, deps = self._attributes(batch, iid)
            for reply in pre:
                seq, deps = max(seq, reply.seq), merge(deps, reply.deps)
            drive.phase, drive.batch, drive.seq, drive.deps = PREACCEPT_PHASE, batch, seq, deps
            drive.replies, drive.sent_at, drive.changed = {}, self.now, True
            inst = self.instances[iid]
            inst.vballot, inst.status = drive.ballot, PREACCEPTED
            inst.batch, inst.seq, inst.deps = batch, seq, deps
            self._note(iid, batch, seq)
            self._persist(iid, inst)
            self._broadcast(EPreAccept(src=self.me, view=0, owner=iid[0], index=iid[1],
                                       ballot=drive.ballot, batch=batch, seq=seq, deps=deps))
            self._preaccept_progress(iid, drive, timed_out=False)
        else:
            # nobody in a majority has seen a value: none was chosen; a no-op fills the index
            drive.batch, drive.seq, drive.deps = (), 0, self._none_deps
            self._start_accept(iid, drive)
