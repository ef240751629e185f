"""C-instances, leader and acceptor side (§3.2, Figure 5, lines 1-20).

Every replica ``n`` leads its own C-instances ``C[n][0], C[n][1], ...``: pre-prepared at
ballot ``(0, n)``, a batch of client commands goes straight to the Accept phase
(``flush_batch``: ``CAccept`` to every peer, or to the nearest majority when thrifty) and is
ordered at once (the sequencer orders its own; others send ``CRequest`` unless the sequencer
gets the CAccept anyway). It is chosen when a majority, ``n`` included, accepted it
(``on_cack``); ``n`` then commits it (``CCommit``, without the batch to peers that have it) to
the peers that do not learn the choice without one (``flush_commits``, below).

Rules:

* A proposer counts its own acceptance, so it never proposes below a ballot it promised for
  the instance: an owner that promised a recoverer holds its next proposals
  (``_hold_for_recovery``: named in no message, as a restart forgets them) until its own
  recovery proposes them; ``last_named_index`` is the highest index a peer may know.
* An acceptor accepts a ballot at least as high as its promise and what it accepted
  (``on_caccept``; otherwise ``CNack`` with the higher ballot); an owner never reuses an
  index someone else used or decided (``CStore.used`` moves ``next_index`` past it).
* Our ``CAccept`` leaves in the same turn as our own ``CAcceptedRecord``, in parallel with
  its fsync (Raft thesis §10.2.1), when the index is below a durable reservation
  (``CStore.sendable_early``; otherwise after the fsync; a turn that took indexes reserves
  the next ones, ``reserve_ahead``): one fsync on a write's path instead of two in series.
* A proposer's own acceptance counts toward its majority only once it is durable. It is in
  ``acks`` from the start, but no acknowledgement that could complete a majority with it is
  stepped before the turn's records are durable: the driver feeds no input between
  ``ready`` and ``advance`` (``SDPaxosReplica`` refuses one); and whatever a choice sets off
  (``CCommit``, ready replies, execution) leaves after that turn's fsync anyway.
* Nobody else counts a proposer's acceptance from its ``CAccept`` (it may not be durable):
  the proposer sends its own ``CAck`` after its fsync, to the peers it sent the Accept.
* Learning without the leader: an acceptor learns a choice once its own acceptance and the
  acknowledgements (``CAck``) it saw of one ballot make a majority (``_learn_from_acks``):
  with three replicas, the proposer's own; with five or more
  (``ReadinessRule.acks_to_all``), acceptors send theirs to every replica too
  (``acks_any_ballot`` and ``learn_from_accept`` are broken variants teeth tests catch).
  Replicas then execute others' commands without waiting for a far CCommit. With three,
  the proposer sends no CCommit to an acceptor whose acknowledgement of the chosen ballot
  it holds when its turn ends (``_learns_without_commit``): our own CAck went to it after
  our Accept, on the same connection, before the commit would leave. One that lost our
  CAck learns as when a commit is lost: its execution stops at the slot, and ``Catchup``
  brings the commit from a peer.
* With five replicas a ``CAccept`` from an older view is dropped
  (``ReadinessRule.commits_on_sequencer_accept``): a voter accepting it could let its owner
  finish a C-instance beyond the ``c_high`` the voter reported, then execute it in a slot
  the new view gave to someone else.
* Our instance decided with another value (a recoverer's no-op): the commands we proposed in
  it will never execute from it, but their requests may still execute from another copy, so
  they fail *indefinitely* (``OwnProposals.decided``; the rule is ``ready.Failure``'s).
* Retransmission (``retransmit``): what is not chosen after the adaptive timeout
  (``RtoEstimator``; Karn: only instances sent once are sampled) is sent again to the peers
  that did not acknowledge it, with one ``CRequest`` for the latest late index; a serving
  sequencer re-sends its own O-instances (``Sequencer.retransmit_own_slots``). A recovery's
  proposals (``propose_recovered``) are retransmitted the same way until chosen.

The values live in the C-instance store (``CStore``); this part owns the proposer's
bookkeeping on each instance (``leading``, ``acks``, ``sent_at``, ``sent_to``,
``overtaken_at``), the open batch, the acknowledgements seen ahead of their Accept, and the
retransmission timer.

Entry points: ``propose``, ``flush_batch``, ``flush_commits``, ``reserve_ahead``,
``on_caccept``, ``on_cack``, ``on_ccommit``, ``on_cnack``, ``propose_recovered``,
``send_crequest``, ``resend_accept``, ``retransmit``; the hooks ``on_view_accepted``,
``on_compacted``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.messages import (
    CAccept,
    CAcceptedRecord,
    CAck,
    CCommit,
    CNack,
    Command,
    CRequest,
    ReserveRecord,
)
from consensus.protocol.ballot import BALLOT_STRIDE
from consensus.protocol.batch import CommandBatch
from consensus.protocol.sdpaxos.instances import NO_BALLOT, NO_INDEX, Batch, CInstance, keys_of
from consensus.protocol.sdpaxos.liveness import RtoEstimator
from consensus.protocol.types import NEVER, Role

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["CPhase"]


class CPhase:
    """Our own C-instances as their leader, everyone's as acceptor and learner."""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        config = r.config
        me = r.me
        pref = config.peers_by_preference(me)
        self._thrifty_targets = pref[: r.q - 1] if config.thrifty else r.peers
        # When acknowledgements go to every replica (``ReadinessRule.acks_to_all``) a
        # replica learns a choice it did not lead from them: (owner, index) -> (the highest
        # ballot acknowledged, the acceptors that acknowledged it)
        self.c_acks_seen: dict[tuple[int, int], tuple[int, set[int]]] = {}
        self.batch = CommandBatch(config)
        # Retransmission timeout, adapted to how long our C-instances take to be chosen
        # (RFC 6298's estimator; Karn: only instances sent once are sampled).
        self.rtt_probes: dict[int, int] = {}  # own index -> when its CAccept first left
        self.rto = RtoEstimator(config.retransmit_us)
        #: instances we re-propose (a recovery's), retransmitted like our own client batches
        self.reproposing: set[tuple[int, int]] = set()
        #: instances we led that were chosen this turn: their commits leave in ``ready``
        self._commits_out: dict[tuple[int, int], CInstance] = {}

    def propose(self, command: Command) -> None:
        """A client command: into the open batch, proposed once the batch is full (or at the
        latest in ``ready``)."""
        if self.batch.add(command):
            self.flush_batch()

    def flush_batch(self) -> None:
        r = self.r
        if not self.batch:
            return
        batch = self.batch.take()
        store = r.c_store
        index = store.take_index()
        ballot = store.own_ballot
        if store.promised_ballot(r.me, index) > ballot:
            self._hold_for_recovery(index, batch)
            return
        early = store.sendable_early(index)
        inst = store.accept(r.me, index, ballot, batch)
        inst.leading = True
        inst.acks.add(r.me)  # durable before any acknowledgement is stepped (see the rules)
        inst.sent_at = r.now
        r.proposals.propose(index, batch)
        r.straggler.note_proposed()
        r.out.persist.append(
            CAcceptedRecord(owner=r.me, index=index, ballot=ballot, batch=batch)
        )
        accept = CAccept(
            src=r.me, view=r.view, owner=r.me, index=index, ballot=ballot, batch=batch
        )
        own_ack = CAck(src=r.me, view=r.view, owner=r.me, index=index, ballot=ballot)
        for peer in self._thrifty_targets:
            if early:
                r.request(peer, accept)  # in parallel with our own fsync
            else:
                r.send(peer, accept)
            r.send(peer, own_ack)
        inst.sent_to = frozenset(self._thrifty_targets)
        self.rtt_probes[index] = r.now
        if r.is_sequencer:
            r.ordering.order(r.me, index)
        elif r.sequencer not in self._thrifty_targets:
            self.send_crequest(index)
        if r.readiness.chosen_alone:
            self._commit_leading(r.me, index, inst)

    def reserve_ahead(self) -> None:
        """The turn ends: reserve our next indexes durably if it took some (``CStore``)."""
        reservation = self.r.c_store.reserve()
        if reservation is not None:
            self.r.out.persist.append(ReserveRecord(below=reservation))

    def _hold_for_recovery(self, index: int, batch: Batch) -> None:
        """We promised a recoverer of our instances a higher ballot for ``index`` and on:
        accepting our own proposal at our ballot would break that promise, and with the
        sequencer's acceptance it could be chosen beside the recoverer's no-op. Nothing is
        accepted or sent; our own recovery (Prepare above the promise) proposes ``batch`` at
        ``index`` once it finds nothing chosen there."""
        r = self.r
        r.c_store.hold(index, r.now)
        r.proposals.propose(index, batch)
        r.straggler.note_proposed()
        if r.me not in r.recovery.recoveries:
            stalled = self.undriven_own()
            r.recovery.start_recovery(r.me, max(min(stalled), r.o_log.exec_count[r.me]))

    def undriven_own(self) -> list[int]:
        """Our proposals not yet ready that we do not drive: overtaken by a recoverer, or held
        for our own recovery."""
        r = self.r
        return [
            index
            for index in r.proposals.pending
            if not (inst := r.c_store.instances[(r.me, index)]).leading and not inst.committed
        ]

    def _is_held(self, index: int) -> bool:
        r = self.r
        inst = r.c_store.instances.get((r.me, index))
        return inst is not None and inst.held and index in r.proposals.pending

    def last_named_index(self) -> int:
        """Our highest index a peer may have heard of. An index held for a recovery is named
        in no message until that recovery proposes it (durably first), so a restart, which
        forgets it, may use it again: had the sequencer ordered it meanwhile, commands
        proposed after the restart would run in a slot given out before them."""
        r = self.r
        index = r.c_store.next_index - 1
        while index > NO_INDEX and self._is_held(index):
            index -= 1
        return index

    def send_crequest(self, index: int) -> None:
        r = self.r
        inst = r.c_store.instances.get((r.me, index))
        request = CRequest(
            src=r.me,
            view=r.view,
            owner=r.me,
            index=index,
            keys=keys_of(inst.batch if inst else None),
            o_prefix=r.o_log.prefix,
        )
        if r.is_sequencer:
            r.ordering.order(r.me, index, request.keys)
        else:
            r.request(r.sequencer, request)

    def on_cack(self, msg: CAck) -> None:
        r = self.r
        key = (msg.owner, msg.index)
        inst = r.c_store.instances.get(key)
        if inst is not None and inst.leading and msg.ballot % BALLOT_STRIDE == r.me:
            # (a ballot of ours: we may still lead at one a higher proposal overtook)
            if inst.ballot == msg.ballot and not inst.committed:
                inst.acks.add(msg.src)
                if len(inst.acks) >= r.q:
                    self._commit_leading(msg.owner, msg.index, inst)
            return
        if inst is not None and inst.committed:
            if key in self._commits_out and msg.ballot == inst.ballot:
                inst.acks.add(msg.src)  # chosen this turn, its commits not sent yet
            return
        if msg.index < r.o_log.exec_count[msg.owner]:
            return
        # An acknowledgement may overtake the CAccept it answers (from a far proposer, the
        # acceptor next to us answers before the proposal reaches us): keep it until then.
        seen = self.c_acks_seen.get(key)
        if seen is None or seen[0] < msg.ballot:
            self.c_acks_seen[key] = (msg.ballot, {msg.src})
        elif seen[0] == msg.ballot:
            seen[1].add(msg.src)
        else:
            return
        if inst is not None:
            self._learn_from_acks(key, inst)

    def _learn_from_acks(self, key: tuple[int, int], inst: CInstance) -> None:
        """``C[owner][index]`` is chosen once a majority accepted one ballot: what ``inst``
        holds is what we accepted, at ``inst.ballot``, and every replica whose ``CAck`` of
        that ballot we saw accepted it too — the proposer included, which acknowledges its
        own proposal once its acceptance is durable. Its ``CAccept`` says nothing of that: it
        may leave before the proposer's own record is durable, and a proposer that crashes
        then forgets it accepted (a recovery without it may choose a no-op there). With three
        replicas the proposer's ``CAck`` and our acceptance are a majority: we learn the
        choice a one-way delay plus the proposer's fsync after its Accept, rather than a round
        trip later from its CCommit. With five, acknowledgements from the acceptors next to
        us complete it, instead of a round trip to a far proposer and its CCommit's way back,
        which held up executing every slot ordered after it. (``learn_from_accept`` is the
        broken variant that counts the proposer from its Accept, as before its Accept left
        ahead of its fsync; ``acks_any_ballot`` the one that counts any ballot's acks.)"""
        r = self.r
        if inst.committed or inst.batch is None:
            return
        seen = self.c_acks_seen.get(key)
        acked: set[int] = set()
        if seen is not None and (seen[0] == inst.ballot or "acks_any_ballot" in r.unsafe):
            acked = seen[1]
        counted = acked | {r.me}
        if "learn_from_accept" in r.unsafe:
            counted.add(inst.ballot % BALLOT_STRIDE)
        if len(counted) >= r.q:
            self._learn_c_chosen(key[0], key[1], inst)

    def _commit_leading(self, owner: int, index: int, inst: CInstance) -> None:
        r = self.r
        r.c_store.choose(owner, index, inst)
        inst.leading = False
        sent_at = self.rtt_probes.pop(index, None) if owner == r.me else None
        if sent_at is not None:
            self.rto.sample(r.now - sent_at)
        self.reproposing.discard((owner, index))
        self._commits_out[(owner, index)] = inst
        if not r.readiness.acceptors_learn_alone:
            self.flush_commits()  # every peer gets one: no reason to wait for the turn's end
        if owner == r.me:
            self._own_decided(index, inst)
        r.readiness.check_ready()

    def flush_commits(self) -> None:
        """The turn ends: commit what we chose in it to the peers that need a commit. Who
        does is decided now rather than at the choice, so an acknowledgement stepped later in
        the same turn spares its sender the commit too (``_learns_without_commit``; with
        three replicas both acceptors' usually arrive together). With more replicas every
        peer needs one, and it leaves at the choice."""
        r = self.r
        for (owner, index), inst in self._commits_out.items():
            for peer in r.peers:
                if self._learns_without_commit(peer, inst):
                    continue
                # A peer we sent the CAccept to has it before this commit (connections are
                # FIFO); repeating the batch doubled the bytes of a loaded cluster. If that
                # CAccept was lost after all, the peer lacks the value and catches up when it
                # stalls.
                batch = None if peer in inst.acks or peer in inst.sent_to else inst.batch
                commit = CCommit(
                    src=r.me,
                    view=r.view,
                    owner=owner,
                    index=index,
                    ballot=inst.ballot,
                    batch=batch,
                )
                r.send(peer, commit)
        self._commits_out.clear()

    def _learns_without_commit(self, peer: int, inst: CInstance) -> bool:
        """With three replicas, ``peer`` learns the choice of ``inst`` we lead without our
        ``CCommit`` (``ReadinessRule.acceptors_learn_alone``): it accepted the chosen ballot
        (its ``CAck`` is among ``acks``), and our own ``CAck`` of that ballot went to it with
        our Accept (``sent_to``: every Accept we send is followed by it), in an earlier turn
        than this commit on the same FIFO connection; its acceptance and ours are a majority
        (``_learn_from_acks``). If our acknowledgement was lost, or the peer restarted before
        it arrived, the peer learns as it does when a commit is lost: its execution stops at
        the instance's slot, and ``Catchup`` brings the commit."""
        r = self.r
        return r.readiness.acceptors_learn_alone and peer in inst.acks and peer in inst.sent_to

    def _own_decided(self, index: int, inst: CInstance) -> None:
        """Our instance was chosen: if not with what we proposed, its commands failed (not
        definitely: ``OwnProposals.decided``)."""
        self.rtt_probes.pop(index, None)
        self.r.proposals.decided(index, inst)

    def drive_again(self, inst: CInstance) -> None:
        """Propose our instance ``inst`` again (found in our records at a restart, undecided):
        at our own ballot we lead it, and its Accept goes out at the next retransmission."""
        r = self.r
        inst.leading = inst.ballot == r.me
        inst.acks = {r.me}
        inst.sent_at = NEVER  # retransmit at once

    def on_caccept(self, msg: CAccept) -> None:
        r = self.r
        if r.readiness.commits_on_sequencer_accept and msg.view < r.view:
            # With five replicas an owner commits its O-instance on the sequencer's OAccept
            # alone, and a new sequencer gives an untraced owner only as many slots as the
            # voters' c_high shows (Figure 7, lines 32-36). Accepting a proposal from an
            # older view after voting would let the owner complete a C-instance beyond what
            # our vote reported, then execute it in a slot its stale O-commit names and the
            # new view gave to someone else. Once the owner is in our view, its O-commits
            # from the old view are forgotten and it re-sends.
            return
        key = (msg.owner, msg.index)
        store = r.c_store
        store.see_ballot(msg.ballot)
        inst = store.instances.get(key)
        floor = max(store.promised_ballot(msg.owner, msg.index),
                    inst.ballot if inst else NO_BALLOT)
        if msg.ballot < floor:
            r.send(
                msg.src,
                CNack(src=r.me, view=r.view, owner=msg.owner, index=msg.index, ballot=floor),
            )
            return
        if inst is not None and inst.committed:
            # Chosen already: acknowledging is harmless (it is the chosen value by Paxos).
            pass
        elif inst is None or msg.ballot > inst.ballot or inst.batch != msg.batch:
            # (an own index a recoverer used is never reused: ``CStore.accept``)
            if inst is None:
                inst = store.accept(msg.owner, msg.index, msg.ballot, msg.batch)
            else:
                store.accept(msg.owner, msg.index, msg.ballot, msg.batch)
                inst.sent_to = frozenset()  # whatever we sent was for another ballot
            r.out.persist.append(
                CAcceptedRecord(
                    owner=msg.owner, index=msg.index, ballot=msg.ballot, batch=msg.batch
                )
            )
        ack = CAck(src=r.me, view=r.view, owner=msg.owner, index=msg.index, ballot=msg.ballot)
        if r.readiness.acks_to_all:
            for peer in r.peers:
                r.send(peer, ack)
        else:
            r.send(msg.src, ack)
        if r.is_sequencer:
            r.ordering.order(msg.owner, msg.index)
            r.ordering.learn_keys(msg.owner, msg.index, msg.batch)
        self._learn_from_acks(key, inst)

    def on_ccommit(self, msg: CCommit) -> None:
        r = self.r
        key = (msg.owner, msg.index)
        inst = r.c_store.instances.get(key)
        if inst is not None and inst.committed:
            return
        if msg.batch is None:
            if inst is None or inst.ballot != msg.ballot or inst.batch is None:
                r.catchup.lacks_value()  # we lack the chosen value: Catchup brings it
                return
        elif inst is None or inst.ballot != msg.ballot or inst.batch != msg.batch:
            inst = r.c_store.learn(msg.owner, msg.index, msg.ballot, msg.batch)
        self._learn_c_chosen(msg.owner, msg.index, inst)

    def _learn_c_chosen(self, owner: int, index: int, inst: CInstance) -> None:
        """``C[owner][index]`` was chosen with the value ``inst`` holds (we did not lead it)."""
        r = self.r
        self.c_acks_seen.pop((owner, index), None)
        r.c_store.choose(owner, index, inst)  # (an own index decided is never reused)
        inst.leading = False
        self.reproposing.discard((owner, index))
        if owner == r.me:
            self._own_decided(index, inst)
            r.readiness.check_ready()

    def on_cnack(self, msg: CNack) -> None:
        r = self.r
        r.c_store.see_ballot(msg.ballot)
        inst = r.c_store.instances.get((msg.owner, msg.index))
        if inst is not None and inst.leading and inst.ballot < msg.ballot:
            inst.leading = False  # overtaken: a recoverer owns the instance now
            inst.overtaken_at = r.now
            self.reproposing.discard((msg.owner, msg.index))
        r.recovery.on_higher_ballot(msg.owner, msg.ballot)

    def resend_accept(self, owner: int, index: int, inst: CInstance) -> None:
        """Send ``C[owner][index]``'s Accept again to the peers that did not acknowledge it."""
        r = self.r
        accept = CAccept(
            src=r.me,
            view=r.view,
            owner=owner,
            index=index,
            ballot=inst.ballot,
            batch=inst.batch or (),
        )
        # (our acceptance is durable by now: our CAck again, lost with the Accept perhaps)
        own_ack = CAck(src=r.me, view=r.view, owner=owner, index=index, ballot=inst.ballot)
        targets = [peer for peer in r.peers if peer not in inst.acks]
        for peer in targets:
            r.send(peer, accept)
            r.send(peer, own_ack)
        inst.sent_to |= frozenset(targets)

    def retransmit(self) -> None:
        r = self.r
        deadline = r.now - self.rto.timeout_us
        late: list[int] = []
        for index in sorted(r.proposals.pending):
            inst = r.c_store.instances[(r.me, index)]
            if inst.sent_at > deadline or inst.held:  # held: named nowhere yet
                continue
            inst.sent_at = r.now
            self.rtt_probes.pop(index, None)  # Karn: an answer could be to either copy
            late.append(index)
            if not inst.committed and inst.leading:
                self.resend_accept(r.me, index, inst)
        for owner, index in sorted(self.reproposing):
            inst = r.c_store.instances[(owner, index)]
            if inst.sent_at <= deadline:
                inst.sent_at = r.now
                self.resend_accept(owner, index, inst)
        if not r.view_ready:
            return
        if not r.is_sequencer:
            if late:
                self.send_crequest(late[-1])  # one request covers every lower index
            return
        if r.role is Role.SEQUENCER:
            r.ordering.retransmit_own_slots(late, deadline)

    def propose_recovered(self, owner: int, index: int, ballot: int, batch: Batch) -> None:
        """A recovery (ours) proposes ``batch`` for ``C[owner][index]`` at ``ballot``: we lead
        it, and retransmit it like our own client batches until it is chosen."""
        r = self.r
        # (an index of ours that was referenced but never proposed is used now, by this
        # no-op, and never again: same ballot, two values would break Paxos; CStore.accept)
        inst = r.c_store.accept(owner, index, ballot, batch)
        inst.leading = True
        inst.acks = {r.me}
        inst.sent_at = r.now
        inst.sent_to = frozenset(r.peers)  # broadcast below
        self.reproposing.add((owner, index))  # ours too: a no-op is in no client's batch
        r.out.persist.append(
            CAcceptedRecord(owner=owner, index=index, ballot=ballot, batch=batch)
        )
        accept = CAccept(
            src=r.me, view=r.view, owner=owner, index=index, ballot=ballot, batch=batch
        )
        r.broadcast(accept)
        r.broadcast(CAck(src=r.me, view=r.view, owner=owner, index=index, ballot=ballot))
        if r.is_sequencer:
            r.ordering.order(owner, index)

    # ------------------------------------------------------------------ lifecycle hooks
    def on_view_accepted(self) -> None:
        """Our view's NewView is accepted: send again what it has not ordered or chosen."""
        r = self.r
        for index in sorted(r.proposals.pending):
            inst = r.c_store.instances[(r.me, index)]
            inst.sent_at = r.now
            if not inst.committed and inst.leading:
                self.resend_accept(r.me, index, inst)
        named = self.last_named_index()
        if r.o_log.count_of(r.me) <= named:
            self.send_crequest(named)

    def on_compacted(self, counts: tuple[int, ...]) -> None:
        """A snapshot covers the instances below ``counts`` (per owner): forget them."""
        covered = counts[self.r.me]
        self.reproposing = {k for k in self.reproposing if k[1] >= counts[k[0]]}
        self.c_acks_seen = {k: seen for k, seen in self.c_acks_seen.items()
                            if k[1] >= counts[k[0]]}
        self.rtt_probes = {i: t for i, t in self.rtt_probes.items() if i >= covered}
