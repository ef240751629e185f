"""Handler-level tests of the EPaxos core (``consensus.protocol.epaxos``)."""

from __future__ import annotations

import random

import pytest
from util import Net, cmd, config, msgs, records_of, tick, turn

from consensus.codec import decode_frame, encode_frame
from consensus.errors import ConfigError
from consensus.messages import (
    TRY_CONFLICT,
    TRY_CONFLICT_COMMITTED,
    TRY_OK,
    Command,
    EAccept,
    EAcceptReply,
    ECommit,
    EInstanceRecord,
    EPreAccept,
    EPreAcceptReply,
    EPrepare,
    EPrepareReply,
    ETryPreAccept,
    ETryPreAcceptReply,
)
from consensus.protocol.admission import check_peer_message
from consensus.protocol.ballot import ballot_of
from consensus.protocol.epaxos import (
    ACCEPTED,
    COMMITTED,
    NONE,
    PREACCEPTED,
    PREACCEPTED_EQ,
    EPaxosReplica,
)
from consensus.protocol.types import SnapshotMeta

ELECTION_US = 300_000


def replica(me: int = 0, n: int = 3, **changes: object) -> EPaxosReplica:
    return EPaxosReplica(config(n, **changes), me, rng=random.Random(me))


def net(n: int = 3) -> Net:
    return Net(config(n), EPaxosReplica)  # type: ignore[type-var]


def key_cmd(seq: int, key: str, client: int = 1) -> Command:
    return cmd(client, seq, keys=(key,))


def pre_accept(owner: int, index: int, *commands: Command, seq: int = 1,
               deps: tuple[int, ...] = (-1, -1, -1), ballot: int | None = None) -> EPreAccept:
    return EPreAccept(src=owner, view=0, owner=owner, index=index,
                      ballot=owner if ballot is None else ballot, batch=commands, seq=seq,
                      deps=deps)


# --------------------------------------------------------------------------- normal case


def test_a_turn_becomes_one_instance_persisted_before_its_preaccepts_leave() -> None:
    r0 = replica(0)
    ready = turn(r0, key_cmd(1, "a"), key_cmd(2, "b"))
    [record] = records_of(ready, EInstanceRecord)
    assert (record.owner, record.index, record.status) == (0, 0, PREACCEPTED_EQ)
    assert len(record.batch) == 2 and record.deps == (-1, -1, -1) and record.seq == 1
    sent = msgs(ready.send_after_persist, EPreAccept)
    assert [to for to, _ in sent] == [1, 2]
    assert not msgs(ready.send, EPreAccept)


def test_acceptor_adds_its_conflicts_and_persists_before_replying() -> None:
    r1 = replica(1)
    turn(r1, pre_accept(2, 0, key_cmd(1, "a", client=2)))  # r1 knows C[2][0] on key a
    ready = turn(r1, pre_accept(0, 0, key_cmd(1, "a")))
    [(to, reply)] = msgs(ready.send_after_persist, EPreAcceptReply)
    assert to == 0 and reply.ok and reply.changed
    assert reply.deps == (-1, -1, 0) and reply.seq == 2
    assert records_of(ready, EInstanceRecord)[0].status == PREACCEPTED
    # a command on another key conflicts with nothing: the attributes come back unchanged
    ready = turn(r1, pre_accept(0, 1, key_cmd(2, "b")))
    [(_, reply)] = msgs(ready.send_after_persist, EPreAcceptReply)
    assert not reply.changed and reply.deps == (-1, -1, -1)


def test_a_command_without_keys_conflicts_with_everything() -> None:
    r1 = replica(1)
    turn(r1, pre_accept(2, 0, key_cmd(1, "a", client=2)))
    turn(r1, pre_accept(0, 0, key_cmd(1, "b")))
    keyless = Command(client_id=3, seq=1, op=b"x", keys=())
    ready = turn(r1, pre_accept(2, 1, keyless, deps=(-1, -1, 0)))
    [(_, reply)] = msgs(ready.send_after_persist, EPreAcceptReply)
    assert reply.deps == (0, -1, 0)
    # and a keyed command after it depends on it
    ready = turn(r1, pre_accept(0, 1, key_cmd(2, "z"), deps=(0, -1, -1)))
    [(_, reply)] = msgs(ready.send_after_persist, EPreAcceptReply)
    assert reply.deps == (0, -1, 1) and reply.seq > 1


def test_fast_path_commits_after_one_round_trip_with_unchanged_attributes() -> None:
    cluster = net(3)
    cluster.propose(0, key_cmd(1, "a"))
    cluster.run()
    # the owner committed without an accept phase, and everyone executed the command
    assert not any("EAccept" in line for line in cluster.sent)
    assert [c.seq for c in cluster.ready_cmds[0]] == [1]
    assert all(len(cluster.executed[r]) == 1 for r in range(3))


def test_slow_path_when_a_reply_changed_the_attributes() -> None:
    r0 = replica(0)
    turn(r0, key_cmd(1, "a"))
    changed = EPreAcceptReply(src=1, view=0, owner=0, index=0, ballot=0, ok=True, seq=3,
                              deps=(-1, -1, 4), changed=True)
    ready = turn(r0, changed)
    accepts = msgs(ready.send_after_persist, EAccept)
    assert [to for to, _ in accepts] == [1, 2]
    assert accepts[0][1].deps == (-1, -1, 4) and accepts[0][1].seq == 3
    assert records_of(ready, EInstanceRecord)[0].status == ACCEPTED
    assert ready.ready == []
    ready = turn(r0, EAcceptReply(src=2, view=0, owner=0, index=0, ballot=0, ok=True))
    assert [c.seq for c in ready.ready] == [1]
    assert records_of(ready, EInstanceRecord)[0].status == COMMITTED
    commits = msgs(ready.send_after_persist, ECommit)
    assert [to for to, _ in commits] == [1, 2] and commits[0][1].deps == (-1, -1, 4)


def test_the_optimized_fast_quorum_at_five_replicas_is_three_with_the_owner() -> None:
    r0 = replica(0, n=5)
    turn(r0, key_cmd(1, "a"))
    none = (-1,) * 5
    ready = turn(r0, EPreAcceptReply(src=1, view=0, owner=0, index=0, ballot=0, ok=True,
                                     seq=1, deps=none, changed=False))
    assert ready.ready == [] and not msgs(ready.send_after_persist, EAccept)
    ready = turn(r0, EPreAcceptReply(src=3, view=0, owner=0, index=0, ballot=0, ok=True,
                                     seq=1, deps=none, changed=False))
    # F + floor((F+1)/2) = 3 of 5, not the basic 2F = 4: committed without an accept phase
    assert [c.seq for c in ready.ready] == [1]
    assert not msgs(ready.send_after_persist, EAccept)


def test_conflicting_commands_execute_in_the_same_order_everywhere() -> None:
    cluster = net(3)
    for r in range(3):
        cluster.propose(r, key_cmd(1, "hot", client=10 + r))
    cluster.run()
    orders = [[e.command.client_id for e in cluster.executed[r]] for r in range(3)]
    assert orders[0] == orders[1] == orders[2] and sorted(orders[0]) == [10, 11, 12]


def test_a_cycle_runs_as_one_component_in_seq_order() -> None:
    r0 = replica(0)
    a, b = key_cmd(1, "k", client=1), key_cmd(1, "k", client=2)
    # C[1][0] and C[2][0] depend on each other (a cycle): seq decides, then the owner id
    turn(r0, ECommit(src=1, view=0, owner=1, index=0, ballot=1, batch=(a,), seq=5,
                     deps=(-1, -1, 0)))
    ready = turn(r0, ECommit(src=2, view=0, owner=2, index=0, ballot=2, batch=(b,), seq=4,
                             deps=(-1, 0, -1)))
    assert [e.command.client_id for e in ready.executions()] == [2, 1]
    assert r0.snapshot_meta() == SnapshotMeta(2, (0, 1, 1))


def test_execution_waits_for_an_uncommitted_dependency() -> None:
    r0 = replica(0)
    turn(r0, pre_accept(2, 0, key_cmd(1, "k", client=2)))
    ready = turn(r0, ECommit(src=1, view=0, owner=1, index=0, ballot=1,
                             batch=(key_cmd(1, "k", client=1),), seq=2, deps=(-1, -1, 0)))
    assert ready.executions() == []
    ready = turn(r0, ECommit(src=2, view=0, owner=2, index=0, ballot=2,
                             batch=(key_cmd(1, "k", client=2),), seq=1, deps=(-1, -1, -1)))
    assert [e.command.client_id for e in ready.executions()] == [2, 1]


def test_unsafe_variant_executes_before_the_dependency_commits() -> None:
    r0 = replica(0, unsafe=frozenset({"epaxos_exec_uncommitted"}))
    turn(r0, pre_accept(2, 0, key_cmd(1, "k", client=2)))
    ready = turn(r0, ECommit(src=1, view=0, owner=1, index=0, ballot=1,
                             batch=(key_cmd(1, "k", client=1),), seq=2, deps=(-1, -1, 0)))
    assert [e.command.client_id for e in ready.executions()] == [1]


def test_a_long_dependency_chain_executes_without_recursion() -> None:
    r0 = replica(0)
    length = 5_000  # far past Python's recursion limit
    for index in range(length - 1, -1, -1):  # committed last to first: one traversal at the end
        ready = turn(r0, ECommit(src=1, view=0, owner=1, index=index, ballot=1,
                                 batch=(key_cmd(index, "k", client=2),), seq=index + 1,
                                 deps=(-1, index - 1, -1)))
    assert len(ready.executions()) == length
    assert [e.command.seq for e in ready.executions()[:3]] == [0, 1, 2]


def test_reads_are_commands_served_after_they_execute() -> None:
    cluster = net(3)
    cluster.propose(1, key_cmd(1, "a"))
    cluster.run()
    read = Command(client_id=5, seq=1, op=b"get", keys=("a",))
    cluster.cores[2].read(read, 0)
    cluster.propose(2, key_cmd(9, "other", client=9))  # a turn to carry the read out
    cluster.run()
    assert cluster.reads[2] == [read]
    assert [e.command for e in cluster.executed[2]][-2:].count(read) == 1


# --------------------------------------------------------------------------- recovery


def prepare_reply(src: int, status: int, *, vballot: int = 0, batch: tuple[Command, ...] = (),
                  seq: int = 0, deps: tuple[int, ...] = (-1, -1, -1), ballot: int = 257,
                  owner: int = 0) -> EPrepareReply:
    return EPrepareReply(src=src, view=0, owner=owner, index=0, ballot=ballot, ok=True,
                         status=status, vballot=vballot, batch=batch, seq=seq, deps=deps)


def recovering(me: int = 1, owner: int = 0) -> tuple[EPaxosReplica, int]:
    """Replica ``me`` starts recovering ``(owner, 0)`` (it heard the owner created it)."""
    core = replica(me)
    core.step(_heartbeat(owner, 1), 0)
    core.advance(core.ready())
    ready = tick(core, 10 * ELECTION_US)
    [(_, prepare)] = msgs(ready.send_after_persist, EPrepare)[:1]
    assert prepare.owner == owner and prepare.ballot > 255
    return core, prepare.ballot


def _heartbeat(src: int, next_index: int) -> object:
    from consensus.messages import Heartbeat

    return Heartbeat(src=src, view=0, executed=next_index, lease_request=-1)


def test_recovery_re_accepts_the_value_accepted_at_the_highest_ballot() -> None:
    core, ballot = recovering()
    value = (key_cmd(1, "a"),)
    ready = turn(core, prepare_reply(2, ACCEPTED, vballot=0, batch=value, seq=3,
                                     deps=(-1, -1, 1), ballot=ballot))
    [(_, accept)] = msgs(ready.send_after_persist, EAccept)[:1]
    assert accept.batch == value and accept.seq == 3 and accept.ballot == ballot


def test_recovery_keeps_attributes_that_may_have_committed_on_the_fast_path() -> None:
    core, ballot = recovering()
    value = (key_cmd(1, "a"),)
    ready = turn(core, prepare_reply(2, PREACCEPTED_EQ, vballot=0, batch=value, seq=1,
                                     ballot=ballot))
    [(_, accept)] = msgs(ready.send_after_persist, EAccept)[:1]
    assert accept.batch == value and accept.deps == (-1, -1, -1)


def test_recovery_re_runs_pre_accept_when_the_owner_answers_it_never_committed() -> None:
    core, ballot = recovering(me=1, owner=0)
    value = (key_cmd(1, "a"),)
    ready = turn(core, prepare_reply(0, PREACCEPTED_EQ, vballot=0, batch=value, seq=1,
                                     ballot=ballot))
    [(_, again)] = msgs(ready.send_after_persist, EPreAccept)[:1]
    assert again.batch == value and again.ballot == ballot
    assert not msgs(ready.send_after_persist, EAccept)


def test_recovery_of_an_instance_nobody_saw_commits_a_no_op_and_the_owner_fails_it() -> None:
    core, ballot = recovering()
    ready = turn(core, prepare_reply(2, NONE, ballot=ballot))
    [(_, accept)] = msgs(ready.send_after_persist, EAccept)[:1]
    assert accept.batch == () and accept.ballot == ballot
    # the owner proposed it and crashed before any PreAccept left; it hears of the no-op
    owner = replica(0)
    turn(owner, key_cmd(7, "a"))
    ready = turn(owner, ECommit(src=1, view=0, owner=0, index=0, ballot=ballot, batch=(),
                                seq=0, deps=(-1, -1, -1)))
    # failed, not definitely: a client retry may carry it in another replica's instance
    assert [f.command.seq for f in ready.failed] == [7] and not ready.failed[0].definite


# --------------------------------------------------------------------------- TryPreAccept
# Five replicas: a majority without the owner keeps one member of a 3-replica fast quorum.

NONE5 = (-1,) * 5


def recovering5(me: int, *known: EPreAccept | ECommit) -> tuple[EPaxosReplica, int]:
    """Replica ``me`` of five learns ``known``, then recovers ``(0, 0)``."""
    core = replica(me, n=5)
    for message in known:
        turn(core, message)
    core.step(_heartbeat(0, 1), 0)
    core.advance(core.ready())
    ready = tick(core, 10 * ELECTION_US)
    prepares = [m for _, m in msgs(ready.send_after_persist, EPrepare) if m.owner == 0]
    return core, prepares[0].ballot


def other_on_a(owner: int = 4, deps: tuple[int, ...] = NONE5) -> EPreAccept:
    """``(owner, 0)``: a command on key ``a`` that depends on nothing (as ``deps`` says)."""
    return EPreAccept(src=owner, view=0, owner=owner, index=0, ballot=owner,
                      batch=(key_cmd(1, "a", client=owner),), seq=1, deps=deps)


def one_unchanged_reply(ballot: int) -> EPrepareReply:
    return prepare_reply(2, PREACCEPTED_EQ, vballot=0, batch=(key_cmd(1, "a"),), seq=1,
                         deps=NONE5, ballot=ballot)


def test_one_unchanged_pre_accept_in_a_majority_starts_try_pre_accept() -> None:
    # r1 knows (4, 0) on key a, not yet committed and not depending on (0, 0): it cannot
    # hold the owner's attributes itself, so it asks the replicas other than the owner and
    # the one holder
    core, ballot = recovering5(1, other_on_a())
    turn(core, prepare_reply(3, NONE, deps=NONE5, ballot=ballot))
    ready = turn(core, one_unchanged_reply(ballot))
    tries = msgs(ready.send_after_persist, ETryPreAccept)
    assert sorted(to for to, _ in tries) == [3, 4]
    assert tries[0][1].deps == NONE5 and tries[0][1].ballot == ballot
    assert not msgs(ready.send_after_persist, EAccept)
    # one more holder: F = 2 besides the owner, a majority with it: accepted as they were
    ready = turn(core, ETryPreAcceptReply(src=3, view=0, owner=0, index=0, ballot=ballot,
                                          ok=True, conflict=TRY_OK))
    [(_, accept)] = msgs(ready.send_after_persist, EAccept)[:1]
    assert accept.deps == NONE5 and accept.seq == 1 and accept.ballot == ballot


def test_the_recoverer_holds_the_attributes_itself_when_nothing_conflicts_here() -> None:
    core, ballot = recovering5(1)
    turn(core, prepare_reply(3, NONE, deps=NONE5, ballot=ballot))
    ready = turn(core, one_unchanged_reply(ballot))
    [(_, accept)] = msgs(ready.send_after_persist, EAccept)[:1]
    assert accept.deps == NONE5


def test_a_committed_conflict_proves_the_fast_path_did_not_choose_them() -> None:
    core, ballot = recovering5(1, other_on_a())
    turn(core, prepare_reply(3, NONE, deps=NONE5, ballot=ballot))
    turn(core, one_unchanged_reply(ballot))
    ready = turn(core, ETryPreAcceptReply(src=4, view=0, owner=0, index=0, ballot=ballot,
                                          ok=True, conflict=TRY_CONFLICT_COMMITTED))
    # phase 1 again at the recovery's ballot, with the conflict among the dependencies
    [(_, again)] = msgs(ready.send_after_persist, EPreAccept)[:1]
    assert again.ballot == ballot and again.deps[4] == 0
    assert not msgs(ready.send_after_persist, EAccept)


def test_conflicts_not_yet_committed_defer_the_recovery() -> None:
    core, ballot = recovering5(1, other_on_a())
    turn(core, prepare_reply(3, NONE, deps=NONE5, ballot=ballot))
    turn(core, one_unchanged_reply(ballot))
    for src in (3, 4):
        ready = turn(core, ETryPreAcceptReply(src=src, view=0, owner=0, index=0,
                                              ballot=ballot, ok=True, conflict=TRY_CONFLICT))
        assert not msgs(ready.send_after_persist, EAccept)
        assert not msgs(ready.send_after_persist, EPreAccept)
    # every replica answered: it prepares again after a timeout, at a higher ballot
    ready = tick(core, 100 * ELECTION_US)
    again = [m for _, m in msgs(ready.send_after_persist, EPrepare) if m.owner == 0]
    assert again and again[0].ballot > ballot


def try_pre_accept(ballot: int) -> ETryPreAccept:
    return ETryPreAccept(src=1, view=0, owner=0, index=0, ballot=ballot,
                         batch=(key_cmd(1, "a"),), seq=1, deps=NONE5)


@pytest.mark.parametrize(("known", "conflict"), [
    ((), TRY_OK),
    ((other_on_a(),), TRY_CONFLICT),
    ((ECommit(src=4, view=0, owner=4, index=0, ballot=4, batch=(key_cmd(1, "a", client=4),),
              seq=1, deps=NONE5),), TRY_CONFLICT_COMMITTED),
    # it depends on (0, 0): no conflict
    ((other_on_a(deps=(0, -1, -1, -1, -1)),), TRY_OK),
    # another key: no conflict
    ((EPreAccept(src=4, view=0, owner=4, index=0, ballot=4, batch=(key_cmd(1, "b"),), seq=1,
                 deps=NONE5),), TRY_OK),
])
def test_an_acceptor_pre_accepts_unless_it_knows_a_conflict(
    known: tuple[EPreAccept | ECommit, ...], conflict: int
) -> None:
    r3 = replica(3, n=5)
    for message in known:
        turn(r3, message)
    ballot = ballot_of(1, 1)
    ready = turn(r3, try_pre_accept(ballot))
    [(to, reply)] = msgs(ready.send_after_persist, ETryPreAcceptReply)
    assert to == 1 and reply.ok and reply.conflict == conflict
    [record] = [r for r in records_of(ready, EInstanceRecord) if r.owner == 0]
    assert record.ballot == ballot  # the promise is durable either way
    held = conflict == TRY_OK
    assert (record.status, record.deps) == ((PREACCEPTED, NONE5) if held else (NONE, NONE5))
    # and a lower ballot is refused
    ready = turn(r3, try_pre_accept(ballot_of(1, 0)))
    [(_, refusal)] = msgs(ready.send_after_persist, ETryPreAcceptReply)
    assert not refusal.ok and refusal.ballot == ballot


def test_the_unsafe_variant_pre_accepts_despite_a_committed_conflict() -> None:
    r3 = replica(3, n=5, unsafe=frozenset({"epaxos_try_ignores_conflicts"}))
    turn(r3, ECommit(src=4, view=0, owner=4, index=0, ballot=4,
                     batch=(key_cmd(1, "a", client=4),), seq=1, deps=NONE5))
    ready = turn(r3, try_pre_accept(ballot_of(1, 1)))
    [(_, reply)] = msgs(ready.send_after_persist, ETryPreAcceptReply)
    assert reply.conflict == TRY_OK


def test_a_prepare_at_a_higher_ballot_stops_the_owner_and_refuses_lower_ballots() -> None:
    r0 = replica(0)
    turn(r0, key_cmd(1, "a"))
    ready = turn(r0, EPrepare(src=1, view=0, owner=0, index=0, ballot=257))
    [(_, reply)] = msgs(ready.send_after_persist, EPrepareReply)
    assert reply.ok and reply.status == PREACCEPTED_EQ
    assert records_of(ready, EInstanceRecord)[0].ballot == 257  # the promise is durable
    # a fast-path quorum of late replies at the default ballot no longer commits
    ready = turn(r0, EPreAcceptReply(src=2, view=0, owner=0, index=0, ballot=0, ok=True,
                                     seq=1, deps=(-1, -1, -1), changed=False))
    assert ready.ready == [] and not msgs(ready.send_after_persist, ECommit)
    r2 = replica(2)
    turn(r2, EPrepare(src=1, view=0, owner=0, index=0, ballot=257))
    ready = turn(r2, pre_accept(0, 0, key_cmd(1, "a")))
    [(_, refusal)] = msgs(ready.send_after_persist, EPreAcceptReply)
    assert not refusal.ok and refusal.ballot == 257


def test_a_crashed_owners_instance_is_recovered_and_executed_by_the_others() -> None:
    cluster = net(3)
    cluster.lose = lambda src, dst, msg: (src == 0 and dst == 2) or (src == 0 and
                                                                   isinstance(msg, ECommit))
    cluster.propose(0, key_cmd(1, "a"))
    cluster.run()
    # r1 pre-accepted; the owner committed on the fast path but its commits were lost
    assert cluster.executed[1] == [] and cluster.executed[2] == []
    cluster.cores[0] = replica(0)  # ... and it crashed with nothing persisted
    cluster.lose = lambda src, dst, msg: src == 0 or dst == 0
    for step in range(1, 8):
        cluster.tick_all(step * ELECTION_US)
    assert [e.command.seq for e in cluster.executed[1]] == [1]
    assert [e.command.seq for e in cluster.executed[2]] == [1]


def test_restart_never_reuses_an_index_and_recovers_its_unfinished_instances() -> None:
    r0 = replica(0)
    records = records_of(turn(r0, key_cmd(1, "a")), EInstanceRecord)
    records += records_of(turn(r0, key_cmd(2, "b")), EInstanceRecord)
    again = EPaxosReplica(config(3), 0, recovered=records, rng=random.Random(0))
    ready = turn(again, key_cmd(3, "c"))
    assert [m.index for _, m in msgs(ready.send_after_persist, EPreAccept)] == [2, 2]
    ready = tick(again, 1)
    assert sorted({m.index for _, m in msgs(ready.send_after_persist, EPrepare)}) == [0, 1]


def test_snapshot_compaction_forgets_executed_instances_and_sends_the_snapshot() -> None:
    cluster = net(3)
    for seq in range(3):
        cluster.propose(0, key_cmd(seq, "a"))
        cluster.run()
    core = cluster.cores[1]
    meta = core.snapshot_meta()
    assert meta == SnapshotMeta(3, (3, 0, 0))
    assert core.compact(meta) == []
    ready = turn(core, EPrepare(src=2, view=0, owner=0, index=1, ballot=258))
    assert ready.snapshot_requests == [2]
    # a snapshot that does not cover what a replica executed is refused
    other = replica(2)
    turn(other, ECommit(src=1, view=0, owner=1, index=0, ballot=1, batch=(key_cmd(9, "z"),),
                        seq=1, deps=(-1, -1, -1)))
    other.install_snapshot(meta)
    assert other.exec_slot == 1
    fresh = replica(2)
    fresh.install_snapshot(meta)
    assert fresh.exec_slot == 3 and fresh.snapshot_meta() == meta


# --------------------------------------------------------------------------- wire, config


def test_messages_round_trip_and_admission_bounds_the_deps() -> None:
    message = pre_accept(1, 0, key_cmd(1, "a"), deps=(-1, 4, 2))
    assert decode_frame(encode_frame([message])) == [message]
    core = replica(0)
    assert check_peer_message(message, 3, core, protocol="epaxos") is None
    short = pre_accept(1, 0, key_cmd(1, "a"), deps=(-1, 4))
    assert "deps has 2 entries" in (check_peer_message(short, 3, core, protocol="epaxos") or "")
    far = pre_accept(1, 0, key_cmd(1, "a"), deps=(-1, 1 << 40, 2))
    assert check_peer_message(far, 3, core, protocol="epaxos") is not None
    assert check_peer_message(message, 3, core, protocol="sdpaxos") is not None


def test_an_unsafe_variant_epaxos_lacks_is_refused() -> None:
    with pytest.raises(ConfigError, match="only the unsafe variants"):
        replica(0, unsafe=frozenset({"go_ready_rule"}))


def test_peer_bytes_never_crash_the_core() -> None:
    core = replica(0)
    weird = EPreAcceptReply(src=1, view=0, owner=0, index=99, ballot=0, ok=True, seq=1,
                            deps=(-1, -1, -1), changed=False)
    turn(core, weird)  # a reply for an instance never proposed: ignored
    turn(core, prepare_reply(1, PREACCEPTED, ballot=9))  # no recovery under way: ignored
    assert core.instances == {}
