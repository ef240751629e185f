"""Catch-up: a replica behind asks a peer for what it misses.

A replica far behind the most advanced peer it heard of (more than ``CATCHUP_BATCH`` slots:
a restart, a healed partition), or whose execution stalled for ``catchup_us``, asks
(``maybe_catch_up``): first for commit markers only (``CatchupMarkers``: stalled behind slow
peers, a replica usually holds the values and misses only commits, and values re-sent by the
megabyte slowed everyone), and for values (``Catchup``) once a commit names an instance
whose value it lacks. A peer answers with the O-commits from the asked slot, the
acknowledgements of what it accepted in this view (so the asker can learn what a majority
accepted even if every learner forgot it), and the commits of the C-instances placed there
(``on_catchup``, bounded by ``CATCHUP_BATCH`` slots and ``CATCHUP_BYTES``). A request that
reaches below the peer's compaction point is answered with its snapshot.

Entry points: ``maybe_catch_up`` (every tick), ``on_catchup``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.messages import (
    Catchup,
    CatchupMarkers,
    CCommit,
    OAck,
    OCommit,
    OEntry,
)
from consensus.protocol.batch import CATCHUP_BYTES, batch_size
from consensus.protocol.sdpaxos.instances import NEVER, PLACES_NOTHING

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["CATCHUP_BATCH", "CatchUp"]

#: Most slots (and C-instances) one Catchup answer carries.
CATCHUP_BATCH = 256


class CatchUp:
    """Asks peers for missed commits and values, and answers their asks."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        self._catchup_peer = 0
        self._last_catchup_at = NEVER
        self._catchup_asked = NEVER
        # a commit marker named an instance whose value we lack: ask for values, not markers
        self._lacks_values = False
        self._catchup_asked_values = False
        #: per replica, the highest execution frontier it told us of (heartbeats, asks)
        self.peer_executed: dict[int, int] = dict.fromkeys(range(r.n), 0)

    def heard_progress(self, peer: int, executed: int) -> None:
        """``peer`` executed every slot below ``executed``."""
        if self.peer_executed[peer] < executed:
            self.peer_executed[peer] = executed

    def lacks_value(self) -> None:
        """A commit named an instance whose value we lack: ask for values, not markers."""
        self._lacks_values = True

    def maybe_catch_up(self) -> None:
        r = self.r
        if not r.view_ready:
            return
        ahead = max(self.peer_executed.values())
        idle = r.now - r.executor.progress_at >= r.config.catchup_us
        # A peer a few slots ahead is the normal state of a loaded cluster: asking it then
        # fetched full batches we were about to receive anyway, again and again (at 1 KB
        # commands, more bytes than the replication itself). Ask when far behind (a restart,
        # a healed partition; pipelined below) or when execution stopped.
        behind = ahead > r.o_log.exec_slot and (ahead - r.o_log.exec_slot > CATCHUP_BATCH or idle)
        stuck = (bool(r.proposals.pending) or r.o_log.high > r.o_log.exec_slot) and idle
        if not (behind or stuck):
            self._lacks_values = False
            return
        # Markers first: stalled behind slow peers (an overloaded cluster: turns longer than
        # catchup_us), a replica holds the values and misses only commits, and answers with
        # values re-sent it megabytes, which slowed everyone further (at 1 KB commands, 0.15
        # CPU and deep client queues: more catch-up bytes than replication, views changing).
        # A marker naming a value we lack switches to values at once.
        answered = r.o_log.exec_slot >= self._catchup_asked + CATCHUP_BATCH // 2 or (
            self._lacks_values and not self._catchup_asked_values
        )
        if not answered and r.now - self._last_catchup_at < r.config.catchup_us:
            return
        self._last_catchup_at = r.now
        self._catchup_asked = r.o_log.exec_slot
        self._catchup_asked_values = self._lacks_values
        if behind:
            # the most advanced peer we do not suspect: a dead one's last report stays the
            # highest for good (a replica removed or lost with its disk never comes back)
            silence = r.election.silence
            live = [rid for rid in r.peers if not silence.suspected(rid, r.now)] or r.peers
            peer = max(live, key=lambda rid: (self.peer_executed[rid], -rid))
        else:
            peer = r.peers[self._catchup_peer % len(r.peers)] if r.peers else r.me
            self._catchup_peer += 1
        if peer != r.me:
            ask = Catchup if self._catchup_asked_values else CatchupMarkers
            r.request(peer, ask(src=r.me, view=r.view, slot=r.o_log.exec_slot))

    def on_catchup(self, msg: Catchup | CatchupMarkers) -> None:
        """Tell a lagging peer every commit we know from ``msg.slot`` on (bounded; values only
        if it asked ``Catchup``)."""
        r = self.r
        if msg.slot < r.o_log.compacted:
            # what it misses is only in our snapshot now: the driver sends it
            r.out.snapshot_requests.append(msg.src)
            return
        o_log = r.o_log
        executed = o_log.executed
        start = msg.slot
        stop = start + CATCHUP_BATCH
        entries = tuple(
            OEntry(slot=s, owner=executed[s][0] if s in executed else o_log.value[s])
            for s in range(start, stop)
            if s in executed or s in o_log.committed
        )
        if entries:
            r.send(msg.src, OCommit(src=r.me, view=r.view, entries=entries))
        # What we accepted in this view but never saw committed: with these acknowledgements
        # the asker can learn what a majority accepted even if every learner forgot it.
        accepted = tuple(
            s
            for s in range(max(start, o_log.exec_slot), min(stop, o_log.high))
            if s not in o_log.committed and o_log.ballot.get(s) == r.view
        )
        if accepted and r.view_ready:
            r.send(msg.src, OAck(src=r.me, view=r.view, slots=accepted))
        # C-instances placed in slots we executed, then chosen ones we have not executed yet
        wanted: list[tuple[int, int]] = [
            executed[s] for s in range(start, min(stop, o_log.exec_slot)) if s in executed
        ]
        for owner in range(r.n):
            index = o_log.exec_count[owner]
            while len(wanted) < 2 * CATCHUP_BATCH:
                inst = r.c_store.instances.get((owner, index))
                if inst is None or not inst.committed:
                    break
                wanted.append((owner, index))
                index += 1
        values = isinstance(msg, Catchup)
        budget = CATCHUP_BYTES
        for owner, index in wanted:
            if owner in PLACES_NOTHING:  # no C-instance
                continue
            if budget <= 0:
                break
            inst = r.c_store.instances[(owner, index)]
            if values:
                budget -= batch_size(inst.batch or ())
            commit_c = CCommit(
                src=r.me,
                view=r.view,
                owner=owner,
                index=index,
                ballot=inst.ballot,
                batch=inst.batch if values else None,
            )
            r.send(msg.src, commit_c)
        self.heard_progress(msg.src, msg.slot)
