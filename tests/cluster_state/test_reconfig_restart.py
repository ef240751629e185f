"""A GPU configuration file edited while the replicas were down (issue 24 point 1, the serve
path in ``cluster_state.plugin``): the replicas build their store from the configuration the
log began with (a copy kept in the data directory at the first start), then propose the
edited file through the log, so they all converge on it with the running groups kept,
trimmed or downgraded as the dry run said, and a replica that executes its log again from
slot 0 ends identical to the others. An invalid edit is logged and changes nothing.

The first tests drive ``ClusterStateKind.build`` directly (no processes); the others run
three ``sdpaxos serve`` processes on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml

from cluster_state import ops
from cluster_state.cells import Topology
from cluster_state.client import AllocationStore, new_client_id
from cluster_state.config import parse_config, synthetic_config
from cluster_state.events import ChangeEvent
from cluster_state.ops import GroupSpec, Member, Placed
from cluster_state.plugin import (
    CLUSTER_STATE,
    START_CONFIG_NAME,
    _propose_file_config,
    start_config_path,
    store_cluster_toml,
)
from cluster_state.store import ClusterStore
from consensus.errors import ConfigError, SDPaxosError
from consensus.messages import Command
from consensus.protocol.types import SnapshotMeta
from consensus.runtime.client import Client
from consensus.runtime.cluster_config import ClusterConfig, load_cluster_config
from consensus.runtime.local_cluster import LocalCluster
from consensus.runtime.node import Result
from consensus.storage.snapshot import encode_snapshot, write_snapshot

GPU_FILE = "gpu.yaml"
STATE_MACHINE = f'kind = "cluster_state"\ngpu_config = "{GPU_FILE}"'
#: 8 nodes of 8 GPUs in two racks, VCs vc00 and vc01 of 3 nodes and two 4-GPU cells each
OLD = synthetic_config(nodes=8, nodes_per_rack=4, vcs=2).to_yaml()
OLD_NODES = 8
#: the groups placed before the edit: (name, VC, priority, pods of 8 GPUs)
GROUPS = [("big", "vc01", 10, 3), ("spare", "vc00", -1, 4), ("small", "vc00", 5, 1)]
#: no snapshot while a test runs (only a clean stop takes one)
NO_SNAPSHOTS = ("--snapshot-every", "1000000")
CONVERGE_S = 30.0
INVALID = "virtualClusters: {}\n"


def edited() -> str:
    """OLD without node0007 (its rack keeps three nodes) and with vc01 down to one node."""
    raw = yaml.safe_load(OLD)
    raw["physicalCluster"]["physicalCells"][1]["cellChildren"].pop()
    raw["virtualClusters"]["vc01"]["virtualCells"][0]["cellNumber"] = 1
    return str(yaml.safe_dump(raw))


NEW = edited()
NEW_NODES = OLD_NODES - 1


def digest_of(text: str) -> bytes:
    return Topology(parse_config(text)).digest


# ---------------------------------------------------------------- the copy, without processes


def cluster(tmp_path: Path, gpu: str = OLD) -> ClusterConfig:
    (tmp_path / GPU_FILE).write_text(gpu)
    path = tmp_path / "cluster.toml"
    path.write_text(store_cluster_toml(3, 7000, wan=False, gpu_config=GPU_FILE))
    return load_cluster_config(path)


def test_the_store_is_built_from_the_configuration_the_log_began_with(tmp_path: Path) -> None:
    config = cluster(tmp_path)
    assert CLUSTER_STATE.build(config).topology.digest == digest_of(OLD)
    copy = start_config_path(config)
    assert copy == config.data_dir / START_CONFIG_NAME and copy.read_text() == OLD
    assert not list(copy.parent.glob("*.tmp"))
    (tmp_path / GPU_FILE).write_text(NEW)  # edited: the log still began with OLD
    assert CLUSTER_STATE.build(config).topology.digest == digest_of(OLD)
    (tmp_path / GPU_FILE).write_text(INVALID)  # not even read once the copy exists
    assert CLUSTER_STATE.build(config).topology.digest == digest_of(OLD)
    assert copy.read_text() == OLD
    copy.write_text(INVALID)  # a damaged copy is refused, naming it
    with pytest.raises(ConfigError, match=START_CONFIG_NAME):
        CLUSTER_STATE.build(config)


def test_a_first_start_with_a_bad_file_keeps_no_copy(tmp_path: Path) -> None:
    config = cluster(tmp_path, INVALID)
    with pytest.raises(ConfigError, match=GPU_FILE):
        CLUSTER_STATE.build(config)
    assert not start_config_path(config).exists()
    assert not list(config.data_dir.glob("*.tmp"))


def test_a_data_directory_seeded_from_a_snapshot_began_with_its_configuration(
    tmp_path: Path,
) -> None:
    # A replica directory holding a snapshot but no copy (data from before the copy was kept,
    # or a snapshot put there by hand): its log begins at the snapshot, under the snapshot's
    # configuration, not the file's.
    config = cluster(tmp_path, OLD)
    seeded = ClusterStore(parse_config(NEW))
    write_snapshot(config.replica_dir(1) / "snapshots",
                   encode_snapshot(SnapshotMeta(40, (0, 0, 0)), seeded.snapshot()), 40)
    older = ClusterStore(parse_config(OLD))  # an older snapshot elsewhere: where logs begin
    write_snapshot(config.replica_dir(2) / "snapshots",
                   encode_snapshot(SnapshotMeta(50, (0, 0, 0)), older.snapshot()), 50)
    assert CLUSTER_STATE.build(config).topology.digest == digest_of(NEW)
    assert digest_of(start_config_path(config).read_text()) == digest_of(NEW)


def test_a_first_start_builds_the_store_once(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # A 100k-GPU store takes a second to build: the first start keeps the copy and serves
    # the store it built on the file, rather than building another on the copy.
    import cluster_state.store as store_module

    built: list[Topology] = []

    class CountingAllocator(store_module.Allocator):
        def __init__(self, topo: Topology) -> None:
            built.append(topo)
            super().__init__(topo)

    monkeypatch.setattr(store_module, "Allocator", CountingAllocator)
    config = cluster(tmp_path)
    first = CLUSTER_STATE.build(config)
    assert start_config_path(config).read_text() == OLD
    assert len(built) == 1 and first.topology.digest == digest_of(OLD)
    built.clear()
    CLUSTER_STATE.build(config)  # a restart: from the copy, once
    assert len(built) == 1


def test_proposing_the_configuration_the_store_runs_changes_no_allocation() -> None:
    # Every restarted replica proposes the edited file: all but the first find it applied.
    store = ClusterStore(parse_config(OLD))
    for position, (name, vc, priority, pods) in enumerate(GROUPS):
        store.apply(position, Command(client_id=1, seq=position, op=ops.submit(
            name, vc, priority, (Member(pods, 8),))))
    first = ops.decode_result(store.apply(10, Command(client_id=2, seq=0,
                                                      op=ops.reconfigure(NEW))))
    assert isinstance(first, ops.Reconfigured) and first.changed
    groups, summary = store.allocator.list_groups(""), store.allocator.summary()
    events = store.events_since(-1)
    for position, client in ((11, 3), (12, 4)):  # the other two replicas' proposals
        again = ops.decode_result(store.apply(position, Command(client_id=client, seq=0,
                                                                op=ops.reconfigure(NEW))))
        assert again == ops.Reconfigured(digest_of(NEW).hex(), False, {})
    assert store.allocator.list_groups("") == groups
    assert store.allocator.summary() == summary
    assert store.events_since(-1) == events  # no event: watchers see nothing
    assert store.revision == 12  # only the session's answer is remembered, as for any update


class _LaggingNode:
    """A stand-in for a restarted replica's node: its store runs OLD while its log already
    holds the edit (``logged``), which the store applies once a linearizable read is ordered
    after it, as a real replica executing its records does; proposals are recorded."""

    def __init__(self, logged: list[bytes]) -> None:
        self.state_machine = ClusterStore(parse_config(OLD))
        self.logged = logged
        self.proposed: list[Command] = []
        self.position = 0

    def _apply(self, command: Command) -> bytes:
        self.position += 1
        return self.state_machine.apply(self.position, command)

    async def read(self, command: Command, *, stale: bool = False,
                   principal: object = None) -> bytes:
        if not stale:  # ordered after what the log holds: executed first
            while self.logged:
                self._apply(Command(client_id=9, seq=self.position, op=self.logged.pop(0)))
        return self.state_machine.query(command.op)

    async def submit(self, command: Command, *, principal: object = None) -> Result:
        self.proposed.append(command)
        return Result(self._apply(command), self.position)


@pytest.mark.parametrize("logged", [True, False])
async def test_a_restarted_replica_proposes_the_file_only_if_its_log_lacks_it(
    tmp_path: Path, logged: bool
) -> None:
    # A replica restarted with the edited file, its log holding the edit but its store not
    # yet (still executing its records): it reads through the log first, finds the edit
    # applied and proposes nothing (a repeat changes no GPU but its session entry changes
    # the replicated state). Without the edit in its log it proposes the file once.
    node = _LaggingNode([ops.reconfigure(NEW)] if logged else [])
    (tmp_path / GPU_FILE).write_text(NEW)
    await _propose_file_config(node, tmp_path / GPU_FILE, 0)  # type: ignore[arg-type]
    assert node.state_machine.topology.digest == digest_of(NEW)
    assert [type(ops.decode_op(c.op)) for c in node.proposed] == (
        [] if logged else [ops.Reconfigure])


# ---------------------------------------------------------------- real processes


async def poll(check: Callable[[], Awaitable[bool]], what: str, cluster: LocalCluster,
               timeout_s: float = CONVERGE_S) -> None:
    """Return once ``check()`` holds (a replica that does not answer yet is a no); fail
    naming ``what`` with the replicas' logs after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if await check():
                return
        except (SDPaxosError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}:\n{cluster.logs()}")
        await asyncio.sleep(0.05)


def replicas(cluster: LocalCluster) -> list[AllocationStore]:
    """A session with each replica (stale reads answer its own state)."""
    return [AllocationStore.connect(cluster.client_addresses, home=i, timeout_s=1.0, attempts=1)
            for i in range(len(cluster.client_addresses))]


async def converged(cluster: LocalCluster, nodes: int) -> dict[str, Any]:
    """Wait until every replica runs a configuration of ``nodes`` nodes and holds the same
    state (the same snapshot hash); that hash."""
    stores = replicas(cluster)
    agreed: dict[str, Any] = {}

    async def same() -> bool:
        summaries = [await s.summary(stale=True) for s in stores]
        digests = [await s.digest(stale=True) for s in stores]
        agreed.update(digests[0])
        return all(x["nodes"] == nodes for x in summaries) and all(
            d == digests[0] for d in digests)

    try:
        await poll(same, f"replicas converged on {nodes} nodes", cluster)
    finally:
        for s in stores:
            await s.close()
    return agreed


async def place_groups(cluster: LocalCluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """Place GROUPS, wait until every replica holds them; (groups by name, the dry run of
    the edit: what it will do to each group)."""
    await converged(cluster, OLD_NODES)  # serving
    async with AllocationStore.connect(cluster.client_addresses, timeout_s=2.0,
                                       attempts=6) as store:
        for name, vc, priority, pods in GROUPS:
            result = await store.submit(GroupSpec(name=name, vc=vc, priority=priority,
                                                  members=(Member(pods, 8),)))
            assert isinstance(result, Placed), result
        groups = {g["name"]: g for g in await store.allocations()}
        plan = await store.plan_reconfiguration(NEW)
    await converged(cluster, OLD_NODES)
    return groups, plan


async def check_the_edit_applied(cluster: LocalCluster, before: dict[str, Any],
                                 plan: dict[str, Any]) -> dict[str, Any]:
    """Every replica runs NEW, once (each proposed it: the repeats changed nothing), with the
    groups as the dry run said; the replicas' common snapshot hash."""
    agreed = await converged(cluster, NEW_NODES)
    async with AllocationStore.connect(cluster.client_addresses, timeout_s=2.0,
                                       attempts=6) as store:
        events = await all_events(cluster)
        after = {g["name"]: g for g in await store.allocations()}
    applied = [e for e in events if e.kind == "reconfigured"]
    assert [e.data for e in applied] == [(digest_of(NEW).hex(),)], applied
    revision = applied[0].revision
    outcomes = {e.subject: e.kind for e in events
                if e.revision == revision and e.kind != "reconfigured"}
    planned = {name: info["outcome"] for name, info in plan["groups"].items()}
    assert plan["changed"] and plan["nodes_removed"] == ["node0007"]
    assert outcomes == {name: o for name, o in planned.items() if o != "kept"}
    assert {"trimmed", "downgraded"} <= set(outcomes.values())  # the edit does both
    assert set(after) == {name for name, o in planned.items() if o != "dropped"}
    for name, group in after.items():
        if planned[name] == "kept":
            assert group == before[name]
        else:  # the same GPUs, without node0007's
            pods = [p for p in before[name]["pods"] if p[1] != "node0007"]
            assert [p for p in group["pods"] if p[0]] == pods, (name, group)
    return agreed


async def all_events(cluster: LocalCluster) -> list[ChangeEvent]:
    """Every change event so far (one page of the log: a few dozen here), read
    linearizably."""
    client = Client(new_client_id(), cluster.client_addresses, timeout_s=2.0, attempts=6)
    try:
        answer = msgpack.unpackb((await client.read(ops.get_events(-1))).payload)
    finally:
        await client.close()
    assert answer[0] == "events", answer
    return [ChangeEvent.from_wire(wire) for wire in answer[2]]


def no_snapshots(cluster: LocalCluster, replica: int) -> bool:
    return not list((cluster.config.replica_dir(replica) / "snapshots").glob("snapshot-*"))


@pytest.mark.timeout(120)
async def test_an_edited_file_is_applied_at_restart_and_an_invalid_one_is_not(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path, state_machine=STATE_MACHINE) as cluster:
        (tmp_path / GPU_FILE).write_text(OLD)
        cluster.start_all()
        before, plan = await place_groups(cluster)
        cluster.stop_all()  # a clean stop: each replica takes a snapshot (under OLD)
        assert not any(no_snapshots(cluster, i) for i in range(3))
        (tmp_path / GPU_FILE).write_text(NEW)
        cluster.start_all()
        agreed = await check_the_edit_applied(cluster, before, plan)
        assert start_config_path(cluster.config).read_text() == OLD  # what the log began with

        cluster.stop_all()
        (tmp_path / GPU_FILE).write_text(INVALID)
        cluster.start_all()
        logs = [tmp_path / f"replica-{i}.log" for i in range(3)]

        async def refused() -> bool:
            return all("is not applied, still serving configuration "
                       f"{digest_of(NEW).hex()[:12]}" in log.read_text() for log in logs)

        await poll(refused, "every replica logged the invalid file", cluster)
        assert await converged(cluster, NEW_NODES) == agreed  # nothing changed
        async with AllocationStore.connect(cluster.client_addresses, timeout_s=2.0,
                                           attempts=6) as store:  # and it serves
            await store.release("small")
            assert await store.status("small") is None
        assert all(process.poll() is None for process in cluster.processes.values())


@pytest.mark.timeout(120)
async def test_a_replica_executing_its_log_from_the_start_ends_identical(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path, state_machine=STATE_MACHINE, extra_args=NO_SNAPSHOTS) as cluster:
        (tmp_path / GPU_FILE).write_text(OLD)
        cluster.start_all()
        before, plan = await place_groups(cluster)
        for i in range(3):
            cluster.kill(i)  # kill -9: no snapshot, the logs begin at slot 0
        assert all(no_snapshots(cluster, i) for i in range(3))
        (tmp_path / GPU_FILE).write_text(NEW)
        cluster.start_all()  # each executes its log from slot 0 under OLD, then proposes NEW
        agreed = await check_the_edit_applied(cluster, before, plan)

        cluster.kill(2)
        assert no_snapshots(cluster, 2)
        cluster.start(2)  # from slot 0 again: OLD, the groups, then the logged NEW
        assert await converged(cluster, NEW_NODES) == agreed
        log = (tmp_path / "replica-2.log").read_text()
        assert log.count("commands again from its records") == 2, cluster.logs()
