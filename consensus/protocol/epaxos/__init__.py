"""EPaxos (Moraru, Andersen, Kaminsky, SOSP'13), sans-I/O: the leaderless baseline.

The package: ``state`` (instance status and bookkeeping), ``execution`` (the dependency
graph run by strongly connected components), ``recovery`` (explicit prepare), ``replica``
(the core: inputs, pre-accept, accept, commit, snapshots, restart).

Theory of operation
-------------------
Every replica leads its own instances ``(owner, index)``; an instance's value is a batch of
client commands with two attributes: ``seq`` (a sequence number) and ``deps`` (for every
replica r, the highest index of r's instances it depends on, ``NO_DEP`` (-1) for none; a
dependency on ``(r, d)`` stands for all of r's instances up to d). Two commands *conflict*
when they name a common key; a command naming no keys conflicts with everything.

* **Pre-accept (phase 1).** Everything proposed here in one loop turn becomes one instance
  (``CommandBatch`` bounds it). The owner computes ``seq`` (1 + the highest ``seq`` of a
  conflicting instance it knows) and ``deps`` (the highest conflicting index per replica),
  persists the instance and sends ``EPreAccept`` to every peer. An acceptor merges the
  attributes with its own conflicts, persists, and replies (``EPreAcceptReply``, ``changed``
  when it added something) after the record is durable.
* **Fast path.** At the owner's default ballot, when ``fast_quorum`` replicas (the owner
  included) hold the proposed attributes unchanged, the instance commits after one round trip.
  ``fast_quorum`` is the paper's optimized fast quorum F + floor((F+1)/2): 2 of 3, 3 of 5
  (the basic 2F would be 4 of 5); its recovery needs TryPreAccept (below).
* **Slow path.** Otherwise, with a majority of replies, the owner takes the union of the
  ``deps`` and the highest ``seq``, and runs ``EAccept`` (phase 2) at a majority.
* **Commit.** The decider persists the instance as committed, then reports its commands ready
  and sends ``ECommit`` (with the value) to every peer. Learners persist commits too.
* **Execution.** A committed instance runs once every instance it reaches through ``deps``
  (and the owner's previous instance: each replica's instances execute in index order, so the
  executed set is a prefix per replica, what ``SnapshotMeta.exec_counts`` records) is
  committed. Tarjan's algorithm (iterative, no recursion limit) finds the strongly connected
  components; each runs in ``(seq, owner, index)`` order, dependencies first. Conflicting
  commands therefore run in the same order everywhere; independent ones may run in different
  orders on different replicas (so ``Execution.slot`` is this replica's count of executed
  commands, not a position shared by the replicas; fencing tokens derived from it are not
  comparable across replicas).
* **Reads** are commands like any other (the paper's comparison), served (``Ready.reads``)
  when their instance executed here.
* **Explicit prepare (recovery).** An instance this replica knows of (from a message, a
  dependency, or a heartbeat announcing its owner's next index) that is not committed within
  a randomized election timeout is recovered: ``EPrepare`` at a higher ballot; with a majority
  of ``EPrepareReply`` the recoverer commits a committed value, re-accepts the accepted value
  of the highest ballot, accepts the owner's attributes if F replicas besides the owner
  pre-accepted them unchanged at the default ballot, re-runs pre-accept when some replica
  pre-accepted the value, and otherwise commits a no-op.
* **TryPreAccept** (SOSP'13 §4.4, the tech report's recovery for the optimized quorum). A
  majority without the owner keeps only floor((F+1)/2) members of a fast quorum (1 of 5), so
  between that many and F - 1 unchanged pre-accepts the owner's attributes may have been
  chosen, or not. The recoverer sends ``ETryPreAccept`` with them to the other replicas; each
  pre-accepts them unless it knows a conflicting instance that is neither among the ``deps``
  nor depends on this one. With F holders besides the owner they are accepted (as above); a
  committed conflict proves they were not chosen, so pre-accept runs again; conflicts not yet
  committed defer the recovery (it prepares again after a timeout, by when they committed).
* **Durability.** Every change to an instance's ballot, status or value is one
  ``EInstanceRecord`` in ``Ready.persist``; replies and commits leave through
  ``send_after_persist``. A restart rebuilds instances from the records (the latest record of
  an instance wins), never reuses an own index, and recovers its own unfinished instances.
* **Snapshots.** ``snapshot_meta`` is the executed count per replica; ``compact`` forgets
  executed instances below it; a peer asking about a forgotten instance is sent the snapshot.

Every container iterated to produce output is ordered, so a seeded simulation replays exactly.
"""

from consensus.protocol.epaxos.replica import EPaxosReplica
from consensus.protocol.epaxos.state import (
    ACCEPTED,
    COMMITTED,
    EPAXOS_UNSAFE_VARIANTS,
    NONE,
    PREACCEPTED,
    PREACCEPTED_EQ,
)

__all__ = [
    "ACCEPTED",
    "COMMITTED",
    "EPAXOS_UNSAFE_VARIANTS",
    "NONE",
    "PREACCEPTED",
    "PREACCEPTED_EQ",
    "EPaxosReplica",
]
