"""Sessions through real replica nodes and the native client (``consensus.sessions``): the
replicas propose log-time commands, an idle session is evicted on every replica, its client
goes on in a new session, a late copy of a request it ran is refused ("expired") and not
applied again, and the client port refuses what only replicas may propose."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import msgpack
import pytest

from consensus.errors import DefiniteFailure, SessionExpired
from consensus.runtime.cli import cluster_toml
from consensus.runtime.client import Client
from consensus.runtime.client_port import MAX_OPEN_AHEAD_S
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.sessions import LOG_TIME_MAGIC, SessionLimits, SessionTable, session_seq
from consensus.statemachine import KVStore, kv_put

#: an idle session goes after two seconds of log time, which moves every second while active
LIMITS = SessionLimits(idle_ttl_s=2, time_step_s=1)


@asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[list[ReplicaNode], Client]]:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    config = load_cluster_config(path)
    nodes = [ReplicaNode(config, i, KVStore(SessionTable(LIMITS)), fsync=False)
             for i in range(3)]
    for node in nodes:
        await node.start()
    client = Client(7, [spec.client_address for spec in config.replicas], timeout_s=5.0)
    try:
        yield nodes, client
    finally:
        await client.close()
        for node in nodes:
            await node.stop()


def tables(nodes: list[ReplicaNode]) -> list[SessionTable]:
    return [node.sessions for node in nodes if node.sessions is not None]


async def until(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def value(nodes: list[ReplicaNode], key: str) -> set[str | None]:
    return {node.state_machine.data.get(key) for node in nodes}  # type: ignore[attr-defined]


def test_an_evicted_session_s_request_is_refused_and_its_client_goes_on(tmp_path: Path) -> None:
    async def run() -> None:
        async with cluster(tmp_path) as (nodes, client):
            open_by = client._numbers.open_by
            first = session_seq(open_by, 0)
            await client.execute(kv_put("k", "1"), ["k"])
            await until(lambda: all(t.counts()["open"] == 1 and t.now for t in tables(nodes)),
                        "the session open, log time set, everywhere")
            assert sum(node.stats.log_times_proposed for node in nodes) >= 1
            # idle: evicted on every replica (a tombstone: its open-by time is ahead)
            await until(lambda: all(t.counts() == {"open": 0, "closed": 0, "pinned": 0,
                                                   "tombstones": 1} for t in tables(nodes)),
                        "the idle session evicted everywhere")
            # its client's next request is refused, never ran, and goes again in a new session
            reply = await client.execute(kv_put("k", "2"), ["k"])
            assert reply.status == "ok" and client._numbers.open_by > open_by
            assert sum(node.stats.sessions_expired for node in nodes) == 1
            await until(lambda: value(nodes, "k") == {"2"}, "the write everywhere")
            # a late copy of the request the evicted session ran is refused, not run again
            with pytest.raises(SessionExpired) as refused:
                await client.execute(kv_put("k", "1"), ["k"], seq=first)
            assert refused.value.log_time >= max(t.now for t in tables(nodes)) - 5
            await asyncio.sleep(0.2)
            assert value(nodes, "k") == {"2"}

    asyncio.run(asyncio.wait_for(run(), 90))


def test_a_one_shot_write_leaves_a_closed_session_and_the_next_opens_another(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        async with cluster(tmp_path) as (nodes, client):
            await client.execute(kv_put("k", "1"), ["k"], last=True)
            await until(lambda: all(t.counts()["closed"] == 1 for t in tables(nodes)),
                        "a closed session everywhere")
            assert all(t.counts()["open"] == 0 for t in tables(nodes))
            reply = await client.execute(kv_put("k", "2"), ["k"])  # a new session
            assert reply.status == "ok"
            await until(lambda: all(t.counts()["open"] == 1 for t in tables(nodes)),
                        "the next session open")

    asyncio.run(asyncio.wait_for(run(), 60))


def test_the_client_port_refuses_log_time_ops_and_sessions_far_ahead(tmp_path: Path) -> None:
    async def run() -> None:
        async with cluster(tmp_path) as (nodes, client):
            forged = LOG_TIME_MAGIC + (10**10).to_bytes(8, "big")
            with pytest.raises(DefiniteFailure, match="log-time magic"):
                await client.execute(forged, seq=1)
            ahead = session_seq(int(time.time()) + MAX_OPEN_AHEAD_S + 60, 0)
            with pytest.raises(DefiniteFailure, match="open-by time"):
                await client.execute(kv_put("k", "v"), ["k"], seq=ahead)
            assert all(t.now == 0 for t in tables(nodes))  # nothing moved the log time
            assert value(nodes, "k") == {None}
            answer = await client.execute(kv_put("k", "v"), ["k"])
            assert msgpack.unpackb(answer.payload) == ["ok"]

    asyncio.run(asyncio.wait_for(run(), 60))
