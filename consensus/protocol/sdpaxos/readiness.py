"""The readiness rule: when a command leader may acknowledge its command (§3.2, Figure 5).

``C[n][i]`` is *ready* once it is chosen and durably ordered: the client may then be told its
blind write is done. What "durably ordered" means depends on the number of replicas, and so
do the acknowledgements that carry it; one object per replica count answers every such
question, so no other module tests ``n``:

=========================  ======================================  ===========================
                           ``CountRule`` (N != 5)                   ``FiveRule`` (N = 5)
=========================  ======================================  ===========================
own O-instance committed   once a majority accepted it              a non-sequencer: once it
(``learn_own``)            (``OAcceptor.learn_chosen``)             accepts the sequencer's
                                                                    OAccept (Figure 5, l. 29)
ordered own instances      own O-instances known chosen             non-sequencer: own ones in
(``ordered_own``)                                                   the gap-free accepted
                                                                    prefix; sequencer: own ones
                                                                    in the majority-accepted
                                                                    prefix (``AckPrefixes``)
OAck goes to               the owner and the sequencer              the sequencer, and every
(``oack_targets``)                                                  replica when acks go to all
sequencer re-sends         unacknowledged own slots, and every      from each peer's acked
(``resend_late_slot``,     unchosen slot once a period (to its      prefix on
``resend_unchosen``)       owner too once unchosen a period)
``commits_on_sequencer_    False                                    True: see below
accept``
=========================  ======================================  ===========================

Two questions depend on the majority's size rather than on the rule, and every rule answers
them the same way:

* ``acks_to_all``: with five replicas or more (a majority of three or more) acceptors send
  their ``CAck`` to every replica, and a replica learns a choice it did not lead from the
  acknowledgements (``CPhase._learn_from_acks``; not when thrifty: the replicas a proposer
  left out lack the value to use them). With three, the proposer and the acceptor already
  make a majority, and the acknowledgement goes to the proposer only.
* ``chosen_alone``: with one replica, a proposer's own acceptance is a majority: its
  proposal is chosen as it is made.
* ``acceptors_learn_alone``: with three replicas (a majority of two) an acceptor learns a
  choice from its own acceptance and the proposer's own acknowledgement, which leaves on the
  same connection as the proposer's Accept (the sequencer's ``OAck`` with its ``OAccept``):
  so the proposer sends no commit to an acceptor that acknowledged the chosen ballot, and
  a serving sequencer no ``OCommit`` of its own slots to one that acknowledged them
  (``CPhase._learns_without_commit``, ``OAcceptor.commit_o``). With five, an acceptor
  learns from the acknowledgements of other acceptors, on links the proposer cannot see,
  and the commit still goes. An acceptor that missed the acknowledgement (lost, or it
  restarted) learns the choice as it learns one whose commit was lost: its execution stops
  at the slot, and ``Catchup`` brings the commit from a peer.

* ``oaccepts_early``: the sequencer's OAccept leaves in parallel with its own fsync, and its
  own ``OAck`` after it (sequencer.py), unless a replica commits on the OAccept alone
  (``commits_on_sequencer_accept``, five replicas: that commit needs the sequencer's
  acceptance durable, so there the OAccept waits for the fsync and says it accepted).

Why the N = 3 shortcut is safe: the sequencer's acceptance (its own OAck, sent once durable)
plus the owner's own acceptance are a majority of three, so the owner learns the slot is
chosen from the sequencer's messages alone and the order costs half a round trip. With
five replicas the paper's rule lets a non-sequencer count its own O-instance as committed on
the sequencer's OAccept alone, and be ready once it accepted *every* O-instance up to the one
placing its command (no gap). Because such a commit may be known to two replicas only
(``commits_on_sequencer_accept``), two other rules hold only with five replicas:
``CPhase.on_caccept`` drops a CAccept from an older view, and ``ViewChange._rebuild``
re-proposes the slots the candidate executed and fills holes for the one untraced replica
(Figure 7, lines 32-36).

Entry points: ``rule_for`` (the facade builds one), ``check_ready`` (after anything that can
make an own instance chosen or ordered), and the questions above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.protocol.sdpaxos.catchup import CATCHUP_BATCH
from consensus.protocol.types import Role

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica

__all__ = ["CountRule", "FiveRule", "ReadinessRule", "rule_for"]


class ReadinessRule:
    """What the replica count changes in the normal case; the shared ``check_ready``."""

    #: an owner's O-instance may be committed on the sequencer's OAccept alone
    commits_on_sequencer_accept = False

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r
        #: acceptors acknowledge a C-instance to every replica (see above)
        self.acks_to_all = r.q >= 3 and not r.config.thrifty
        #: our own acceptance is a majority (see above)
        self.chosen_alone = r.q == 1
        #: an acceptor's acceptance and the proposer's own acknowledgement are a majority
        self.acceptors_learn_alone = r.q == 2
        #: the sequencer's OAccept may leave before its own acceptance is durable (see above)
        self.oaccepts_early = not self.commits_on_sequencer_accept

    def ordered_own(self) -> int:
        """How many of my C-instances the ready rule considers durably ordered."""
        raise NotImplementedError

    def learn_own(self, slot: int) -> None:
        """We (the learner) accepted our own O-instance ``slot``: is it committed yet?"""
        raise NotImplementedError

    def after_accept(self) -> None:
        """An O-instance was accepted here (the gap-free prefix may have grown)."""

    def oack_targets(self, owner: int) -> tuple[int, ...]:
        """Who learns from our acceptance of an O-instance placing ``owner``'s command."""
        raise NotImplementedError

    def on_sequencer_acks(self, src: int, slots: tuple[int, ...]) -> None:
        """Serving as sequencer, we got ``src``'s acknowledgements of ``slots``."""

    def after_oaccepts(self) -> None:
        """Serving as sequencer, we accepted (and sent) new O-instances."""

    def resend_late_slot(self, peer: int, slot: int) -> None:
        """Serving: our own O-instance ``slot`` is late; re-send what ``peer`` lacks of it."""
        raise NotImplementedError

    def resend_unchosen(self, deadline: int) -> None:
        """Serving: re-send O-instances that are not chosen (our own although not late, and
        others' that their owners cannot get chosen alone)."""

    def check_ready(self) -> None:
        """Report our commands whose instances are chosen and durably ordered, in order."""
        proposals = self.r.proposals
        if proposals.pending:
            proposals.ready_below(self.ordered_own())


class CountRule(ReadinessRule):
    """Every N but 5: ready once at least ``i + 1`` O-instances for us are chosen."""

    def __init__(self, r: SDPaxosReplica) -> None:
        super().__init__(r)
        #: when the sequencer last checked its own O-instances for re-sending
        self._own_checked_at = 0
        #: others' slots found unchosen at that check: still unchosen a period later, they
        #: go to their owners too (``resend_unchosen``)
        self._unchosen_at_check: frozenset[int] = frozenset()

    def ordered_own(self) -> int:
        return self.r.o_log.committed_mine

    def learn_own(self, slot: int) -> None:
        self.r.o_acceptor.learn_chosen(slot)

    def oack_targets(self, owner: int) -> tuple[int, ...]:
        r = self.r
        # With three replicas the sequencer learns a slot from the first OAck: ours tells it
        # the slot is chosen a round trip to the learner sooner than the learner's OCommit.
        # With four or more it must know who accepted: the owner and it are no majority, and
        # an acceptor that lost the OAccept gets it again only from the sequencer (below).
        if owner not in (r.sequencer, r.me):
            return (owner, r.sequencer)
        return (owner,)

    def resend_late_slot(self, peer: int, slot: int) -> None:
        r = self.r
        if slot not in r.o_log.committed and peer not in r.o_log.acks.get(slot, ()):
            r.ordering.resend_oaccepts(peer, slot, slot + 1)

    def resend_unchosen(self, deadline: int) -> None:
        r = self.r
        # An own C-instance can be ready (by the count rule) while its own O-instance is not
        # chosen, so it is not late: re-send every own unchosen, unexecuted slot at least one
        # retransmission period old, each to the peers that did not acknowledge it (checked
        # once per period).
        if self._own_checked_at > deadline:
            return
        self._own_checked_at = r.now
        mine = r.ordering.seq_slots[r.me]
        o_log, pending = r.o_log, r.proposals.pending
        for index in range(max(mine.base, o_log.exec_count[r.me]), len(mine)):
            slot = mine[index]
            if index in pending or slot < o_log.exec_slot or slot in o_log.committed:
                continue  # late ones were handled already
            own = r.c_store.instances.get((r.me, index))
            if own is None or own.sent_at > deadline:
                continue
            for peer in r.peers:
                if peer not in r.o_log.acks.get(slot, ()):
                    r.ordering.resend_oaccepts(peer, slot, slot + 1)
        # An O-instance the owner cannot get chosen (four replicas or more: it needs an
        # acceptor besides the owner and us; or the owner is dead for good, a replica
        # removed or lost with its disk) stays unchosen if an acceptor lost our OAccept:
        # nobody else can tell it the value. The unchosen ones of the window after our
        # execution go again to whoever did not acknowledge them. The owner asks for its
        # own again (``CRequest``) only while its instance is not ready, and the count rule
        # makes it ready once enough *later* O-instances for it are chosen: one whose
        # OAccept the owner lost, with the third replica down for good, would stop
        # execution everywhere. So a slot still unchosen a period after a check found it
        # goes to its owner too.
        stop = min(r.ordering.seq_next_slot, r.o_log.exec_slot + CATCHUP_BATCH)
        unchosen = []
        for slot in range(r.o_log.exec_slot, stop):
            owner = r.o_log.value.get(slot, r.me)
            if slot in r.o_log.committed or owner == r.me:
                continue
            unchosen.append(slot)
            aged = slot in self._unchosen_at_check and "resend_skips_owner" not in r.unsafe
            for peer in r.peers:
                if (peer != owner or aged) and peer not in r.o_log.acks.get(slot, ()):
                    r.ordering.resend_oaccepts(peer, slot, slot + 1)
        self._unchosen_at_check = frozenset(unchosen)


class FiveRule(ReadinessRule):
    """N = 5: a non-sequencer is ready once it accepted every O-instance up to its own; the
    sequencer once its own are inside the prefix a majority accepted."""

    commits_on_sequencer_accept = True

    def ordered_own(self) -> int:
        r = self.r
        if not r.is_sequencer:
            return r.o_log.prefix_mine
        if r.role is not Role.SEQUENCER:
            return r.o_log.exec_count[r.me]
        mine = r.ordering.seq_slots[r.me]
        if "go_ready_rule" in r.unsafe:
            return len(mine)
        return mine.count_below(r.ordering.majority_prefix())

    def learn_own(self, slot: int) -> None:
        r = self.r
        if not r.is_sequencer:
            r.o_acceptor.commit_o(slot)  # Figure 5, line 29

    def after_accept(self) -> None:
        if not self.r.is_sequencer:
            self.check_ready()

    def oack_targets(self, owner: int) -> tuple[int, ...]:
        r = self.r
        # The sequencer needs every acknowledgement (its ready rule looks at the
        # majority-accepted prefix); the others learn others' slots from a majority of them,
        # a round trip sooner than through the owner's OCommit.
        to_all = self.acks_to_all and owner != r.me
        return r.peers if to_all else (r.sequencer,)

    def on_sequencer_acks(self, src: int, slots: tuple[int, ...]) -> None:
        r = self.r
        if r.role is not Role.SEQUENCER:
            return
        r.ordering.record_acks(src, slots)
        self.after_oaccepts()

    def after_oaccepts(self) -> None:
        """Our own O-instances inside the majority-accepted prefix are chosen."""
        r = self.r
        if r.role is not Role.SEQUENCER:
            return
        r.ordering.commit_own_in_majority_prefix()
        self.check_ready()

    def resend_late_slot(self, peer: int, slot: int) -> None:
        r = self.r
        acked = r.ordering.acks.prefix(peer)
        if acked <= slot:
            r.ordering.resend_oaccepts(peer, acked, slot + 1)


def rule_for(r: SDPaxosReplica) -> ReadinessRule:
    """The readiness rule of ``r``'s replica count."""
    return FiveRule(r) if r.n == 5 else CountRule(r)
