"""Real processes on loopback: kill -9 and SIGSTOP replicas under load, restart from the WAL,
and check that nothing acknowledged was lost and every replica converged."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import msgpack
import pytest

from consensus.codec import decode_record
from consensus.errors import SDPaxosError
from consensus.messages import CAcceptedRecord, Record, ReserveRecord
from consensus.runtime.client import Client, cut_off
from consensus.runtime.local_cluster import LocalCluster as ProcessCluster
from consensus.sim.history import Operation
from consensus.sim.lincheck import Verdict, check_history
from consensus.statemachine import kv_cas, kv_get, kv_put
from consensus.storage.wal import WriteAheadLog

KEYS = [f"k{i}" for i in range(6)]


async def wait_serving(cluster: ProcessCluster, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    for replica in range(len(cluster.client_addresses)):
        while True:
            client = Client(1 << 40, cluster.client_addresses, home=replica, timeout_s=0.5,
                            attempts=1)
            try:
                await client.read(kv_get("probe"), ["probe"])
                break
            except SDPaxosError:
                if time.monotonic() > deadline:
                    raise AssertionError("cluster did not serve:\n" + cluster.logs()) from None
                await asyncio.sleep(0.2)
            finally:
                await client.close()


async def worker(
    cluster: ProcessCluster, client_id: int, home: int, stop: asyncio.Event,
    acked: dict[str, list[str]], history: list[dict[str, object]],
) -> None:
    rng = random.Random(client_id)
    client = Client(client_id, cluster.client_addresses, home=home, timeout_s=1.0, attempts=6)
    n = 0
    try:
        while not stop.is_set():
            key = rng.choice(KEYS)
            value = f"{client_id}-{n}"
            n += 1
            call = time.monotonic()
            op = rng.choice(["unique", "unique", "put", "cas", "get"])
            try:
                if op == "unique":
                    key = f"u{client_id}-{n}"
                    await client.execute(kv_put(key, value), [key], blind=True)
                    acked[key] = [value]
                    output = None
                elif op == "put":
                    await client.execute(kv_put(key, value), [key], blind=True)
                    acked.setdefault(key, []).append(value)
                    output: object = None
                elif op == "cas":
                    expected = acked[key][-1] if acked.get(key) else None
                    new = value
                    value = (expected, new)  # type: ignore[assignment]
                    reply = await client.execute(kv_cas(key, expected, new), [key])
                    output = msgpack.unpackb(reply.payload)[1]
                    if output:
                        acked.setdefault(key, []).append(new)
                else:
                    reply = await client.read(kv_get(key), [key])
                    output = msgpack.unpackb(reply.payload)[1]
                history.append({"client": client_id, "key": key, "op": op, "value": value,
                                 "output": output, "call": call, "return": time.monotonic()})
            except SDPaxosError:
                history.append({"client": client_id, "key": key, "op": op, "value": value,
                                "output": None, "call": call, "return": None})
                await asyncio.sleep(0.05)
    finally:
        await client.close()


async def final_states(cluster: ProcessCluster, keys: list[str]) -> list[dict[str, object]]:
    states = []
    for replica in range(len(cluster.client_addresses)):
        client = Client(1 << 41, [cluster.client_addresses[replica]], timeout_s=2.0)
        try:
            values = {}
            for key in keys:
                reply = await client.read(kv_get(key), [key], stale=True)
                values[key] = msgpack.unpackb(reply.payload)[1]
            states.append(values)
        finally:
            await client.close()
    return states


@pytest.mark.timeout(120)
def test_kill_pause_restart_loses_nothing_acknowledged(tmp_path: Path) -> None:
    cluster = ProcessCluster(tmp_path, 3)
    cluster.start_all()
    try:
        asyncio.run(_scenario(cluster))
    finally:
        cluster.stop_all()


async def _scenario(cluster: ProcessCluster) -> None:
    await wait_serving(cluster)
    stop = asyncio.Event()
    acked: dict[str, list[str]] = {}
    history: list[dict[str, object]] = []
    workers = [
        asyncio.create_task(worker(cluster, 100 + i, i % 3, stop, acked, history))
        for i in range(6)
    ]
    await asyncio.sleep(1.0)
    cluster.kill(0)  # the sequencer of view 0
    await asyncio.sleep(2.0)
    cluster.start(0)  # restarts from its write-ahead log
    await asyncio.sleep(1.0)
    cluster.pause(1)
    await asyncio.sleep(1.0)
    cluster.resume(1)
    await asyncio.sleep(1.0)
    cluster.kill(2)
    cluster.start(2)
    await asyncio.sleep(1.5)
    stop.set()
    await asyncio.gather(*workers)
    await verify(cluster, history, acked)


def wal_records(cluster: ProcessCluster, replica: int) -> list[Record]:
    """What a stopped replica's write-ahead log holds (opened as its restart opens it)."""
    wal = WriteAheadLog(cluster.config.replica_dir(replica) / "wal")
    try:
        return [decode_record(payload) for payload in wal.recovered]
    finally:
        wal.close()


def reused_indexes(me: int, before: list[Record], after: list[Record]) -> list[int]:
    """Own indexes the incarnation whose records follow ``before`` in ``after`` proposed at
    its pre-prepared ballot (``me``) below the previous one's reservation: an index whose
    CAccept may have left before the crash, proposed again with another value."""
    reserved = max((r.below for r in before if isinstance(r, ReserveRecord)), default=0)
    return [r.index for r in after[len(before):]
            if isinstance(r, CAcceptedRecord) and r.owner == me and r.ballot == me
            and r.index < reserved]


@pytest.mark.timeout(120)
def test_a_leader_killed_under_load_never_reuses_an_index_it_may_have_sent(
    tmp_path: Path,
) -> None:
    """A command leader's CAccept leaves in parallel with its own fsync: killed with some of
    them sent and not durable, it restarts past its durable reservation (its own recovery
    decides the indexes below it), and nothing acknowledged is lost."""
    cluster = ProcessCluster(tmp_path, 3)
    cluster.start_all()
    try:
        asyncio.run(_leader_killed_scenario(cluster))
    finally:
        cluster.stop_all()


async def _leader_killed_scenario(cluster: ProcessCluster) -> None:
    await wait_serving(cluster)
    stop = asyncio.Event()
    acked: dict[str, list[str]] = {}
    history: list[dict[str, object]] = []
    # every client at replica 1, a command leader that is not the sequencer
    workers = [asyncio.create_task(worker(cluster, 300 + i, 1, stop, acked, history))
               for i in range(6)]
    await asyncio.sleep(1.5)
    cluster.kill(1)  # mid-load: its last turns' CAccepts may be out, their records not
    before = wal_records(cluster, 1)
    assert any(isinstance(r, ReserveRecord) for r in before)
    cluster.start(1)
    await asyncio.sleep(2.5)
    stop.set()
    await asyncio.gather(*workers)
    await verify(cluster, history, acked)
    cluster.kill(1)  # (a clean stop would snapshot and rewrite the log)
    after = wal_records(cluster, 1)
    assert after[:len(before)] == before  # the first incarnation's records, then the next's
    own = [r for r in after[len(before):] if isinstance(r, CAcceptedRecord) and r.owner == 1]
    assert own, "the restarted leader proposed nothing"
    assert reused_indexes(1, before, after) == []
    # (the check catches a reuse: the index below the reservation, at the first ballot)
    reserved = max(r.below for r in before if isinstance(r, ReserveRecord))
    reuse = CAcceptedRecord(owner=1, index=reserved - 1, ballot=1, batch=())
    assert reused_indexes(1, before, [*after, reuse]) == [reserved - 1]


@pytest.mark.timeout(120)
def test_partitions_lose_nothing_acknowledged(tmp_path: Path) -> None:
    cluster = ProcessCluster(tmp_path, 3, extra_args=("--fault-injection",))
    cluster.start_all()
    try:
        asyncio.run(_partition_scenario(cluster))
    finally:
        cluster.stop_all()


async def partition(cluster: ProcessCluster, *sides: set[int]) -> None:
    """Cut every link between replicas on different sides (one side: heal everything)."""
    for side in sides or ({*range(len(cluster.client_addresses))},):
        others = [r for other in sides if other is not side for r in other]
        for replica in side:
            await cut_off(cluster.client_addresses[replica], others)


async def _partition_scenario(cluster: ProcessCluster) -> None:
    await wait_serving(cluster)
    stop = asyncio.Event()
    acked: dict[str, list[str]] = {}
    history: list[dict[str, object]] = []
    workers = [
        asyncio.create_task(worker(cluster, 200 + i, i % 3, stop, acked, history))
        for i in range(6)
    ]
    await asyncio.sleep(1.0)
    await partition(cluster, {0}, {1, 2})  # isolate the sequencer of view 0
    await asyncio.sleep(2.5)
    during = len([h for h in history if h["return"] is not None])
    await asyncio.sleep(1.0)
    progressed = len([h for h in history if h["return"] is not None]) - during
    await partition(cluster)
    await asyncio.sleep(1.0)
    await partition(cluster, {1}, {0, 2})  # a minority split off, wherever the sequencer is
    await asyncio.sleep(1.5)
    await partition(cluster, {2}, {0, 1})
    await asyncio.sleep(1.5)
    await partition(cluster)
    await asyncio.sleep(1.0)
    stop.set()
    await asyncio.gather(*workers)
    # the majority side elected a sequencer and kept serving while the old one was cut off
    assert progressed > 5, f"no progress with the sequencer isolated\n{cluster.logs()}"
    await verify(cluster, history, acked)


async def verify(
    cluster: ProcessCluster, history: list[dict[str, object]], acked: dict[str, list[str]]
) -> None:
    """Progress was made; after healing, every replica holds the same state, the history is
    linearizable and every acknowledged write is there."""
    completed = [h for h in history if h["return"] is not None]
    assert len(completed) > 100, f"too little progress: {len(completed)} ops\n{cluster.logs()}"
    # heal: let every replica catch up, then compare
    await wait_serving(cluster)
    keys = sorted(set(KEYS) | set(acked))
    deadline = time.monotonic() + 20
    while True:
        states = await final_states(cluster, keys)
        if all(s == states[0] for s in states) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert all(s == states[0] for s in states), "replicas differ"
    # the recorded client history is linearizable (unknown outcomes may or may not apply)
    kinds = {"unique": "write", "put": "write", "cas": "cas", "get": "read"}
    operations = [
        Operation(
            client=int(h["client"]),  # type: ignore[call-overload]
            key=str(h["key"]),
            op=kinds[str(h["op"])],  # type: ignore[arg-type]
            input=None if h["op"] == "get" else h["value"],
            output=h["output"],
            call=int(float(h["call"]) * 1e6),  # type: ignore[arg-type]
            ret=None if h["return"] is None else int(float(h["return"]) * 1e6),  # type: ignore[arg-type]
        )
        for h in history
    ]
    verdict = check_history(operations, timeout_s=30)
    assert verdict.verdict is not Verdict.ILLEGAL, verdict.detail
    # every acknowledged write is on every replica: unique keys keep their value; a shared
    # key holds an acknowledged value or one whose answer was lost (indefinite), never None
    indefinite = {
        h["value"][1] if isinstance(h["value"], tuple) else h["value"]
        for h in history
        if h["return"] is None
    }
    for key, values in acked.items():
        final = states[0][key]
        if key.startswith("u"):
            assert final == values[0], (key, final)
        else:
            assert final in set(values) | indefinite, (key, final, values[-3:])
