"""The client port's ``"status"`` request (issue 21 point 2): each replica reports who it is,
its role and view, where it stands in the log, its disk use, its readiness and the members;
a replica that missed writes reports how far behind the best peer it is, and is not ready."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from consensus.runtime.cli import cluster_toml
from consensus.runtime.client import Client, cut_off
from consensus.runtime.cluster_config import ClusterConfig, load_cluster_config
from consensus.runtime.health import readiness
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.runtime.status import STATUS_FIELDS, package_version, replica_status
from consensus.statemachine import KVStore, kv_put
from tests.runtime.polling import wait_until

WRITES = 20


def three_replicas(tmp_path: Path, *protocol: str) -> ClusterConfig:
    """A loopback cluster file of three replicas, with extra ``[protocol]`` lines."""
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False).replace(
        "[protocol]", "\n".join(("[protocol]", *protocol))))
    return load_cluster_config(path)


def test_every_replica_reports_its_role_position_disk_use_and_the_members(
    tmp_path: Path,
) -> None:
    config = three_replicas(tmp_path)
    addresses = [spec.client_address for spec in config.replicas]

    async def statuses() -> list[dict[str, Any]]:
        answers = []
        for home in range(len(addresses)):
            async with Client(5, addresses, home=home, timeout_s=5.0) as client:
                answers.append(await client.status())
        return answers

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        nodes = [ReplicaNode(config, i, KVStore(), fsync=False) for i in range(3)]
        for node in nodes:
            await node.start()
        try:
            before = await statuses()
            async with Client(7, addresses, timeout_s=5.0) as client:
                for i in range(WRITES):
                    await client.execute(kv_put(f"k{i}", "v"), [f"k{i}"])
            await wait_until(lambda: all(n.executed_slot >= nodes[0].executed_slot
                                         for n in nodes), "every replica applied the writes")
            return before, await statuses()
        finally:
            for node in nodes:
                await node.stop()

    before, after = asyncio.run(asyncio.wait_for(run(), 60))
    for replica, status in enumerate(after):
        assert set(status) == set(STATUS_FIELDS)
        spec = config.replicas[replica]
        assert (status["id"], status["site"], status["cluster_id"]) == (replica, spec.site, "local")
        assert status["address"] == f"{spec.client_address[0]}:{spec.client_address[1]}"
        assert status["version"] == package_version()
        assert status["role"] == ("sequencer" if replica == 0 else "follower")
        assert status["leader"] == 0 and status["view"] == 0
        assert status["applied"] >= before[replica]["applied"] + 1  # the writes moved it on
        assert status["wal_bytes"] > 0 and status["live"] is True
        assert status["lag"] == 0 and status["best_peer_applied"] <= status["applied"]
        assert [m[0] for m in status["members"]] == [0, 1, 2]
        assert status["members"][replica][2] == status["address"]


def test_a_replica_that_missed_writes_reports_its_lag_and_is_not_ready(tmp_path: Path) -> None:
    # a replica asks for what it missed only after this long without executing anything (or
    # when far behind): it learns how far the others are long before it catches up
    config = three_replicas(tmp_path, "catchup_us = 600000000")
    addresses = [spec.client_address for spec in config.replicas]

    async def isolate(lonely: int) -> None:
        for replica, address in enumerate(addresses):
            others = [r for r in range(len(addresses)) if r != replica]
            await cut_off(address, others if replica == lonely else [lonely])

    async def heal() -> None:
        for address in addresses:
            await cut_off(address, [])

    async def run() -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, ...]]]:
        nodes = [ReplicaNode(config, i, KVStore(), fsync=False, fault_injection=True)
                 for i in range(3)]
        for node in nodes:
            await node.start()
        try:
            await wait_until(lambda: all(readiness(n).ready for n in nodes), "all ready")
            await isolate(2)
            async with Client(7, addresses[:2], timeout_s=5.0) as client:
                for i in range(WRITES):
                    await client.execute(kv_put(f"k{i}", "v"), [f"k{i}"])
            await heal()
            ahead = nodes[0].executed_slot
            await wait_until(lambda: replica_status(nodes[2])["best_peer_applied"] >= ahead,
                             "the lagging replica heard how far the others are")
            async with Client(8, addresses, home=2, timeout_s=5.0) as client:
                lagging = await client.status()
            async with Client(8, addresses, home=0, timeout_s=5.0) as client:
                leading = await client.status()
            return lagging, leading, [
                readiness(node, max_lag=WRITES // 2).reasons for node in nodes]
        finally:
            for node in nodes:
                await node.stop()

    lagging, leading, reasons = asyncio.run(asyncio.wait_for(run(), 60))
    assert lagging["best_peer_applied"] == leading["applied"] >= WRITES
    assert lagging["lag"] == leading["applied"] - lagging["applied"] >= WRITES
    assert (leading["lag"], leading["ready"]) == (0, True)
    # that far behind: ready by the default bound (1000 slots), not by a bound of WRITES / 2
    assert lagging["ready"] and reasons[:2] == [(), ()]
    assert reasons[2] == (f"applied up to slot {lagging['applied']}, a peer reported "
                          f"{leading['applied']} (more than {WRITES // 2} behind)",)
