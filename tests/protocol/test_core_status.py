"""Every core's ``status()`` (``consensus.protocol.status.CoreStatus``), read from real cores
run by the simulator: roles, leaders, positions and leases as each protocol knows them, and
the membership layer's translation to member ids and global slots."""

from __future__ import annotations

import dataclasses
import random

import pytest

from consensus.config import ProtocolConfig
from consensus.protocol.membership import MemberReplica
from consensus.protocol.status import CoreStatus
from consensus.protocol.types import Role
from consensus.sim.cli import parse_faults
from consensus.sim.simulator import SimOptions, Simulation

OPS = 60
#: simulated time enough for OPS writes on the LAN and a few heartbeats after them
PLENTY_US = 3_000_000

S, L, F, P = Role.SEQUENCER, Role.LEADER, Role.FOLLOWER, Role.PEER


def settled(protocol: str) -> Simulation:
    """Three replicas of ``protocol`` after OPS writes, once every replica's status reports
    each peer's frontier as that peer's own status does (a heartbeat after the last write)."""
    sim = Simulation(SimOptions(protocol=protocol, replicas=3, network="lan", ops=OPS,
                                workload="writes"), 5)
    sim.start()

    def converged() -> bool:
        statuses = [rep.core.status() for rep in sim.replicas]
        return sim.result.ops_completed == OPS and all(
            at == statuses[peer].executed
            for status in statuses for peer, at in status.peer_executed.items())

    assert sim.run_until(converged, deadline_us=PLENTY_US)
    return sim


@pytest.mark.parametrize(("protocol", "roles", "leader", "leases", "positions"), [
    # leases: (held by each replica, the replica each granted its lease to)
    ("sdpaxos", (S, F, F), 0, ((True, False, False), (None, 0, 0)), True),
    ("multipaxos", (L, F, F), 0, ((True, False, False), (None, 0, 0)), True),
    ("mencius", (P, P, P), None, ((False,) * 3, (None,) * 3), True),
    # EPaxos executes in an order of its own: its positions compare with nobody's
    ("epaxos", (P, P, P), None, ((False,) * 3, (None,) * 3), False),
])
def test_each_core_says_its_role_leader_positions_and_leases(
    protocol: str, roles: tuple[Role, ...], leader: int | None,
    leases: tuple[tuple[bool, ...], tuple[int | None, ...]], positions: bool,
) -> None:
    sim = settled(protocol)
    statuses = [rep.core.status() for rep in sim.replicas]
    assert tuple(s.role for s in statuses) == roles
    assert {s.leader for s in statuses} == {leader}
    assert tuple(s.lease_held for s in statuses) == leases[0]
    assert tuple(s.lease_granted_to for s in statuses) == leases[1]
    for me, (rep, status) in enumerate(zip(sim.replicas, statuses, strict=True)):
        assert status.executed == rep.core.exec_slot > 0
        assert (status.view, status.epoch, status.voters) == (0, 0, (0, 1, 2))
        assert status.voting and status.view_accepted
        if positions:
            assert set(status.peer_executed) == {0, 1, 2} - {me}
            assert status.best_peer_executed == max(
                statuses[peer].executed for peer in status.peer_executed)
        else:
            assert status.peer_executed == {} and status.best_peer_executed is None


def test_a_status_is_a_frozen_snapshot() -> None:
    # writes spread over a few heartbeats, so that they report moving frontiers
    sim = Simulation(SimOptions(replicas=3, network="lan", ops=OPS, workload="writes",
                                think_us=20_000), 5)
    sim.start()
    core = sim.replicas[1].core
    assert sim.run_until(lambda: (core.status().best_peer_executed or 0) > 0,
                         deadline_us=PLENTY_US)
    status = core.status()
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.executed = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        status.peer_executed[0] = 0  # type: ignore[index]
    assert not hasattr(status, "__dict__")
    before = dict(status.peer_executed)
    assert sim.run_until(lambda: core.status().peer_executed != before, deadline_us=PLENTY_US)
    assert status.peer_executed == before  # the core moved on, the snapshot did not


def membership_run_without_identities() -> Simulation:
    """A finished membership run whose last epoch starts past slot 0 with member ids that are
    not core indexes, a member removed on the way (the first such seed: which one depends on
    how membership runs go, so it is looked for, not pinned)."""
    for seed in range(1, 30):
        sim = Simulation(SimOptions(replicas=3, faults=parse_faults("member"), network="lan",
                                    ops=100), seed)
        assert sim.run().ok
        config = sim._latest_config()
        removed = any(isinstance(rep.core, MemberReplica) and rep.core.removed
                      for rep in sim.replicas)
        if config.base > 0 and config.voters[0] != 0 and removed:
            return sim
    raise AssertionError("no membership run of the first 29 seeds moves its ids and removes")


def test_the_membership_layer_speaks_member_ids_and_global_slots() -> None:
    sim = membership_run_without_identities()
    seen: set[Role] = set()
    for rep in sim.replicas:
        member = rep.core
        assert isinstance(member, MemberReplica)
        status, config, inner = member.status(), member.config, member.core
        seen.add(status.role)
        assert (status.epoch, status.voters, status.view) == (
            config.epoch, config.voters, member.view)
        assert status.executed == member.exec_slot
        if inner is None:
            assert status.role is (Role.REMOVED if member.removed else Role.LEARNER)
            assert not status.voting and status.leader is None and status.peer_executed == {}
            continue
        bare = inner.status()
        voters, base = config.voters, config.base
        assert status.role is bare.role and status.voting
        assert status.leader == member.sequencer == voters[inner.sequencer]
        assert status.executed == base + bare.executed
        assert set(status.peer_executed) == set(voters) - {rep.rid}
        assert all(status.peer_executed[voters[index]] == base + at
                   for index, at in bare.peer_executed.items())
    assert {Role.SEQUENCER, Role.FOLLOWER, Role.REMOVED} <= seen


def test_a_member_not_yet_voting_is_a_learner() -> None:
    learner = MemberReplica(ProtocolConfig(replicas=3), 3, rng=random.Random(0))
    assert learner.status() == CoreStatus(
        role=Role.LEARNER, view=0, executed=0, voters=(0, 1, 2), voting=False)
