"""View change (§3.3, Figure 7): replace the sequencer.

A candidate (elected by pre-votes, election.py) joins the next view it would lead and asks
for votes from its execution frontier (``start_candidacy``: ``VRequest``). A voter joins the
view (``SDPaxosReplica.join_view``: it promises to reject lower O-proposals and stops
executing until the NewView) and reports its accepted O-instances with their ballots
(views), its executed slots at the current view, and per replica the highest C-instance
index it accepted (``_make_vote``). With a majority of votes the candidate rebuilds the
assignment log (``_rebuild``) — highest ballot per slot — and sends it as ``NewView``; once
a majority accepted it, the candidate serves (``Sequencer.start_serving``). A replica that
accepts the NewView (``SDPaxosReplica.accept_view``) re-sends what the new view has not
ordered (``CPhase.on_view_accepted``) or answered (``Reads.on_view_accepted``).

The roles this moves a replica through (candidate, establishing, sequencer) are
``SDPaxosReplica.become``'s table.

Rules:

* A value accepted in a view older than the newest one a voter accepted cannot have been
  chosen if, at or after that voter's NewView start, the voter has nothing in its slot: the
  rebuild drops such leftovers of a deposed sequencer (they would give an owner a slot,
  before commands already ready, for an index it never proposed).
* With five replicas (``ReadinessRule.commits_on_sequencer_accept``) an O-instance may be
  committed on the sequencer's OAccept alone, so the NewView starts at the lowest execution
  frontier among the votes and re-proposes what the candidate executed and a voter did not
  (``_executed_prefix``); and Figure 7's rule gives the holes to the one replica ``m`` it
  cannot trace until ``m`` owns as many O-instances as it may have ready commands, and no
  more (``fill_for``; ``no_hole_filling`` is the broken variant a teeth test catches).
* Sizes: a voter does not vote for a candidate more than ``VIEW_SPAN`` slots behind it; a
  five-replica candidate leaves such voters out; a vote or NewView that would not fit one
  message is not sent (``too_wide_views``). A vote or request reaching below our compaction
  point is answered with our snapshot.
* O-phase messages queued in a turn belong to the view they were made in: they leave before
  the view changes (``SDPaxosReplica.join_view`` flushes them).

Entry points: ``start_candidacy``, ``on_vrequest``, ``on_vote``, ``on_new_view``,
``on_new_view_ack``, ``retransmit_new_view``, ``fill_for``; the hook ``on_view_joined``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.messages import (
    MAX_ENTRIES,
    MAX_SLOTS,
    NO_CL,
    SEAL,
    NewView,
    NewViewAck,
    NewViewRecord,
    OCommit,
    OEntry,
    OVote,
    Vote,
    VRequest,
)
from consensus.protocol.sdpaxos.instances import NO_BALLOT, NO_SLOT
from consensus.protocol.types import Role

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["VIEW_SPAN", "ViewChange", "fill_for"]

#: A view change reports and re-proposes at most about this many executed slots: a voter
#: does not vote for a candidate that executed this many slots less than itself, and with
#: five replicas a candidate leaves out the votes of voters that far behind it. Such a
#: replica catches up under a view that a nearer replica leads. (A quarter of the codec's
#: MAX_ENTRIES, so a vote's executed and accepted slots together fit one message.)
VIEW_SPAN = MAX_ENTRIES // 4


class ViewChange:
    """Votes, the rebuilt assignment log, and NewView."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        self._votes: dict[int, Vote] = {}
        self.candidate_since = 0
        #: where our candidacy started: our execution frontier, and how many slots each
        #: replica owned below it. The rebuild reasons from these, not from what we hold when
        #: the votes are in: a snapshot installed meanwhile moves the frontier past slots the
        #: votes still report (counting those as below the start made the hole filling take
        #: chosen slots of the untraced replica back: N=5 seed 1245, snapshots every 10)
        self._candidate_from = 0
        self._candidate_counts: tuple[int, ...] = ()
        self.new_view: NewView | None = None  # the one we sent, while sequencer of its view
        self.new_view_acks: set[int] = set()
        self.new_view_sent_at = 0
        self.last_view_change_at = 0
        #: candidacies given up because their NewView would not fit a message (a metric)
        self.too_wide_views = 0

    def on_view_joined(self) -> None:
        """We joined a higher view (``SDPaxosReplica.join_view``): no votes, no NewView yet."""
        self._votes.clear()
        self.new_view = None
        self.new_view_acks.clear()
        self.last_view_change_at = self.r.now

    def start_candidacy(self) -> None:
        r = self.r
        view = r.election.candidacy_view()
        r.join_view(view)
        r.become(Role.CANDIDATE)
        self.candidate_since = r.now
        self._candidate_from = r.o_log.exec_slot
        self._candidate_counts = tuple(r.o_log.exec_count[rid] for rid in range(r.n))
        self._votes[r.me] = self._make_vote(r.o_log.exec_slot)
        r.broadcast(VRequest(src=r.me, view=view, from_slot=r.o_log.exec_slot))
        if len(self._votes) >= r.q:
            self._rebuild()

    def _make_vote(self, from_slot: int) -> Vote:
        r = self.r
        # Executed slots are chosen: report them at our current view (no ballot can beat a
        # chosen value with another one). Then what we accepted, at its ballot; values we
        # only learned from a commit are not ours to report.
        executed = tuple(
            OVote(slot=s, owner=r.o_log.executed[s][0], ballot=r.view)
            for s in range(from_slot, r.o_log.exec_slot)
        )
        accepted = tuple(
            OVote(slot=s, owner=r.o_log.value[s], ballot=r.o_log.ballot[s])
            for s in range(max(from_slot, r.o_log.exec_slot), r.o_log.high)
            if r.o_log.ballot.get(s, NO_BALLOT) > NO_BALLOT
        )
        entries = executed + accepted
        return Vote(
            src=r.me,
            view=r.view,
            accepted_view=r.o_log.accepted_view,
            accepted_from=r.o_log.accepted_from,
            executed=r.o_log.exec_slot,
            entries=entries,
            c_high=tuple(r.c_store.high),
        )

    def on_vrequest(self, msg: VRequest) -> None:
        r = self.r
        if msg.view < r.view or msg.src != msg.view % r.n:
            return
        if not r.election.may_vote_for(msg.src):
            return
        if msg.from_slot < r.o_log.compacted:
            # The slots it asks about are chosen, but we hold them only in our snapshot: a vote
            # without them could let the candidate fill them with holes. It installs the
            # snapshot and asks again from its new execution frontier.
            r.out.snapshot_requests.append(msg.src)
            return
        if msg.from_slot + VIEW_SPAN < r.o_log.exec_slot:
            # A candidate that far behind would get a vote (and send a NewView) sized by the
            # log it missed. A nearer replica leads the view; this one catches up under it.
            return
        if msg.view > r.view:
            r.join_view(msg.view)
        elif r.role is not Role.FOLLOWER or r.view_ready:
            return  # this view is already under way past its election
        vote = self._make_vote(msg.from_slot)
        if len(vote.entries) > MAX_ENTRIES:
            # (ordered far beyond what we executed: cannot happen while execution keeps up)
            # a vote that would not fit a message is no vote; another replica leads
            return
        r.send(msg.src, vote)

    def on_vote(self, msg: Vote) -> None:
        r = self.r
        if r.role is not Role.CANDIDATE or len(msg.c_high) != r.n:
            return
        self._votes[msg.src] = msg
        if len(self._votes) >= r.q:
            self._rebuild()

    def _rebuild(self) -> None:
        """Figure 7: rebuild the assignment log from a majority of votes."""
        r = self.r
        start = self._candidate_from
        repairs = r.readiness.commits_on_sequencer_accept
        executed = self._executed_prefix() if repairs else []
        if executed is None:  # lagging voters were sent our snapshot instead
            if len(self._votes) >= r.q:
                self._rebuild()
            return
        best: dict[int, OVote] = {}
        for vote in self._votes.values():
            for entry in vote.entries:
                if entry.slot >= start and (
                    entry.slot not in best or entry.ballot > best[entry.slot].ballot
                ):
                    best[entry.slot] = entry
        # A value accepted in a view older than the newest one a voter accepted (V) cannot
        # have been chosen if, at or after the start of V's NewView, that voter has nothing
        # in its slot: chosen before V's election, V's NewView would have carried it to the
        # voter; after it, a majority had promised V. Such a leftover of a deposed sequencer
        # must not come back: it would give its owner a slot, before commands already ready,
        # for an index the owner never proposed — and the owner's next command would land there.
        newest = max(vote.accepted_view for vote in self._votes.values())
        witnesses = [
            (vote.accepted_from, {entry.slot for entry in vote.entries})
            for vote in self._votes.values()
            if vote.accepted_view == newest
        ]
        for slot in [s for s, e in best.items() if e.ballot < newest]:
            if any(slot >= since and slot not in seen for since, seen in witnesses):
                del best[slot]
        # A SEAL ends the log (membership): what a vote holds after it is a leftover of an
        # older view that was never chosen — chosen before the SEAL's view, that view's
        # rebuild would have placed it before the SEAL — so it must not come back.
        sealed = min((s for s, e in best.items() if e.owner == SEAL), default=NO_SLOT)
        if sealed != NO_SLOT:
            for slot in [s for s in best if s > sealed]:
                del best[slot]
        end = max(best, default=start - 1) + 1
        owners: list[int | None] = [None] * (end - start)
        for slot, entry in best.items():
            owners[slot - start] = entry.owner
        # the slots we executed that some voter has not: chosen, so proposed as they are
        owners[:0] = executed
        start -= len(executed)
        if repairs and "no_hole_filling" not in r.unsafe:
            old_sequencer = max(v.accepted_view for v in self._votes.values()) % r.n
            untraced = [
                rid for rid in range(r.n) if rid not in self._votes and rid != old_sequencer
            ]
            if old_sequencer not in self._votes and len(untraced) == 1:
                m = untraced[0]
                needed = max(v.c_high[m] for v in self._votes.values()) + 1
                # m's slots below start (as of the candidacy's start: see _candidate_counts)
                counts = (self._candidate_counts if "candidacy_counts_now" not in r.unsafe
                          else tuple(r.o_log.exec_count[rid] for rid in range(r.n)))
                before = counts[m] - executed.count(m)
                # after a SEAL nothing is placed: m's instances that would need slots past it
                # were never ordered (a sequencer assigns nothing after its SEAL), so never ready
                fill_for(m, needed, before, owners, extend=sealed == NO_SLOT)
        if len(owners) > MAX_SLOTS:
            # More than one NewView carries (votes far apart, or a vast hole filling): no
            # view from here. The election times out and another candidacy starts from
            # further on (its executed frontier, or another replica's).
            self._votes.clear()
            self.too_wide_views += 1
            return
        filled = tuple(NO_CL if owner is None else owner for owner in owners)
        new_view = NewView(src=r.me, view=r.view, start=start, owners=filled)
        r.become(Role.ESTABLISHING)
        self._votes.clear()
        self.new_view = new_view
        self.new_view_acks = {r.me}
        self.new_view_sent_at = r.now
        self._accept_new_view(new_view)
        r.broadcast(new_view)
        if len(self.new_view_acks) >= r.q:
            self._become_sequencer()

    def _executed_prefix(self) -> list[int] | None:
        """With five replicas, the owners of the slots we executed and some voter did not.

        A five-replica O-instance is committed on the sequencer's OAccept alone, so a slot
        executed in an older view may be accepted by its owner and that view's sequencer only,
        and a voter that learned it from a commit forgets it on a restart. The proof of
        consistency assumes each view change leaves every O-instance before it accepted by a
        majority: so the new view re-proposes, from the lowest execution frontier among the
        voters, the values we executed (chosen, hence safe to propose). If that frontier is
        below our compaction point we no longer know them: the voters behind it get our
        snapshot instead, and their votes do not count.
        """
        r = self.r
        for src in [s for s, v in self._votes.items()
                    if v.executed + VIEW_SPAN < self._candidate_from]:
            # that voter would make the NewView re-propose a log's worth of slots: it catches
            # up under the new view instead, and the candidate waits for nearer votes
            del self._votes[src]
        if len(self._votes) < r.q:
            return None
        lowest = min(vote.executed for vote in self._votes.values())
        if lowest >= self._candidate_from:
            return []
        if lowest < r.o_log.compacted:
            for src in [s for s, v in self._votes.items() if v.executed < r.o_log.compacted]:
                del self._votes[src]
                r.out.snapshot_requests.append(src)
            return None
        return [r.o_log.executed[slot][0] for slot in range(lowest, self._candidate_from)]

    def _accept_new_view(self, msg: NewView) -> None:
        r = self.r
        start, owners = msg.start, msg.owners
        r.out.persist.append(NewViewRecord(view=msg.view, start=start, owners=owners))
        r.o_log.install_new_view(msg.view, start, owners, r.view)
        r.accept_view()

    def on_new_view(self, msg: NewView) -> None:
        r = self.r
        if msg.src != r.sequencer or r.role is not Role.FOLLOWER:
            return
        if not r.view_ready:
            self._accept_new_view(msg)
        r.send(msg.src, NewViewAck(src=r.me, view=r.view))

    def on_new_view_ack(self, msg: NewViewAck) -> None:
        r = self.r
        if self.new_view is None or msg.view != self.new_view.view:
            return
        self.new_view_acks.add(msg.src)
        if r.role is Role.ESTABLISHING and len(self.new_view_acks) >= r.q:
            self._become_sequencer()
        elif r.role is Role.SEQUENCER:
            self._send_new_view_commit(msg.src)  # a late acceptor needs the commits too

    def _become_sequencer(self) -> None:
        r = self.r
        assert self.new_view is not None
        new_view = self.new_view
        start, end = new_view.start, new_view.start + len(new_view.owners)
        r.become(Role.SEQUENCER)
        self.last_view_change_at = r.now
        r.ordering.start_serving(start, end, self.new_view_acks)
        r.o_log.commit_new_view(start, end, r.view)
        for peer in sorted(self.new_view_acks - {r.me}):
            self._send_new_view_commit(peer)
        r.readiness.check_ready()
        r.ordering.order_deferred()
        named = r.c_phase.last_named_index()
        if r.o_log.count_of(r.me) <= named:
            r.ordering.order(r.me, named, ())
        if r.closing:  # we executed a membership change: end the epoch (sequencer.py)
            r.ordering.seal()

    def retransmit_new_view(self) -> None:
        """Elected, not serving yet: our NewView again to whoever has not accepted it."""
        r = self.r
        if self.new_view is None or r.now - self.new_view_sent_at < r.config.retransmit_us:
            return
        self.new_view_sent_at = r.now
        for peer in r.peers:
            if peer not in self.new_view_acks:
                r.send(peer, self.new_view)

    def _send_new_view_commit(self, peer: int) -> None:
        r = self.r
        assert self.new_view is not None
        start = self.new_view.start
        entries = tuple(
            OEntry(slot=start + k, owner=owner) for k, owner in enumerate(self.new_view.owners)
        )
        if entries:
            r.send(peer, OCommit(src=r.me, view=r.view, entries=entries))


def fill_for(
    m: int, needed: int, before: int, owners: list[int | None], *, extend: bool = True
) -> None:
    """Propose ``m`` in the first holes until it owns ``needed`` O-instances (``before``
    of them below the new view's start) with no hole before the last of them (Figure 7,
    lines 32-36), and no more than that.

    Figure 7 stops at "at least": a hole filled in front of ``m``'s slots from the votes
    leaves ``m`` more O-instances than it has C-instances that may be ready, and the
    surplus places ``m``'s *next* proposal in a slot before commands ordered (and ready)
    after this view change: a read proposed after a write was acknowledged ran before it
    (N=5 seed 362 with every fault). Nothing of ``m``'s beyond the ``needed``-th can be
    chosen (``needed`` bounds them: a chosen C-instance was accepted by a voter), so
    those slots propose no one. ``extend=False`` (the log ends in a SEAL): only holes are
    filled, none added after the log's end."""
    # One pass (filling the first hole and counting again was quadratic: a candidate
    # spent seconds on a vote naming thousands of m's instances): until m owns
    # ``needed``, every hole gets m; the needed-th then has no hole before it.
    count = before
    surplus_from = 0  # the position after m's needed-th (0: m owns enough below the start)
    for position, owner in enumerate(owners):
        if count >= needed:
            break
        if owner is None:
            owners[position] = owner = m
        if owner == m:
            count += 1
            if count == needed:
                surplus_from = position + 1
    if count < needed and not extend:
        return  # every hole is m's: there is no surplus to take back
    while count < needed:
        owners.append(m)
        count += 1
        surplus_from = len(owners)
    for position in range(surplus_from, len(owners)):
        if owners[position] == m:
            owners[position] = None
