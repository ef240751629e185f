"""Authorization in the replicated allocation store (issue 22, point 3), at the state machine:
two replicas applying the same sealed commands reach the same verdicts and the same bytes; a
scheduler acts only on its VCs (it cannot release another's group, submit into another's VC,
read another's groups or see another's events); a reader only reads; a refusal changes
nothing."""

from __future__ import annotations

from typing import Any

import msgpack
from cs_helpers import without_sessions

from cluster_state import ops
from cluster_state.authz import SKIPPED, AuthorizedStore
from cluster_state.config import synthetic_config
from consensus.auth import (
    ADMIN,
    READER,
    SCHEDULER,
    AuthorizingMachine,
    Denied,
    Principal,
    seal,
)
from consensus.messages import Command

A = Principal("sched-a", SCHEDULER, ("vc00",))
B = Principal("sched-b", SCHEDULER, ("vc01",))
RO = Principal("ro", READER)
ROOT = Principal("root", ADMIN)


class Replica:
    """One replica's state machine, behind the principals' check."""

    def __init__(self) -> None:
        self.store = AuthorizedStore(synthetic_config(nodes=16, vcs=2))
        self.machine = AuthorizingMachine(self.store)
        self.position = 0

    def run(self, who: Principal, op: bytes) -> bytes | Denied:
        self.position += 1
        command = Command(client_id=1, seq=self.position, op=seal(who, op))
        return self.machine.run(self.position, command)

    def ask(self, who: Principal, op: bytes) -> bytes | Denied:
        return self.machine.ask(seal(who, op))


def job(name: str, vc: str) -> bytes:
    return ops.submit(name, vc, 10, [(1, 8)])


def answer(result: bytes | Denied) -> list[Any]:
    assert isinstance(result, bytes), result
    decoded: list[Any] = msgpack.unpackb(result)
    return decoded


def test_schedulers_act_on_their_own_vcs_only_and_replicas_agree() -> None:
    replicas = [Replica(), Replica()]
    script: list[tuple[Principal, bytes, bool]] = [
        (A, job("a1", "vc00"), True),
        (B, job("b1", "vc01"), True),
        (A, job("a2", "vc01"), False),           # submit into B's VC
        (A, ops.release("b1"), False),           # release B's group
        (A, job("b1", "vc00"), False),           # B's group name under A's VC
        (A, ops.set_node_health("0", False), False),
        (RO, job("r1", "vc00"), False),
        (RO, ops.release("a1"), False),
        (B, ops.release("b1"), True),
        (A, ops.release("a1"), True),
        (ROOT, ops.set_node_health("0", False), True),
    ]
    for who, op, allowed in script:
        outcomes = []
        for replica in replicas:
            before = without_sessions(replica.store.snapshot())
            outcome = replica.run(who, op)
            if not allowed:
                assert isinstance(outcome, Denied), (who, op)
                assert outcome.reason.startswith("permission denied")
                # nothing changes but the session's memory of the refusal (issue 39)
                assert without_sessions(replica.store.snapshot()) == before, \
                    "a refusal changes nothing"
            else:
                assert not isinstance(outcome, Denied), (who, op, outcome)
            outcomes.append(outcome)
        assert outcomes[0] == outcomes[1]
    assert replicas[0].store.snapshot() == replicas[1].store.snapshot()


def test_schedulers_read_and_watch_their_own_vcs_only() -> None:
    replica = Replica()
    for who, name, vc in ((A, "a1", "vc00"), (B, "b1", "vc01"), (B, "b2", "vc01")):
        assert not isinstance(replica.run(who, job(name, vc)), Denied)
    assert answer(replica.ask(A, ops.get_group("a1")))[0] == "group"
    assert isinstance(replica.ask(A, ops.get_group("b1")), Denied)
    assert isinstance(replica.ask(A, ops.get_vc("vc01")), Denied)
    assert isinstance(replica.ask(A, ops.list_groups("vc01")), Denied)
    assert isinstance(replica.ask(A, ops.list_groups("")), Denied)   # every VC at once
    assert isinstance(replica.ask(A, ops.get_summary()), Denied)
    assert isinstance(replica.ask(A, ops.inspect("physical")), Denied)
    assert answer(replica.ask(A, ops.get_vc("vc00")))[0] == "vc"
    for who in (RO, ROOT):  # readers and admins read everything
        assert answer(replica.ask(who, ops.get_summary()))[0] == "summary"
        assert answer(replica.ask(who, ops.get_group("b1")))[0] == "group"
    # the watch stream: A sees its own group's events and none of B's
    page = answer(replica.ask(A, ops.get_events(-1)))
    seen = {(kind, subject) for _, kind, subject, _ in page[2]}
    assert ("placed", "a1") in seen
    assert not any(subject.startswith("b") for _, subject in seen)
    everything = answer(replica.ask(ROOT, ops.get_events(-1)))[2]
    assert {e[2] for e in everything} >= {"a1", "b1", "b2"}
    # a page ending in B's events ends with a placeholder, so A's watch moves past them
    last = page[2][-1]
    assert last[1] == SKIPPED and last[0] == everything[-1][0]
    assert last[2] == "" and last[3] == []
    # a group released is gone from the store: its release still shows to its own VC only
    assert not isinstance(replica.run(A, ops.release("a1")), Denied)
    assert not isinstance(replica.run(B, ops.release("b1")), Denied)
    since = everything[-1][0]
    mine = answer(replica.ask(A, ops.get_events(since)))[2]
    assert [(e[1], e[2]) for e in mine if e[1] != SKIPPED] == [("released", "a1")]


def test_a_replica_restored_from_a_snapshot_reaches_the_same_verdicts() -> None:
    """Verdicts on updates read replicated state only: a replica that restored a snapshot
    (and so never saw the groups released before it) decides as the one that applied all."""
    old, restored = Replica(), Replica()
    for who, op in ((B, job("b1", "vc01")), (B, ops.release("b1"))):
        assert not isinstance(old.run(who, op), Denied)
    restored.store.restore(old.store.snapshot())
    restored.position = old.position
    for who, op in ((A, ops.release("b1")), (A, job("b1", "vc00")), (A, ops.release("b1"))):
        assert old.run(who, op) == restored.run(who, op)
    assert old.store.snapshot() == restored.store.snapshot()
