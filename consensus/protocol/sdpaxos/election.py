"""TODO election"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.messages import (
    Heartbeat,
    LeaseGrant,
    PreVote,
    PreVoteReply,
)
from consensus.protocol.types import Role

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

#: A peer's C-instances are recovered after ``election_timeout_us`` of silence, or after
#: SILENCE_FACTOR times the longest silence it recently kept while alive if that is longer
#: (learned gaps are capped so the timeout stays below SILENCE_CEILING_FACTOR timeouts).
#: Past saturation a CPU-starved replica's loop turns stretch towards the election timeout:
#: suspected while alive, it saw its clients' commands recovered as no-ops and answered
#: "recovered without it", and the recoveries' Prepares and promises (carrying the values
#: again) slowed everyone further. A crashed peer is still suspected after the usual timeout
#: unless it was that slow just before.
SILENCE_FACTOR = 2

SILENCE_CEILING_FACTOR = 4

#: "recently": in this window of election timeouts or the one before
SILENCE_WINDOW_FACTOR = 8



class Election:
    """TODO"""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        config = r.config
        timeout = config.election_timeout_us
        drift = config.max_drift_ppm / 1_000_000
        self.prevote_view = -1  # the view a pre-vote round is asking about, or -1
        self._prevotes: set[int] = set()
        self._prevote_at = 0
        self.higher_view_seen = 0  # a higher view some peer is stuck in (see _on_heartbeat)
        # the longest silence of each peer in the current and in the previous window
        self.silence_now = [0] * r.n
        self.silence_before = [0] * r.n
        self.silence_window_at = 0
        self.silence_window_us = SILENCE_WINDOW_FACTOR * timeout
        # silences learned at most (the threshold stays within SILENCE_CEILING_FACTOR timeouts)
        self.silence_ceiling = SILENCE_CEILING_FACTOR * timeout // SILENCE_FACTOR
        self.next_heartbeat = 0
        self.election_timeout = config.election_timeout_us
        self.vote_block_until = 0
        self.lease_granted_to = -1
        self.lease_granted_until = 0
        self.lease_from: dict[int, int] = {}
        self._lease_hold_us = int(config.lease_us * (1 - 2 * drift))

    def roll_election_timeout(self) -> None:
        r = self.r
        base = r.config.election_timeout_us
        self.election_timeout = base + int(r.rng.random() * base / 2)

    def may_vote_for(self, candidate: int) -> bool:
        r = self.r
        if r.now < self.vote_block_until:
            return False
        bound = self.lease_granted_to not in (-1, candidate)
        return not (bound and r.now < self.lease_granted_until)

    def send_heartbeats(self) -> None:
        r = self.r
        serving = r.role is Role.SEQUENCER
        for peer in r.peers:
            heartbeat = Heartbeat(
                src=r.me,
                view=r.view,
                executed=r.exec_slot,
                lease_request=r.now if serving else -1,
            )
            r.send(peer, heartbeat)

    def on_heartbeat(self, msg: Heartbeat) -> None:
        r = self.r
        r.peer_executed[msg.src] = max(r.peer_executed[msg.src], msg.executed)
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
            r.views.join_view(msg.view)
        if msg.src == r.sequencer and msg.lease_request >= 0:
            r.seq_alive_at = r.now
        if (
            msg.lease_request >= 0
            and msg.src == r.sequencer
            and r.role is Role.FOLLOWER
            and not r.straggler.suspecting
        ):
            self.lease_granted_to = msg.src
            self.lease_granted_until = r.now + r.config.lease_us
            r.send(msg.src, LeaseGrant(src=r.me, view=r.view, request=msg.lease_request))

    def on_lease_grant(self, msg: LeaseGrant) -> None:
        r = self.r
        if r.role is Role.SEQUENCER:
            until = msg.request + self._lease_hold_us
            self.lease_from[msg.src] = max(self.lease_from.get(msg.src, 0), until)

    def lease_valid(self) -> bool:
        r = self.r
        if r.role is not Role.SEQUENCER:
            return False
        if "no_lease_check" in r.unsafe:
            return True
        holders = 1 + sum(1 for until in self.lease_from.values() if until > r.now)
        return holders >= r.q

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
            elif r.views.new_view is not None and now - r.views.new_view_sent_at >= (
                r.config.retransmit_us
            ):
                r.views.new_view_sent_at = now
                for peer in r.peers:
                    if peer not in r.views.new_view_acks:
                        r.send(peer, r.views.new_view)
            return
        # The sequencer of our view shows no sign of serving (a restarted replica that was the
        # sequencer counts itself as silent too), the straggler detector asks for a change,
        # or we serve but some peer is stuck in a higher view nobody won.
        silent = (
            r.role is not Role.SEQUENCER and now - r.seq_alive_at > self.election_timeout
        )
        forced = 0 <= r.straggler.force_election_at <= now
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
        if self.prevote_view >= 0 and r.now - self._prevote_at < self.election_timeout:
            return
        self.prevote_view = self.target_view()
        self._prevote_at = r.now
        self._prevotes = {r.me}
        self.roll_election_timeout()
        for peer in r.peers:
            r.request(peer, PreVote(src=r.me, view=self.prevote_view))
        if len(self._prevotes) >= r.q:
            r.views.start_candidacy()

    def on_prevote(self, msg: PreVote) -> None:
        r = self.r
        serving_here = r.role is Role.SEQUENCER and msg.src != r.me
        sequencer_gone = (
            r.now - r.seq_alive_at > r.config.election_timeout_us
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
        """Silent for longer than the election timeout and than it was recently while alive
        (see SILENCE_FACTOR)."""
        r = self.r
        silence = r.now - r.last_heard[replica]
        if silence <= r.config.election_timeout_us:
            return False
        recent = max(self.silence_now[replica], self.silence_before[replica])
        return silence > SILENCE_FACTOR * recent
