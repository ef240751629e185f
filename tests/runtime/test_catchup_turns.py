"""A replica catching up applies what its peers send in bounded loop turns: a turn is how
long a peer's message or a client waits behind it, and a catch-up turn of seconds made it
look dead (a follower restarted with 25,000 slots to learn did not answer /metrics for 17 s)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from consensus.messages import Command
from consensus.runtime.node import ReplicaNode
from consensus.statemachine import KVStore, kv_put

from .polling import wait_until
from .test_snapshots import three_replicas

#: generous against a shared 2-core machine's noise (the issue's target is ~50 ms; a quiet
#: machine measures a few tens of ms here, and the build before frames were split and
#: applying was sliced held the loop 0.3-0.6 s for one catch-up answer of this test)
BUSY_BOUND_S = 0.25


async def test_catch_up_turns_stay_short(tmp_path: Path) -> None:
    config = three_replicas(tmp_path)

    def node(i: int) -> ReplicaNode:
        return ReplicaNode(config, i, KVStore(), fsync=False)

    nodes = [node(i) for i in range(3)]
    for n in nodes:
        await n.start()
    try:
        await nodes[2].stop()
        seq = 0
        for _ in range(10):  # 20,000 commands in a few thousand slots
            await asyncio.gather(*(
                nodes[i % 2].submit(Command(
                    client_id=i % 2, seq=seq + i, op=kv_put(f"k{(seq + i) % 500}", "v" * 64),
                    keys=(f"k{(seq + i) % 500}",), blind=True,
                ))
                for i in range(2000)
            ))
            seq += 2000
        # blind writes are answered once ready: wait until they are executed, too
        await wait_until(lambda: nodes[0].stats.commands_applied >= 20_000, "not executed")
        target = nodes[0].executed_slot
        nodes[2] = node(2)
        await nodes[2].start()
        await wait_until(lambda: nodes[2].executed_slot >= target, "no catch-up", 60)
        stats = nodes[2].stats
        assert stats.commands_applied >= 20_000  # learned from its peers, not a snapshot
        assert stats.snapshots_installed == 0
        assert stats.longest_busy_s < BUSY_BOUND_S, stats.longest_busy_s
    finally:
        for n in nodes:
            await n.stop()


async def test_a_restart_reports_its_own_work_not_the_time_since_boot(tmp_path: Path) -> None:
    config = three_replicas(tmp_path)
    node = ReplicaNode(config, 0, KVStore(), fsync=False)
    await node.start()
    try:
        assert 0 < node.stats.longest_busy_s < BUSY_BOUND_S
    finally:
        await node.stop()
