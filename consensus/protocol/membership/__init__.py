"""Membership: adding, removing and replacing SDPaxos replicas while the cluster serves.

Theory of operation
-------------------
**Epochs.** The log is a sequence of epochs. Epoch ``e`` has a fixed set of voters
(``Configuration``) and runs an ordinary SDPaxos core over them (``SDPaxosReplica`` with
N = its voter count, indexes 0..N-1 in the configuration's order): its quorums, its readiness
rule (the N = 3 shortcut, the N = 5 rule, a plain majority otherwise — N may be even) and its
view changes are those of a fixed-size cluster, which the paper proves correct. Epoch ``e``'s
slot ``j`` is global slot ``base_e + j``; the state machine sees global positions only.

**A change is a command.** ``add``/``replace`` (a new learner), ``promote`` and ``remove``
travel through the log like any command, and every member applies them in log order at the
same slot (``config.apply_change``), so all agree on the configuration at every slot. One
change at a time: a voter change is refused while another waits for its epoch to close, and
nothing but the learner's own promotion or removal is taken while a learner catches up.

**Closing an epoch: the SEAL.** A voter change does not take effect at its own slot ``s``: in
SDPaxos a later slot may already be ordered, and a blind write there acknowledged (it is
*ready* once chosen and ordered, before it executes), so an epoch cut at ``s`` would lose it.
Instead the epoch closes at a slot the old quorum chooses. Once a replica executed the change
it tells its core (``close_epoch``); the serving sequencer then proposes ``SEAL`` in its next
O-instance and assigns no slot after it, and so does every later sequencer of the epoch (one
whose rebuilt log holds the SEAL, or one that executed the change before it serves). The SEAL
is an O-instance like any other: accepted by a majority of the old voters, committed by the
sequencer, carried through view changes by the same votes (``ViewChange._rebuild`` drops what
votes hold after it — leftovers of older views that were never chosen, since a chosen one
would have been placed before the SEAL by the view that proposed it — and Figure 7's hole
filling places nothing after it). So every replica executes the same slots in the epoch and
the SEAL last, the epoch's unfinished C-instances are finished (or recovered) by the old
quorum like in any fixed cluster, and nothing acknowledged is lost: every ready command was
ordered before the SEAL. A sequencer that sealed answers no more reads (its leases could
outlive the epoch while the next one writes).

**Opening the next one.** Executing the SEAL ends the epoch on that replica
(``MemberReplica._maybe_switch``): the next configuration's core starts at the next global
slot, in the first view of epoch ``e + 1``'s range (views carry the epoch in their high bits,
``EPOCH_SHIFT``, so a message says which epoch it belongs to and no old-epoch message can be
taken for a new one), led by the first voter of the old order that stays (removing the
sequencer moves it to the next voter). Commands our clients proposed that the old epoch never
ordered were never acknowledged; they are proposed again in the new epoch (sessions make a
retry take effect once). A replica still in the old epoch catches up from the retired core of
a peer that moved on, or from its snapshot.

**Learners first.** A new member (a fresh id: ids are never reused, so no frame of a removed
member passes for a new one, and ``consensus.storage.identity`` refuses a wiped directory)
does not vote: it asks voters for executed slots (``LearnRequest``/``LearnReply``) or their
snapshot, and applies them. The voter it learns from proposes its promotion once it is within
``PROMOTE_LAG`` slots; promotion is a voter change (the learner's epoch ends with a SEAL and
it votes in the next). A promoted learner's first act is a snapshot of what it learned
(``Ready.snapshot_now``): its records then start from it. ``replace`` is a learner that takes
a voter's place in the same epoch change (so the cluster never has fewer voters than before).

Why not the alternatives: joint consensus (Raft) would make every C- and O-instance count two
quorums with two readiness rules at once; Vertical Paxos needs an external master. Epochs
reuse the fixed-size core and its proof unchanged and add one value (SEAL) to its O-log.

Parts: ``config`` (the configuration, the change rules, the encoding of changes),
``replica`` (``MemberReplica``: epochs, routing, learners, records, snapshots).
"""

from consensus.protocol.membership.config import (
    EPOCH_SHIFT,
    MEMBER_OP,
    NO_MEMBER,
    Change,
    Configuration,
    Member,
    apply_change,
    bootstrap,
    decode_change,
    encode_change,
    next_epoch,
    view_text,
)
from consensus.protocol.membership.replica import (
    LEARN_BATCH,
    PROMOTE_LAG,
    MemberReplica,
    config_of,
    record_of,
)

__all__ = [
    "EPOCH_SHIFT",
    "LEARN_BATCH",
    "MEMBER_OP",
    "NO_MEMBER",
    "PROMOTE_LAG",
    "Change",
    "Configuration",
    "Member",
    "MemberReplica",
    "apply_change",
    "bootstrap",
    "config_of",
    "decode_change",
    "encode_change",
    "next_epoch",
    "record_of",
    "view_text",
]
