"""EPaxos explicit prepare: an instance known here and not committed in time is recovered at
a higher ballot (see ``_decide`` for what a majority's answers allow), with the TryPreAccept
phase the optimized fast quorum needs (``_try_preaccept``)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from consensus.messages import (
    TRY_CONFLICT,
    TRY_CONFLICT_COMMITTED,
    TRY_OK,
    EPreAccept,
    EPrepare,
    EPrepareReply,
    ETryPreAccept,
    ETryPreAcceptReply,
)
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
    TRY_PHASE,
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
        try_quorum: int
        _try_unchecked: bool
        _ignore_preaccepted: bool
        _key_high: dict[str, list[int]]
        _keyless_high: list[int]
        _any_high: list[int]
        _compacted: list[int]
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
        def _tell_committed(self, to: int, iid: InstanceId, inst: Instance) -> None: ...
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
        if self._ignore_preaccepted:
            pre, unchanged = [], []  # deliberately broken (a teeth test): as if none saw it
        owner_answered = any(r.src == owner for r in replies)
        if accepted:
            # Paxos: a value accepted at the highest ballot may have been chosen
            best = max(accepted, key=lambda r: r.vballot)
            drive.batch, drive.seq, drive.deps = best.batch, best.seq, best.deps
            self._start_accept(iid, drive)
        elif unchanged and not owner_answered and len(unchanged) >= self.f:
            # The owner's attributes, held by F replicas besides the owner (a majority with
            # it, so every later conflicting command meets one of them and depends on this
            # one), each of which knew no conflicting command outside them when it
            # pre-accepted: choosing them is safe whether or not the fast path chose them.
            # (When the owner answers PREACCEPTED it never committed: it persists a commit
            # before anyone hears of it, and gave up driving when it promised our ballot.)
            best = unchanged[0]
            drive.batch, drive.seq, drive.deps = best.batch, best.seq, best.deps
            self._start_accept(iid, drive)
        elif unchanged and not owner_answered and len(unchanged) >= self.try_quorum:
            # A fast quorum of F + floor((F+1)/2) leaves at least floor((F+1)/2) of its
            # members in any majority without the owner: the owner's attributes may have
            # been chosen. Ask the others to hold them too, if nothing they know conflicts.
            self._try_preaccept(iid, drive, unchanged[0], tuple(pre))
        elif pre:
            # Not chosen (no fast-path quorum and nothing accepted in a majority): run the
            # pre-accept phase again at our ballot, then the slow path
            self._preaccept_again(iid, drive, tuple(pre))
        else:
            # nobody in a majority has seen a value: none was chosen; a no-op fills the index
            drive.batch, drive.seq, drive.deps = (), 0, self._none_deps
            self._start_accept(iid, drive)

    def _preaccept_again(
        self, iid: InstanceId, drive: Drive, pre: tuple[EPrepareReply, ...]
    ) -> None:
        """Phase 1 again at the recovery's ballot (the value was not chosen): the attributes
        of every reply that pre-accepted it, merged with ours; the slow path follows."""
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

    # ------------------------------------------------------------------ TryPreAccept
    def _try_preaccept(
        self, iid: InstanceId, drive: Drive, proposed: EPrepareReply,
        pre: tuple[EPrepareReply, ...],
    ) -> None:
        """Recover the owner's attributes ``proposed`` (seen unchanged at its default ballot by
        fewer than F replicas): once F replicas besides the owner hold them, a majority with
        the owner, they are safe to accept (as in ``_decide``). A replica holding a committed
        conflicting command outside them proves they were not chosen (two conflicting
        commands, neither depending on the other, never both commit): phase 1 starts again.
        Conflicts not yet committed defer the recovery until they are (``_try_progress``)."""
        drive.phase, drive.replies, drive.sent_at = TRY_PHASE, {}, self.now
        drive.batch, drive.seq, drive.deps = proposed.batch, proposed.seq, proposed.deps
        drive.prepared = pre
        drive.holders = {
            r.src for r in pre
            if r.src != iid[0] and r.status == PREACCEPTED_EQ
            and r.vballot == ballot_of(0, iid[0]) and r.seq == proposed.seq
            and r.deps == proposed.deps
        }
        drive.refusals = set()
        if self.me not in drive.holders:
            conflict = self._try_conflict(iid, drive.batch, drive.deps)
            if conflict == TRY_CONFLICT_COMMITTED:
                self._preaccept_again(iid, drive, pre)
                return
            if conflict == TRY_OK:
                self._hold(iid, drive.ballot, drive.batch, drive.seq, drive.deps)
                drive.holders.add(self.me)
            else:
                drive.refusals.add(self.me)
        message = self._try_message(iid, drive)
        for peer in self._try_targets(iid, drive):
            self._send(peer, message)
        self._try_progress(iid, drive, timed_out=False)

    def _try_message(self, iid: InstanceId, drive: Drive) -> ETryPreAccept:
        return ETryPreAccept(src=self.me, view=0, owner=iid[0], index=iid[1],
                             ballot=drive.ballot, batch=drive.batch, seq=drive.seq,
                             deps=drive.deps)

    def _try_targets(self, iid: InstanceId, drive: Drive) -> list[int]:
        """Replicas a TryPreAccept still has to hear from (never the owner: it holds its own
        attributes, and counting it twice would make F holders look like F + 1)."""
        return [
            peer for peer in range(self.n)
            if peer not in (self.me, iid[0]) and peer not in drive.holders
            and peer not in drive.refusals
        ]

    def _try_progress(self, iid: InstanceId, drive: Drive, *, timed_out: bool) -> None:
        if len(drive.holders) >= self.f:
            self._start_accept(iid, drive)
        elif drive.refusals and (timed_out or not self._try_targets(iid, drive)):
            # Conflicts not committed yet: they may have been chosen instead of these
            # attributes or after them. Give up for now (their owners, or the refusers'
            # recoveries, commit them) and prepare again later, when the answers differ.
            del self._drives[iid]
            self._waiting[iid] = self._deadline()

    def _on_try_preaccept_reply(self, msg: ETryPreAcceptReply) -> None:
        iid = (msg.owner, msg.index)
        drive = self._drives.get(iid)
        if drive is None or drive.phase != TRY_PHASE:
            return
        if not msg.ok:
            self._refused(iid, msg.ballot)
            return
        if msg.ballot != drive.ballot or msg.src in drive.holders or msg.src in drive.refusals:
            return
        if msg.conflict == TRY_CONFLICT_COMMITTED:
            self._preaccept_again(iid, drive, drive.prepared)
            return
        if msg.conflict == TRY_OK:
            drive.holders.add(msg.src)
        else:
            drive.refusals.add(msg.src)
        self._try_progress(iid, drive, timed_out=False)

    def _on_try_preaccept(self, msg: ETryPreAccept) -> None:
        """Pre-accept the owner's attributes at the recoverer's ballot (promising it) unless an
        instance known here conflicts with them (``_try_conflict``)."""
        iid = (msg.owner, msg.index)
        if self._below_snapshot(iid, msg.src):
            return
        inst = self.instances.get(iid)
        if inst is not None and inst.status == COMMITTED:
            self._tell_committed(msg.src, iid, inst)
            return
        if inst is not None and inst.ballot > msg.ballot:
            self._send(msg.src, ETryPreAcceptReply(
                src=self.me, view=0, owner=msg.owner, index=msg.index, ballot=inst.ballot,
                ok=False, conflict=TRY_OK))
            return
        conflict = self._try_conflict(iid, msg.batch, msg.deps)
        if conflict == TRY_OK:
            self._hold(iid, msg.ballot, msg.batch, msg.seq, msg.deps)
        else:
            if inst is None:
                inst = self.instances[iid] = Instance(0, 0, NONE, (), 0, self._none_deps)
            if inst.ballot < msg.ballot:
                inst.ballot = msg.ballot
                self._persist(iid, inst)
        # a higher ballot took over: ours (if we drove it) can no longer decide it
        self._drives.pop(iid, None)
        self._wait_for(iid)
        self._send(msg.src, ETryPreAcceptReply(
            src=self.me, view=0, owner=msg.owner, index=msg.index, ballot=msg.ballot, ok=True,
            conflict=conflict))

    def _hold(
        self, iid: InstanceId, ballot: int, batch: Batch, seq: int, deps: tuple[int, ...]
    ) -> None:
        """Promise ``ballot`` and hold the owner's attributes for ``iid`` (a record that
        pre-accepted them unchanged at the owner's default ballot stays as it is: it is the
        evidence of a possible fast path a later recovery must see)."""
        inst = self.instances.get(iid)
        if inst is None:
            inst = self.instances[iid] = Instance(ballot, ballot, PREACCEPTED, batch, seq, deps)
        else:
            inst.ballot = max(inst.ballot, ballot)
            original = (
                inst.status == PREACCEPTED_EQ and inst.vballot == ballot_of(0, iid[0])
                and inst.seq == seq and inst.deps == deps
            )
            if not original:
                inst.vballot, inst.status = ballot, PREACCEPTED
                inst.batch, inst.seq, inst.deps = batch, seq, deps
        self._note(iid, batch, seq)
        self._persist(iid, inst)

    def _try_conflict(self, iid: InstanceId, batch: Batch, deps: tuple[int, ...]) -> int:
        """Whether an instance known here conflicts with ``batch`` at ``iid`` with ``deps``:
        one that shares a key with it (or names none), is not among ``deps``, and does not
        depend on ``iid``. The owner's own instances never conflict (each replica's instances
        run in index order anyway)."""
        if self._try_unchecked:
            return TRY_OK  # deliberately broken (a teeth test)
        inst = self.instances.get(iid)
        if inst is not None and inst.status == ACCEPTED:
            # accepted at a lower ballot than the recoverer's: never regress it to a
            # pre-accept; the recoverer counts on the others
            return TRY_CONFLICT
        owner, index = iid
        keyless = any(not command.keys for command in batch)
        keys = {key for command in batch for key in command.keys}
        found = TRY_OK
        for r in range(self.n):
            if r == owner:
                continue
            if keyless:
                high = self._any_high[r]
            else:
                high = self._keyless_high[r]
                for key in keys:
                    highs = self._key_high.get(key)
                    if highs is not None and highs[r] > high:
                        high = highs[r]
            low = deps[r] + 1
            if high < low:
                continue
            if low < self._compacted[r]:
                # instances executed and forgotten here may conflict: we cannot tell
                found = TRY_CONFLICT
                low = self._compacted[r]
            for j in range(low, high + 1):
                other = self.instances.get((r, j))
                if other is None or not other.batch or other.deps[owner] >= index:
                    continue
                if not _conflicting(other.batch, keyless, keys):
                    continue
                if other.status == COMMITTED:
                    return TRY_CONFLICT_COMMITTED
                found = TRY_CONFLICT
        return found


def _conflicting(batch: Batch, keyless: bool, keys: set[str]) -> bool:
    """Whether ``batch`` conflicts with a batch naming ``keys`` (``keyless``: or a command
    naming none, which conflicts with everything)."""
    if keyless:
        return True
    return any(not command.keys or not keys.isdisjoint(command.keys) for command in batch)
