"""End to end through three replica processes (``sdpaxos serve``, fsync on) serving the store,
with gRPC on each replica.

Schedulers at every site — native sessions with their own site's replica, and one over gRPC —
submit and release gangs concurrently on a small cluster, so groups wait and preempt (and keep
what they hold when the load stops, so the final state has something to check); an
operator marks a node bad and healthy again; two independent watchers (gRPC streaming at one
replica, native polling at another) follow every change. At the end: no GPU was ever held by
two live groups (per both watchers' ledgers and every replica's final state), the event
streams rebuild the final state, every replica's snapshot hash is the same, every acknowledged
placement not released since is present with its fencing token, invalid requests are refused
over gRPC and ctl and change nothing, and ``sdpaxos ctl --config`` reads the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from bench.cli import main
from cluster_state.client import AllocationStore, InvalidRequest, new_client_id
from cluster_state.config import synthetic_config
from cluster_state.events import ChangeEvent
from cluster_state.grpc_api import cluster_state_pb2 as pb
from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc
from cluster_state.ledger import GpuLedger, double_allocations
from cluster_state.ops import GroupSpec, Member, Placed, Preempting
from cluster_state.workload import next_job
from consensus.runtime.cluster_ops import check_health
from consensus.runtime.local_cluster import LocalCluster

GPU: dict[str, Any] = dict(nodes=32, nodes_per_rack=4, vcs=3, pinned=1)  # 256 GPUs: it fills up
VCS = ["vc00", "vc01", "vc02"]
SECONDS = 4.0


@dataclass
class History:
    """What the schedulers were told: acknowledged placements, and what they released."""

    acked: dict[str, int] = field(default_factory=dict)  # group -> fencing token
    released: set[str] = field(default_factory=set)
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def spec_of(name: str, rng: random.Random) -> GroupSpec:
    job = next_job(rng, name, VCS, mean_duration_s=0.2)
    return GroupSpec(name=job.name, vc=job.vc, priority=job.priority,
                     members=tuple(Member(p, g) for p, g in job.members))


async def native_scheduler(store: AllocationStore, prefix: str, seed: int, history: History,
                           stop: asyncio.Event) -> None:
    rng = random.Random(seed)
    running: list[str] = []

    async def release(name: str) -> None:
        history.released.add(name)  # from now on its absence is no loss
        with contextlib.suppress(InvalidRequest):  # a preemptor's scheduler was first
            await store.release(name)

    n = 0
    while not stop.is_set():
        n += 1
        spec = spec_of(f"{prefix}-{n}", rng)
        result = await store.submit(spec)
        history.count(type(result).__name__)
        if isinstance(result, Placed):
            history.acked[spec.name] = result.token
            running.append(spec.name)
        elif isinstance(result, Preempting):
            for victim in result.victims:  # as HiveD's scheduler does: stop the victims
                await release(victim)
            running.append(spec.name)
        else:
            await asyncio.sleep(0.02)
        if running and (len(running) > 6 or rng.random() < 0.3):
            await release(running.pop(rng.randrange(len(running))))


async def grpc_scheduler(stub: Any, seed: int, history: History, stop: asyncio.Event) -> None:
    rng = random.Random(seed)
    client_id, seqs = new_client_id(), iter(range(1 << 62))
    running: list[str] = []

    def session() -> pb.Session:
        return pb.Session(client_id=client_id, seq=next(seqs))

    async def release(name: str) -> None:
        history.released.add(name)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.Release(pb.ReleaseRequest(group=name, session=session()), timeout=10)

    n = 0
    while not stop.is_set():
        n += 1
        spec = spec_of(f"grpc-{n}", rng)
        group = pb.GroupSpec(name=spec.name, vc=spec.vc, priority=spec.priority,
                             members=[pb.Member(pods=m.pods, leaves=m.leaves)
                                      for m in spec.members])
        reply = await stub.Submit(pb.SubmitRequest(group=group, session=session()), timeout=10)
        outcome = reply.WhichOneof("outcome")
        history.count(outcome)
        if outcome == "placed":
            history.acked[spec.name] = reply.placed.token
            running.append(spec.name)
        elif outcome == "preempting":
            for victim in reply.preempting.victims:
                await release(victim)
            running.append(spec.name)
        else:
            await asyncio.sleep(0.02)
        if running and (len(running) > 6 or rng.random() < 0.3):
            await release(running.pop(rng.randrange(len(running))))


async def grpc_watcher(stub: Any, seen: list[ChangeEvent]) -> None:
    async for event in stub.Watch(pb.WatchRequest(since=-1)):
        seen.append(ChangeEvent(event.revision, event.kind, event.subject,
                                tuple(json.loads(event.data_json))))


async def native_watcher(store: AllocationStore, seen: list[ChangeEvent]) -> None:
    async for event in store.watch(-1):  # pushed over gRPC (WatchAcked)
        seen.append(event)


async def converged(addresses: list[tuple[str, int]]) -> list[list[dict[str, Any]]]:
    """Every replica's own (stale) view of the allocations, once their snapshot hashes agree."""
    stores = [AllocationStore.connect([address]) for address in addresses]
    try:
        deadline = time.monotonic() + 20
        while True:
            digests = [(await store.digest(stale=True))["sha256"] for store in stores]
            if len(set(digests)) == 1:
                return [await store.allocations(stale=True) for store in stores]
            assert time.monotonic() < deadline, f"replicas differ: {digests}"
            await asyncio.sleep(0.1)
    finally:
        for store in stores:
            await store.close()


def held_gpus(groups: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    return {(str(node), int(device)): g["name"]
            for g in groups if g["state"] == "placed"
            for _, node, devices in g["pods"] for device in devices}


async def drive(cluster: LocalCluster) -> tuple[History, list[dict[str, Any]]]:
    for replica in range(3):
        deadline = time.monotonic() + 60
        while not await check_health(cluster.config, replica, timeout_s=1.0):
            assert time.monotonic() < deadline, cluster.logs()
            await asyncio.sleep(0.2)
    addresses = cluster.client_addresses
    grpc_targets = [f"{a[0]}:{a[1]}" for a in cluster.grpc_addresses if a is not None]
    channels = [grpc.aio.insecure_channel(target) for target in grpc_targets]
    for channel in channels:
        await asyncio.wait_for(channel.channel_ready(), 30)
    stubs = [pb_grpc.AllocationServiceStub(c) for c in channels]  # type: ignore[no-untyped-call]
    history = History()
    stop = asyncio.Event()
    stores = [AllocationStore.connect(addresses, home=site) for site in range(3)]
    watch_store = AllocationStore.connect(addresses, home=1, watch_targets=grpc_targets)
    seen_grpc: list[ChangeEvent] = []
    seen_native: list[ChangeEvent] = []
    watchers = [asyncio.create_task(grpc_watcher(stubs[0], seen_grpc)),
                asyncio.create_task(native_watcher(watch_store, seen_native))]
    schedulers = [
        asyncio.create_task(native_scheduler(stores[site], f"s{site}k{k}", 10 * site + k,
                                             history, stop))
        for site in range(3) for k in range(2)
    ]
    schedulers.append(asyncio.create_task(grpc_scheduler(stubs[2], 99, history, stop)))
    try:
        await asyncio.sleep(SECONDS / 3)
        health = pb.NodeHealthRequest(node="node0005", healthy=False)
        assert (await stubs[1].SetNodeHealth(health, timeout=10)).changed
        await asyncio.sleep(SECONDS / 3)
        health = pb.NodeHealthRequest(node="node0005", healthy=True)
        assert (await stubs[1].SetNodeHealth(health, timeout=10)).changed
        await asyncio.sleep(SECONDS / 3)
        stop.set()
        await asyncio.gather(*schedulers)

        states = await converged(addresses)
        assert all(state == states[0] for state in states)
        final = states[0]
        # both watchers get to the end of the same stream
        deadline = time.monotonic() + 20
        while len(seen_grpc) != len(seen_native) or not seen_grpc:
            assert time.monotonic() < deadline, (len(seen_grpc), len(seen_native))
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        assert seen_grpc == seen_native
        revisions = [e.revision for e in seen_grpc]
        assert revisions == sorted(revisions)

        # no GPU was ever held by two live groups, and the stream rebuilds the final state
        for seen in (seen_grpc, seen_native):
            ledger = GpuLedger()
            for event in seen:
                ledger.apply(event)
            assert ledger.violations == []
            assert ledger.owner == held_gpus(final)
        assert double_allocations(final) == []

        # every acknowledged placement not released since is there, with its token
        present = {g["name"]: g for g in final}
        for name, token in history.acked.items():
            if name not in history.released:
                assert present[name]["token"] == token, name

        # invalid requests are refused over gRPC and change nothing
        before = await stores[0].digest()
        bad = [
            pb.GroupSpec(name="bad", vc="nope", priority=1, members=[pb.Member(pods=1, leaves=1)]),
            pb.GroupSpec(name="bad", vc="vc00", priority=1001,
                         members=[pb.Member(pods=1, leaves=1)]),
            pb.GroupSpec(name="bad", vc="vc00", priority=-1, pinned="vc00-PIN",
                         members=[pb.Member(pods=1, leaves=8)]),
            pb.GroupSpec(name="bad", vc="vc00", priority=1, members=[pb.Member(pods=1, leaves=9)]),
        ]
        for group in bad:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stubs[0].Submit(pb.SubmitRequest(group=group), timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        mismatched = pb.BindRequest(
            group=pb.GroupSpec(name="bad", vc="vc00", priority=1,
                               members=[pb.Member(pods=2, leaves=8)]),
            pods=[pb.PodPlacement(node="node0000", devices=list(range(8)))], revision=0)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stubs[1].Bind(mismatched, timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "placement lists 1 pods" in (caught.value.details() or "")
        assert await stores[0].digest() == before
        return history, final
    finally:
        stop.set()
        for task in [*schedulers, *watchers]:
            task.cancel()
        # Bounded, so that a task ignoring its cancel fails the test instead of hanging it
        # (the client's calls once lost a cancel that came with their reply: one run in seven).
        done, pending = await asyncio.wait([*schedulers, *watchers], timeout=30)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: what mattered was checked above
        for store in [*stores, watch_store]:
            await store.close()
        for channel in channels:
            await channel.close()
        if pending:
            stacks = [" <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in task.get_stack())
                      for task in pending]
            pytest.fail(f"still running 30 s after cancel: {stacks}")


@pytest.mark.timeout(150)
def test_concurrent_schedulers_at_every_site_through_replica_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "gpu.yaml").write_text(synthetic_config(**GPU).to_yaml())
    with LocalCluster(tmp_path, 3, state_machine='kind = "cluster_state"\ngpu_config = "gpu.yaml"',
                      grpc=True) as cluster:
        cluster.start_all()
        history, final = asyncio.run(asyncio.wait_for(drive(cluster), 120))
        # the load was real: groups were placed, and some had to wait or preempt
        assert history.outcomes.get("Placed", 0) + history.outcomes.get("placed", 0) > 50
        assert len(final) >= 5
        assert sum(n for kind, n in history.outcomes.items()
                   if kind.lower() in ("waiting", "preempting")) > 0, history.outcomes

        config = str(cluster.config_path)
        assert main(["ctl", "--config", config, "--json", "status"]) == 0
        # the typed reply, pods by name, as the store lists them
        assert json.loads(capsys.readouterr().out) == [
            {**g, "pods": [{"leaves": p.leaves, "node": p.node, "devices": list(p.devices)}
                           for p in g["pods"]]} for g in final]
        for words, message in (
            (["--vc", "nope", "--pods", "1x1"], "unknown virtual cluster"),
            (["--vc", "vc00", "--priority", "-1", "--pinned", "vc00-PIN", "--pods", "1x8"],
             "pinned"),
        ):
            assert main(["ctl", "--config", config, "submit", "bad", *words]) == 1
            err = capsys.readouterr().err
            assert "INVALID_ARGUMENT" in err and message in err, err
        assert main(["ctl", "--config", config, "--json", "status"]) == 0
        assert len(json.loads(capsys.readouterr().out)) == len(final)


@pytest.mark.timeout(120)
def test_the_end_to_end_benchmark_runs_and_checks_its_end_state() -> None:
    from bench.alloc_e2e import measure

    report = measure(3, 1.5, 8, nodes=64, vcs=4)
    assert report["ok"] and report["replicas_identical"] and report["groups_left"] == 0
    assert report["placed"] > 0 and report["allocations_per_s"] > 0
    assert report["fsync"] and report["gpus"] == 512
    # what the load cost each process, whatever else the machine ran
    cpu = report["cpu_ms_per_allocation"]
    assert sorted(cpu) == ["loadgen", "replica0", "replica1", "replica2"]
    assert all(ms > 0 for ms in cpu.values()), cpu


@pytest.mark.timeout(180)
def test_the_watch_benchmark_measures_shared_streams_and_checks_every_watcher() -> None:
    from bench.watch_fanout import measure

    report = measure(3, watchers=12, processes=2, rate=20.0, seconds=1.5, nodes=64, vcs=4)
    assert report["ok"], report["checks"]
    assert report["placed"] > 0 and report["skipped"] == 0
    # every watcher took every event of the window (the counts are equal: checked)
    assert report["delivered_events"] > 0
    assert report["server_cpu_us_per_delivered_event"] > 0
    assert report["watcher_cpu_us_per_delivered_event"] > 0
    assert report["delay"]["count"] > 0 and report["delay"]["p99_ms"] >= report["delay"]["p50_ms"]
    # six watchers a process, two on each replica: one stream to each replica, shared
    assert report["streams_per_process"] == [3, 3]
