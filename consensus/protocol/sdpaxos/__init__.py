"""SDPaxos (Zhao et al., SoCC'18), sans-I/O: replication is decentralized, ordering is not.

Theory of operation
-------------------
Every replica ``n`` replicates its own clients' commands in *C-instances*
``C[n][0], C[n][1], ...`` and leads them itself: pre-prepared at ballot ``(0, n)``, they go
straight to the Accept phase. One replica, the *sequencer* of the current view (replica
``view % N``), orders them: it proposes ``n`` in the next *O-instances* (global slots), and
the ``k``-th O-instance naming ``n`` places ``C[n][k]``. Slot ``j`` executes once ``O[j]``
and the C-instance it places are chosen and every slot before ``j`` has executed. With three
or five replicas a command commits in one wide-area round trip; the sequencer is replaced by
a view change when it fails or straggles, and a failed replica's unfinished C-instances are
recovered by the next live one.

The core is a pure state machine (etcd-raft's ``Step``/``Ready``): feed it ``propose``,
``read``, ``step`` (a peer's message) and ``tick``; drain ``ready()`` — records to persist,
then messages to send, then commands to apply and client outcomes — and call ``advance``.
Anything that reports an acceptance, a promise, a vote or a lease leaves through
``Ready.send_after_persist``: the driver makes the turn's records durable first. A proposer's
own ``CAccept`` (below a durable index reservation) and a three-replica sequencer's
``OAccept`` leave through ``Ready.send``, in parallel with its own fsync (Raft thesis
§10.2.1): they report nothing, and the proposer's acceptance counts elsewhere only through
its own ``CAck``/``OAck``, sent after the fsync (c_phase.py, sequencer.py, c_store.py's
reservations). No input is stepped between ``ready`` and ``advance``.

The state has owners. Two log objects hold what the protocol agreed on, state their
invariants in their headers and check them as they change (in the simulator and the tests:
``consensus.protocol.checks``): ``c_store.CStore``, the C-instances (values, promises,
ballots, our next index) and ``o_log.OLog``, the O-instances (assignments, what is chosen,
the execution frontier). The parts below change them only through their methods, own the
rest of their state, and never write another part's (tests/protocol/sdpaxos/
test_ownership.py). Each part's rules are in its own header; where each starts:

=================  ==========================================================================
``replica``        ``SDPaxosReplica``, the facade: ``propose / read / read_stale / step /
                   tick / ready / advance``, the view and role (``become``: the table of role
                   transitions), the lifecycle events it announces once to every part
                   (``join_view``, ``accept_view``, ``drop_below``, ``snapshot_installed``,
                   ``restarted``), and what every part calls to emit (``send``,
                   ``request``, ``broadcast``). ``step`` routes a message by type and view
                   (the routing rules are in its header).
``c_store``        The C-instance store: ``CStore.accept``, ``learn``, ``choose``,
                   ``take_index``, ``used`` ("never reuse an index"), ``reserve``
                   (durable index reservations), ``promise``.
``o_log``          The O-log: ``OLog.accept``, ``commit``, ``learn_commit``,
                   ``install_new_view``, ``execute``, ``compact``.
``proposals``      Our own proposals from proposed to told (ready, failed, carried over):
                   ``OwnProposals.ready_below``, ``executed``, ``decided``,
                   ``covered_by_snapshot``, ``resume_after_restart``.
``c_phase``        C-instances, leader and acceptor (§3.2, Figure 5): ``CPhase.flush_batch``,
                   ``on_caccept``, ``on_cack``, ``on_ccommit``, ``on_cnack``, ``retransmit``.
``sequencer``      Ordering, the sequencer's side: ``Sequencer.order``, ``on_crequest``,
                   ``flush_oaccepts``, ``start_serving``, ``read_slot``.
``o_acceptor``     Ordering, the acceptors' and learners' side: ``OAcceptor.on_oaccept``,
                   ``on_oack``, ``on_ocommit``, ``commit_o``.
``readiness``      When a command is ready, and every other question whose answer depends
                   on the replica count (``CountRule`` for every N but 5, ``FiveRule`` for
                   N = 5): ``rule_for``, ``check_ready``, ``acks_to_all``, ``chosen_alone``,
                   ``acceptors_learn_alone``.
``execution``      Executing chosen slots in order and recording them: ``Executor.try_execute``,
                   ``log_executed``, ``replay_executed``.
``election``       Heartbeats, suspicion, pre-vote (§3.3): ``Election.detect_failures``,
                   ``on_heartbeat``, ``on_prevote``.
``view_change``    Votes, rebuilding the assignment log with the N = 5 hole filling
                   (Figure 7), NewView: ``ViewChange.start_candidacy``, ``on_vrequest``,
                   ``on_vote``, ``_rebuild``, ``on_new_view``, ``fill_for``.
``recovery``       Recovering a suspected replica's C-instances (Prepare, re-propose or no-op):
                   ``CRecovery.recover_suspects``, ``start_recovery``, ``on_cprepare``,
                   ``on_cpromise``.
``reads``          Linearizable reads through the sequencer (§3.5): ``Reads.flush_read_requests``,
                   ``on_rrequest``, ``on_rreply``, ``serve_reads``.
``straggler``      Replacing a slow sequencer (§4): ``StragglerDetector.watch_ordering``,
                   ``on_suspect``.
``catchup``        A replica behind asks a peer for commits and values:
                   ``CatchUp.maybe_catch_up``, ``on_catchup``.
``snapshots``      Compaction and snapshot installation: ``Snapshots.compact``, ``install``,
                   ``durable_records``.
``restart``        Rebuilding a replica from its records: ``Restart.recover``.
=================  ==========================================================================

Small pure objects that own their state and are tested alone: ``liveness.SilenceTracker``
and ``liveness.RtoEstimator``, ``leases.Leases``, ``tracker.AckPrefixes`` (a five-replica
sequencer's acknowledged prefixes), ``history.HistoryTable`` (the sequencer's read history),
``straggler.OrderingWindow``, and in ``instances`` the per-instance records (``CInstance``,
``OwnerSlots``, ``Recovery``) with the markers for "no value" (``NO_BALLOT``, ``NO_INDEX``,
``NO_SLOT``, ``NEVER``).

Rules every part keeps
----------------------
* Persist, then send: see above. Only pure requests (``CRequest``, ``Catchup``,
  ``CatchupMarkers``, ``RRequest``, ``PreVote``) leave through ``Ready.send``.
* Every map a part iterates to produce output is ordered (ints or sorted), and randomness
  comes only from the replica's seeded ``rng``: a seeded simulation replays exactly.
* No part writes another's state: it calls the owner's methods, and reacts to a lifecycle
  event in its own hook (``on_view_joined``, ``on_view_accepted``, ``on_compacted``, ...).
* No part tests the replica count: what depends on it is a question to the readiness rule.
* A replica that executed a slot never reports it as merely accepted, and compaction never
  turns into "nothing accepted" (a vote or promise that reaches below the compaction point is
  answered with the snapshot instead).
"""

from consensus.protocol.sdpaxos.instances import OwnerSlots
from consensus.protocol.sdpaxos.replica import SDPaxosReplica
from consensus.protocol.sdpaxos.view_change import VIEW_SPAN
from consensus.protocol.types import Role, SnapshotMeta

__all__ = ["VIEW_SPAN", "OwnerSlots", "Role", "SDPaxosReplica", "SnapshotMeta"]
