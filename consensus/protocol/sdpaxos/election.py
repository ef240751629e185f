"""Failure detection and elections (§3.3): heartbeats, suspicion, pre-vote, candidacy.

Every replica heartbeats every other (``send_heartbeats``); a heartbeat carries the sender's
view and execution frontier, and the sequencer's asks for a read lease (leases.py).
``detect_failures`` runs every tick:

* A follower that has not heard from the sequencer of its view for a randomized election
  timeout (``roll_election_timeout``), or whose straggler detector asks for a change
  (straggler.py), or a sequencer that sees a peer stuck in a higher view nobody won, runs a
  *pre-vote* (``pre_vote``, Raft's): it asks for a view it would lead
  (``target_view``) without bumping anything, so a replica that cannot win never disturbs a
  working sequencer. With a majority of pre-votes it becomes a candidate
  (``ViewChange.start_candidacy``).
* A voter grants a pre-vote only for a higher view, when it is not serving itself, when the
  sequencer looks gone to it too (or asks to move up itself, or it suspects a straggler),
  and when no lease it granted binds it (``Leases.may_vote_for``).
* A candidate without a majority in time, or an elected sequencer whose NewView no majority
  accepted in twice that, tries a higher view.
* Peers silent for long are *suspected* (``SilenceTracker``, liveness.py); their unfinished
  C-instances are recovered (recovery.py, ``CRecovery.recover_suspects``).

Only the new view's sequencer brings a replica into a higher view by a heartbeat: a replica
stuck in a view nobody won must not drag a healthy cluster into it.

Entry points: ``send_heartbeats``, ``on_heartbeat``, ``on_lease_grant``, ``detect_failures``,
``on_prevote``, ``on_prevote_reply``, ``may_vote_for``, ``suspected``, ``lease_valid``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.messages import NO_LEASE_REQUEST, Heartbeat, LeaseGrant, PreVote, PreVoteReply
from consensus.protocol.sdpaxos.instances import NO_SLOT
from consensus.protocol.sdpaxos.leases import Leases
from consensus.protocol.sdpaxos.liveness import SilenceTracker
from consensus.protocol.types import Role

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["Election"]


class Election:
    """Heartbeats, failure suspicion, leases granted and held, and pre-votes."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        config = r.config
        #: the view a pre-vote round is asking about (None: no round under way)
        self.prevote_view: int | None = None
        self._prevotes: set[int] = set()
        self._prevote_at = 0
        self.higher_view_seen = 0  # a higher view some peer is stuck in (see on_heartbeat)
        self.silence = SilenceTracker(r.n, config.election_timeout_us)
        self.leases = Leases(config.lease_us, config.max_drift_ppm)
        self.next_heartbeat = 0
        self.election_timeout = config.election_timeout_us
        self.seq_alive_at = 0  # last sign that the sequencer of our view is serving

    def start(self, now: int) -> None:
        """The first input of this incarnation (see ``Leases.start``)."""
        self.leases.start(now)
        self.next_heartbeat = now
        self.silence.start(now)
        self.seq_alive_at = now
        self.roll_election_timeout()

    def on_view_joined(self) -> None:
        """We joined a higher view (``SDPaxosReplica.join_view``): we hold no lease there, its
        sequencer gets a full election timeout to show it serves, and any pre-vote round is
        over."""
        self.leases.drop_held()
        self.seq_alive_at = self.r.now
        self.higher_view_seen = 0
        self.prevote_view = None
        self.roll_election_timeout()

    def sequencer_alive(self, now: int) -> None:
        """A sign that the sequencer of our view serves (a message only a serving one sends)."""
        self.seq_alive_at = now

    def candidacy_view(self) -> int:
        """The view to run for: one we would lead above every view seen, or the one our
        pre-vote round asked about (the round is over)."""
        view = self.target_view()
        if self.prevote_view is not None:
            view = max(view, self.prevote_view)
            self.prevote_view = None
        return view

    def tick(self, now: int) -> None:
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.r.config.heartbeat_us
            self.send_heartbeats()
        self.silence.roll(now)

    def roll_election_timeout(self) -> None:
        r = self.r
        base = r.config.election_timeout_us
        self.election_timeout = base + int(r.rng.random() * base / 2)

    def may_vote_for(self, candidate: int) -> bool:
        return self.leases.may_vote_for(candidate, self.r.now)

    def send_heartbeats(self) -> None:
        r = self.r
        serving = r.role is Role.SEQUENCER
        for peer in r.peers:
            heartbeat = Heartbeat(
                src=r.me,
                view=r.view,
                executed=r.o_log.exec_slot,
                lease_request=r.now if serving else NO_LEASE_REQUEST,
            )
            r.send(peer, heartbeat)

    def on_heartbeat(self, msg: Heartbeat) -> None:
        r = self.r
        r.catchup.heard_progress(msg.src, msg.executed)
        if (
            r.views.new_view is not None
            and r.role is Role.SEQUENCER
            and msg.src not in r.views.new_view_acks
            and msg.view <= r.view
        ):
            r.send(msg.src, r.views.new_view)  # it missed our view change
        if msg.view < r.view:
            return
        if msg.view > r.view:
            if msg.src != msg.view % r.n:
                # A peer sits in a view nobody won. If we serve, move everyone above it.
                if r.role is Role.SEQUENCER:
                    self.higher_view_seen = max(self.higher_view_seen, msg.view)
                return
            r.join_view(msg.view)
        asks_lease = msg.lease_request != NO_LEASE_REQUEST
        if msg.src == r.sequencer and asks_lease:
            self.seq_alive_at = r.now
        if (
            asks_lease
            and msg.src == r.sequencer
            and r.role is Role.FOLLOWER
            and not r.straggler.suspecting
        ):
            self.leases.grant(msg.src, r.now)
            r.send(msg.src, LeaseGrant(src=r.me, view=r.view, request=msg.lease_request))

    def on_lease_grant(self, msg: LeaseGrant) -> None:
        r = self.r
        if r.role is Role.SEQUENCER:
            self.leases.record_grant(msg.src, msg.request)

    def lease_valid(self) -> bool:
        r = self.r
        if r.role is not Role.SEQUENCER or r.ordering.sealed_at != NO_SLOT:
            # (a sequencer that sealed its epoch answers no more reads: the next epoch may
            # order writes while its leases run, and they would be missing from its answers)
            return False
        if "no_lease_check" in r.unsafe:
            return True
        return self.leases.valid(r.now, r.q)

    def detect_failures(self) -> None:
        r = self.r
        now = r.now
        if r.role is Role.CANDIDATE:
            if now - r.views.candidate_since > self.election_timeout:
                self._pre_vote()  # no majority in time: try a higher view
            return
        if r.role is Role.ESTABLISHING:
            if now - r.views.candidate_since > 2 * self.election_timeout:
                self._pre_vote()
            else:
                r.views.retransmit_new_view()
            return
        # The sequencer of our view shows no sign of serving (a restarted replica that was the
        # sequencer counts itself as silent too), the straggler detector asks for a change,
        # or we serve but some peer is stuck in a higher view nobody won.
        silent = (
            r.role is not Role.SEQUENCER and now - self.seq_alive_at > self.election_timeout
        )
        forced_at = r.straggler.force_election_at
        forced = forced_at is not None and forced_at <= now
        lifted = r.role is Role.SEQUENCER and self.higher_view_seen > r.view
        if (silent or forced or lifted) and self.may_vote_for(r.me):
            self._pre_vote()
        r.recovery.recover_suspects()

    def target_view(self) -> int:
        r = self.r
        view = max(r.view, self.higher_view_seen) + 1
        while view % r.n != r.me:
            view += 1
        return view

    def _pre_vote(self) -> None:
        """Ask whether a majority would vote for us before bumping any view (Raft's pre-vote),
        so a replica that cannot win never disturbs a working sequencer."""
        r = self.r
        if self.prevote_view is not None and r.now - self._prevote_at < self.election_timeout:
            return
        view = self.prevote_view = self.target_view()
        self._prevote_at = r.now
        self._prevotes = {r.me}
        self.roll_election_timeout()
        for peer in r.peers:
            r.request(peer, PreVote(src=r.me, view=view))
        if len(self._prevotes) >= r.q:
            r.views.start_candidacy()

    def on_prevote(self, msg: PreVote) -> None:
        r = self.r
        serving_here = r.role is Role.SEQUENCER and msg.src != r.me
        sequencer_gone = (
            r.now - self.seq_alive_at > r.config.election_timeout_us
            or msg.src == r.sequencer  # the sequencer itself asks to move up
            or r.straggler.suspecting
        )
        granted = (
            msg.view > r.view
            and not serving_here
            and sequencer_gone
            and self.may_vote_for(msg.src)
        )
        r.request(msg.src, PreVoteReply(src=r.me, view=msg.view, granted=granted))

    def on_prevote_reply(self, msg: PreVoteReply) -> None:
        r = self.r
        if msg.view != self.prevote_view or not msg.granted:
            return
        self._prevotes.add(msg.src)
        if len(self._prevotes) >= r.q:
            r.views.start_candidacy()

    def suspected(self, replica: int) -> bool:
        """See ``SilenceTracker.suspected``."""
        return self.silence.suspected(replica, self.r.now)
