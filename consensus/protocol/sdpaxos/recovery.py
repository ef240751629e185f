"""C-instance recovery (§3.3): finish a suspected replica's unfinished C-instances.

The next live replica after a suspected one (``_recoverer_of``) — or the owner itself, once
it learns a recoverer overtook it, or once execution waits on an instance of its own nobody
drives — runs Paxos phase 1 over the owner's instances from its execution frontier
(``start_recovery``: ``CPrepare`` at a ballot above every one seen). With promises from a
majority it re-proposes, per index, the highest-ballot value reported, and a no-op (empty
batch) where nothing was accepted (``on_cpromise``); an owner recovering its own instances
proposes its own held batches there instead.

Rules:

* A promise covers every later index of the owner (one phase 1 for all of them), and is
  durable before it is sent (``CPromiseRecord``).
* An acceptor that promised a higher ballot answers ``CNack``, which ends the lower
  recovery; a recoverer that promised a higher one meanwhile drops its own.
* Without a majority in time it asks again at the same ballot (``_ask_again``): a higher one
  would void the promises on their way.
* Promises are paged (``PROMISE_PAGE_BYTES``, ``PROMISE_PAGE_VOTES``, ``CPromise.through``):
  beyond the shortest page a value some acceptor accepted may be unknown, so no no-op goes
  there; the next page is asked at the same ballot.
* An index its owner reserved but never used (``CStore``: reservations) is untouched unless
  an O-instance references it or a promise reports it; then it gets a no-op like any index
  nobody accepted a value at. The owner's own recovery after a restart covers its whole
  restart gap (``CStore.gap``), since proposing past it orders every index of it.
* Never re-proposed: an instance executed here meanwhile (chosen, perhaps compacted). A
  Prepare reaching below our compaction point gets our snapshot instead of a promise that
  would report nothing.

Entry points: ``recover_suspects`` (every tick), ``start_recovery``, ``on_cprepare``,
``on_cpromise``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.messages import (
    EVERY_INDEX,
    CNack,
    CPrepare,
    CPromise,
    CPromiseRecord,
    CVote,
)
from consensus.protocol.batch import batch_size
from consensus.protocol.sdpaxos.instances import NO_INDEX, PLACES_NOTHING, Batch, Recovery

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["PROMISE_PAGE_BYTES", "PROMISE_PAGE_VOTES", "CRecovery"]

#: A promise reports on at most this many bytes of batches (its first vote goes whatever its
#: size) and this many votes; the recoverer asks for the next page (``CPromise.through``).
#: With a batch's own bound (``max_batch_bytes``) it keeps every promise well inside a frame.
PROMISE_PAGE_BYTES = 4 << 20

PROMISE_PAGE_VOTES = 4096


class CRecovery:
    """Prepare rounds over other replicas' (or our own) unfinished C-instances."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        self.recoveries: dict[int, Recovery] = {}
        #: C-instance recoveries this replica started (a Prepare each; a metric)
        self.recoveries_started = 0

    def start_recovery(self, owner: int, from_index: int) -> None:
        r = self.r
        ballot = r.c_store.new_ballot()
        recovery = Recovery(owner, from_index, ballot, r.now)
        self.recoveries[owner] = recovery
        self.recoveries_started += 1
        prepare = self._prepare_of(recovery)
        r.broadcast(prepare)
        self.on_cprepare(prepare)  # our own promise

    def _prepare_of(self, recovery: Recovery) -> CPrepare:
        r = self.r
        return CPrepare(
            src=r.me,
            view=r.view,
            owner=recovery.owner,
            from_index=recovery.from_index,
            ballot=recovery.ballot,
        )

    def _ask_again(self, recovery: Recovery) -> None:
        """No majority promised in time: the Prepare again, at the same ballot, to the peers
        that did not answer. A higher ballot would void the promises on their way: past
        saturation a round trip outlasted the timeout, and owners prepared their own instances
        over and over, holding back every proposal meanwhile. (A peer that promised a higher
        ballot says so with a CNack, which ends the recovery.) It asks from our execution
        frontier: a peer that compacted past the old start answered with its snapshot, and
        the promises already in cover every later index too."""
        r = self.r
        recovery.asked_at = r.now
        recovery.from_index = max(recovery.from_index, r.o_log.exec_count[recovery.owner])
        prepare = self._prepare_of(recovery)
        for peer in range(r.n):
            if peer != r.me and peer not in recovery.promises:
                r.send(peer, prepare)

    def on_cprepare(self, msg: CPrepare) -> None:
        r = self.r
        store = r.c_store
        store.see_ballot(msg.ballot)
        if msg.from_index < r.o_log.base_counts[msg.owner]:
            # We accepted (and executed) instances there whose values only our snapshot holds
            # now: a promise reporting nothing would let the recoverer choose a no-op over a
            # chosen value. It needs the snapshot instead (and then recovers from beyond it).
            if msg.src != r.me:
                r.out.snapshot_requests.append(msg.src)
            return
        promised = store.promised.get(msg.owner)
        if promised is not None and promised[0] > msg.ballot:
            if msg.src != r.me:
                nack = CNack(
                    src=r.me,
                    view=r.view,
                    owner=msg.owner,
                    index=msg.from_index,
                    ballot=promised[0],
                )
                r.send(msg.src, nack)
            return
        from_index = msg.from_index if promised is None else min(msg.from_index, promised[1])
        store.promise(msg.owner, msg.ballot, from_index)
        r.out.persist.append(
            CPromiseRecord(owner=msg.owner, from_index=from_index, ballot=msg.ballot)
        )
        accepted, through = self._promise_page(msg.owner, msg.from_index)
        promise = CPromise(
            src=r.me,
            view=r.view,
            owner=msg.owner,
            from_index=msg.from_index,
            ballot=msg.ballot,
            accepted=accepted,
            high=r.c_store.high[msg.owner],
            through=through,
        )
        if msg.src == r.me:
            self.on_cpromise(promise)
        else:
            r.send(msg.src, promise)

    def _promise_page(self, owner: int, from_index: int) -> tuple[tuple[CVote, ...], int]:
        """What we accepted of ``owner``'s instances from ``from_index`` on, as far as one
        message holds (``PROMISE_PAGE_BYTES`` of batches, ``PROMISE_PAGE_VOTES`` votes), and
        the last index it reports on (``EVERY_INDEX``: all of them)."""
        r = self.r
        votes: list[CVote] = []
        budget = PROMISE_PAGE_BYTES
        for index in range(from_index, r.c_store.high[owner] + 1):
            inst = r.c_store.instances.get((owner, index))
            if inst is None or inst.batch is None:
                continue
            size = batch_size(inst.batch)
            if votes and (size > budget or len(votes) == PROMISE_PAGE_VOTES):
                return tuple(votes), index - 1
            budget -= size
            votes.append(CVote(index=index, ballot=inst.ballot, batch=inst.batch))
        return tuple(votes), EVERY_INDEX

    def on_cpromise(self, msg: CPromise) -> None:
        r = self.r
        recovery = self.recoveries.get(msg.owner)
        if recovery is None or recovery.ballot != msg.ballot:
            return
        if msg.from_index != recovery.from_index:
            return  # an answer to an earlier page's (or an earlier ask's) Prepare
        recovery.promises[msg.src] = msg
        if len(recovery.promises) < r.q:
            return
        del self.recoveries[msg.owner]
        promised = r.c_store.promised.get(msg.owner)
        if promised is not None and promised[0] > recovery.ballot:
            # We promised a higher recoverer meanwhile: accepting our own proposal at this
            # ballot would break that promise, and it could then be chosen beside the value
            # the other recovery picks (N=3 seed 390 at 6 clients per site: a no-op and a
            # batch were both chosen for one instance).
            return
        if msg.owner == r.me:
            r.c_store.raise_own_ballot(recovery.ballot)
        # Re-propose the highest-ballot value per index; a no-op where nothing was accepted.
        best: dict[int, CVote] = {}
        high = max(p.high for p in recovery.promises.values())
        for promise in recovery.promises.values():
            for vote in promise.accepted:
                if vote.index not in best or vote.ballot > best[vote.index].ballot:
                    best[vote.index] = vote
        high = max(high, r.o_log.count_of(msg.owner) - 1)
        # Where no promise reports a value any value is safe: ours take our own proposals
        # (those held for this recovery too), a no-op fills the rest.
        ours = r.proposals.pending if msg.owner == r.me else {}
        high = max(high, max(ours, default=NO_INDEX))
        gap = r.c_store.gap if msg.owner == r.me else None
        if gap is not None and recovery.from_index >= gap[1]:
            gap = None  # (a recovery of ours past the gap: not this one's to decide)
        if gap is not None:
            high = max(high, gap[1] - 1)  # our restart's gap: every index of it decided
        # executed here meanwhile means chosen, and perhaps compacted away: never re-proposed
        first = max(recovery.from_index, r.o_log.exec_count[msg.owner])
        # A paged promise reports on its page only: beyond the shortest page a value some
        # acceptor of the majority accepted may be unknown here, so no no-op goes there yet.
        last = min(high, min(p.through for p in recovery.promises.values()))
        for index in range(first, last + 1):
            inst = r.c_store.instances.get((msg.owner, index))
            if inst is not None and inst.committed:
                continue
            found = best.get(index)
            batch: Batch = found.batch if found is not None else ours.get(index, ())
            r.c_phase.propose_recovered(msg.owner, index, recovery.ballot, batch)
        if gap is not None and last >= gap[1] - 1:
            r.c_store.end_gap()
        if last < high:
            # the next page, at the same ballot: the promises already cover every index from
            # the first page's start, so this only fetches what the acceptors accepted there
            recovery.from_index = max(last + 1, first)
            recovery.promises = {}
            self.recoveries[msg.owner] = recovery
            self._ask_again(recovery)
            self.on_cprepare(self._prepare_of(recovery))  # our own report on the page

    def on_higher_ballot(self, owner: int, ballot: int) -> None:
        """A peer promised or accepted ``ballot`` for ``owner``'s instances (a ``CNack``): a
        higher Prepare is under way elsewhere, and ours (if lower) is over."""
        recovery = self.recoveries.get(owner)
        if recovery is not None and recovery.ballot < ballot:
            del self.recoveries[owner]

    def recover_suspects(self) -> None:
        """Take over the unfinished C-instances of suspected replicas (the next live replica
        after each one does it) — and our own, if a recoverer overtook us and went quiet."""
        r = self.r
        for owner in range(r.n):
            if owner in self.recoveries:
                recovery = self.recoveries[owner]
                if r.now - recovery.asked_at > r.config.election_timeout_us:
                    self._ask_again(recovery)
                continue
            if owner == r.me:
                stalled = r.c_phase.undriven_own()
                # A recoverer's Prepare covers every later index of ours, so what we proposed
                # after it was refused and nobody drives it; while execution goes on (the
                # others' commands) only its age shows it. A replica slow enough to be
                # suspected kept its clients waiting for good this way.
                long_ago = r.now - r.election.election_timeout
                instances = r.c_store.instances
                overdue = any(
                    (at := instances[(r.me, i)].overtaken_at) is not None and at < long_ago
                    for i in stalled
                )
                # Execution may also wait on an instance of ours nobody drives any more: a
                # no-op a recovery of ours proposed before we restarted, say.
                blocking = self._blocking_instance()
                if blocking is not None and blocking[0] == r.me:
                    inst = r.c_store.instances.get(blocking)
                    if inst is None or not inst.leading:
                        stalled.append(blocking[1])
                halted = r.now - r.executor.progress_at > r.election.election_timeout
                if stalled and (halted or overdue):
                    self.start_recovery(r.me, min(stalled))
                continue
            if not r.election.suspected(owner) or self._recoverer_of(owner) != r.me:
                continue
            from_index = r.o_log.exec_count[owner]
            unfinished = (
                r.c_store.high[owner] >= from_index
                or r.o_log.count_of(owner) > from_index
            )
            if unfinished and not self._all_committed(owner, from_index):
                self.start_recovery(owner, from_index)

    def _blocking_instance(self) -> tuple[int, int] | None:
        """The C-instance execution waits for, if its slot is decided but it is not."""
        r = self.r
        slot = r.o_log.exec_slot
        if slot not in r.o_log.committed:
            return None
        owner = r.o_log.value[slot]
        if owner in PLACES_NOTHING:  # no C-instance
            return None
        key = (owner, r.o_log.exec_count[owner])
        inst = r.c_store.instances.get(key)
        if inst is not None and inst.committed:
            return None
        return key

    def _recoverer_of(self, owner: int) -> int:
        r = self.r
        for step in range(1, r.n):
            candidate = (owner + step) % r.n
            if candidate == r.me or not r.election.suspected(candidate):
                return candidate
        return r.me

    def _all_committed(self, owner: int, from_index: int) -> bool:
        r = self.r
        high = max(r.c_store.high[owner], r.o_log.count_of(owner) - 1)
        for index in range(from_index, high + 1):
            inst = r.c_store.instances.get((owner, index))
            if inst is None or not inst.committed:
                return False
        return True
