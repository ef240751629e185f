"""Each readiness condition of ``consensus.runtime.health``, judged (``judge``) from the
status of real cores the simulator runs — a partitioned replica that really lags, followers
cut off from their sequencer that really campaign, a member that really learns — and the
liveness and readiness of a real node whose loop dies."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from consensus.config import ProtocolConfig
from consensus.errors import IndefiniteFailure
from consensus.messages import Command
from consensus.protocol.membership import MemberReplica
from consensus.protocol.status import CoreStatus
from consensus.protocol.types import Role
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.health import Readiness, judge, liveness, readiness
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.sim.simulator import SimOptions, Simulation
from consensus.statemachine import KVStore, kv_put

from .polling import wait_until

NOW = 1000.0
WINDOW_S = 0.6
#: the lag the judgements below tolerate (the lagging replica misses far more)
MAX_LAG = 20
#: simulated time for a step of the scenarios below to happen
STEP_US = 5_000_000


def verdict(
    status: CoreStatus, me: int, *, serving: bool = True, applied: int | None = None,
    heard_at: Mapping[int, float] | None = None,
) -> Readiness:
    """``status``'s judgement, by default for a serving replica that applied everything its
    core executed and heard from every voter just now."""
    return judge(
        status, me=me, serving=serving, applied=status.executed if applied is None else applied,
        heard_at={v: NOW for v in status.voters} if heard_at is None else heard_at, now=NOW,
        heard_window_s=WINDOW_S, max_lag=MAX_LAG,
    )


def simulation(protocol: str) -> Simulation:
    sim = Simulation(SimOptions(protocol=protocol, replicas=3, network="lan", ops=400,
                                workload="writes"), 3)
    sim.start()
    return sim


def statuses(sim: Simulation) -> list[CoreStatus]:
    return [rep.core.status() for rep in sim.replicas]


@pytest.mark.parametrize("protocol", ["sdpaxos", "multipaxos", "mencius"])
def test_a_replica_that_missed_the_writes_is_not_ready_until_it_caught_up(protocol: str) -> None:
    sim = simulation(protocol)
    sim.network.isolate(2, 3)
    assert sim.run_until(lambda: statuses(sim)[0].executed > 2 * MAX_LAG, deadline_us=STEP_US)
    # it hears the others again (their heartbeats say how far they are), but its requests
    # for what it missed are lost
    sim.network.heal()
    sim.network.cut(2, 0)
    sim.network.cut(2, 1)

    def lagging() -> bool:
        status = statuses(sim)[2]
        return (status.best_peer_executed or 0) - status.executed > MAX_LAG

    assert sim.run_until(lagging, deadline_us=sim.now + STEP_US)
    behind = statuses(sim)[2]
    reasons = verdict(behind, 2).reasons
    assert reasons == (f"applied up to slot {behind.executed}, a peer reported "
                       f"{behind.best_peer_executed} (more than {MAX_LAG} behind)",)
    assert verdict(statuses(sim)[0], 0).ready
    # the applied position is the node's, not the core's: applied further, it would be ready
    assert verdict(behind, 2, applied=behind.best_peer_executed).ready
    sim.network.heal()
    assert sim.run_until(lambda: verdict(statuses(sim)[2], 2).ready, deadline_us=sim.now + STEP_US)
    assert statuses(sim)[2].executed >= behind.best_peer_executed  # type: ignore[operator]


def test_followers_cut_off_from_their_sequencer_are_not_ready_while_they_change_views() -> None:
    sim = simulation("sdpaxos")
    assert sim.run_until(lambda: statuses(sim)[1].executed > 0, deadline_us=STEP_US)
    assert all(verdict(status, me).ready for me, status in enumerate(statuses(sim)))
    sim.network.isolate(0, 3)
    seen: dict[str, list[tuple[Role, tuple[str, ...]]]] = {"campaign": [], "unaccepted": []}

    def watch() -> bool:
        for me in (1, 2):
            status = statuses(sim)[me]
            if status.role in (Role.CANDIDATE, Role.ESTABLISHING):
                seen["campaign"].append((status.role, verdict(status, me).reasons))
            elif not status.view_accepted:
                seen["unaccepted"].append((status.role, verdict(status, me).reasons))
        new = [statuses(sim)[me] for me in (1, 2)]
        return all(s.view > 0 and s.view_accepted and s.role in (Role.SEQUENCER, Role.FOLLOWER)
                   for s in new) and bool(seen["campaign"])

    assert sim.run_until(watch, deadline_us=sim.now + STEP_US)
    for role, reasons in seen["campaign"] + seen["unaccepted"]:
        assert len(reasons) == 1 and "not accepted yet" in reasons[0]
        assert f"(role {role.value})" in reasons[0]
    assert {role for role, _ in seen["campaign"]} <= {Role.CANDIDATE, Role.ESTABLISHING}
    after = statuses(sim)
    assert all(verdict(after[me], me).ready for me in (1, 2))
    assert after[1].leader == after[2].leader == after[1].view % 3 != 0


def test_a_majority_of_the_voters_must_have_been_heard_from_within_the_window() -> None:
    sim = simulation("sdpaxos")
    assert sim.run_until(lambda: statuses(sim)[0].executed > 0, deadline_us=STEP_US)
    status = statuses(sim)[0]
    stale = NOW - WINDOW_S - 0.01
    assert verdict(status, 0, heard_at={1: NOW - 0.1, 2: stale}).ready  # itself and 1
    reasons = verdict(status, 0, heard_at={1: stale, 7: NOW}).reasons  # 7 votes nowhere
    assert reasons == ("heard from 1 of 3 replicas (itself included) in the last 0.6s, a "
                       "majority is 2",)


def test_a_member_learning_the_log_is_not_ready() -> None:
    learner = MemberReplica(ProtocolConfig(replicas=3), 3, rng=random.Random(0)).status()
    # every voter heard from: only its vote is missing
    assert verdict(learner, 3).reasons == (
        "not a voter (a member learning the log, or one removed)",)


class PoisonedStore(KVStore):
    """A key-value store with a bug: applying ``POISON`` raises."""

    POISON = kv_put("poison", "x")

    def apply_batch(self, position: int, commands: Sequence[Command]) -> list[bytes]:
        if any(command.op == self.POISON for command in commands):
            raise RuntimeError("a bug in the state machine")
        return super().apply_batch(position, commands)


def test_a_real_node_is_live_until_its_loop_dies_and_ready_only_while_it_serves(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(1, free_base_port(), wan=False))
    config = load_cluster_config(path)

    async def run() -> None:
        node = ReplicaNode(config, 0, PoisonedStore(), fsync=False)
        assert liveness(node).ready and not node.serving  # not started: nothing died
        assert "not serving" in readiness(node).reasons[0]
        await node.start()
        try:
            await wait_until(lambda: readiness(node).ready, "a lone replica serves")
            poison = Command(client_id=1, seq=1, op=PoisonedStore.POISON, keys=("poison",))
            submitted = asyncio.ensure_future(node.submit(poison))
            with pytest.raises(RuntimeError, match="a bug in the state machine"):
                await node.wait_failed()
            assert node.loop_died and not node.serving
            assert liveness(node).reasons == ("the replica's event loop stopped",)
            assert "not serving" in readiness(node).reasons[0]
        finally:
            await node.stop()
        assert not node.loop_died and liveness(node).ready  # stopped on purpose
        assert "not serving" in readiness(node).reasons[0]
        with pytest.raises(IndefiniteFailure):  # never answered: it may or may not apply
            await submitted

    asyncio.run(asyncio.wait_for(run(), 30))
