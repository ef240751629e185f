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


# ---------------------------------------------------------------- the store, without processes


def cluster(tmp_path: Path, gpu: str = OLD) -> ClusterConfig:
    (tmp_path / GPU_FILE).write_text(gpu)
    path = tmp_path / "cluster.toml"
    path.write_text(store_cluster_toml(3, 7000, wan=False, gpu_config=GPU_FILE))
    return load_cluster_config(path)


def groups_log(config: str) -> list[bytes]:
    """A log's ops: GROUPS submitted, the first before any configuration (refused)."""
    submits = [ops.submit(name, vc, priority, (Member(pods, 8),))
               for name, vc, priority, pods in GROUPS]
    return [submits[0], ops.reconfigure(config, from_file=True), *submits]


def run_log(store: ClusterStore, log: list[bytes]) -> list[ops.Result]:
    return [ops.decode_result(store.apply(position, Command(client_id=1, seq=position, op=op)))
            for position, op in enumerate(log)]


def test_a_new_cluster_s_store_is_built_from_its_file_and_waits_for_the_log(
    tmp_path: Path,
) -> None:
    config = cluster(tmp_path)
    store = CLUSTER_STATE.build(config)
    assert store.topology.digest == digest_of(OLD) and not store.configured
    assert not start_config_path(config).exists()  # no copy: the log holds it
    results = run_log(store, groups_log(OLD))
    assert results[0] == ops.Error(ops.NOT_CONFIGURED)  # before the log's configuration
    assert results[1] == ops.Reconfigured(digest_of(OLD).hex(), True, {})
    assert all(isinstance(r, Placed) for r in results[2:]) and store.configured


def test_a_replica_replaying_from_slot_0_runs_the_configuration_the_log_began_with() -> None:
    # One replica built from the file as it was, one from the file edited since (a new
    # member, a wiped disk): the same log gives the same state, byte for byte.
    log = [*groups_log(OLD), ops.reconfigure(NEW, from_file=True)]
    stores = [ClusterStore(parse_config(text), configured=False) for text in (OLD, NEW)]
    answers = [run_log(store, log) for store in stores]
    assert answers[0] == answers[1]
    assert stores[0].snapshot() == stores[1].snapshot()
    assert stores[0].topology.digest == digest_of(NEW)


def test_a_file_takes_effect_once_and_never_undoes_what_the_log_ran_since() -> None:
    store = ClusterStore(parse_config(OLD), configured=False)
    run_log(store, groups_log(OLD))
    assert not store.file_is_new(parse_config(OLD))
    assert store.file_is_new(parse_config(NEW))
    first = ops.decode_result(store.apply(10, Command(client_id=2, seq=0, op=ops.reconfigure(
        NEW, from_file=True))))
    assert isinstance(first, ops.Reconfigured) and first.changed
    again = ops.decode_result(store.apply(11, Command(client_id=3, seq=0, op=ops.reconfigure(
        NEW, from_file=True))))  # another replica's proposal of the same edit
    assert again == ops.Reconfigured(digest_of(NEW).hex(), False, {})
    stale = ops.decode_result(store.apply(12, Command(client_id=4, seq=0, op=ops.reconfigure(
        OLD, from_file=True))))  # a replica restarted with the older file
    assert stale == ops.Reconfigured(digest_of(OLD).hex(), False, {})
    assert store.topology.digest == digest_of(NEW)
    # ``ctl config apply`` of the older one: applied, and no file the log ran undoes it
    applied = ops.decode_result(store.apply(13, Command(client_id=5, seq=0, op=ops.reconfigure(
        OLD))))
    assert isinstance(applied, ops.Reconfigured) and applied.changed
    assert not store.file_is_new(parse_config(NEW)) and not store.file_is_new(parse_config(OLD))
    assert store.topology.digest == digest_of(OLD)


def test_the_snapshot_carries_the_log_s_configurations_and_an_earlier_one_reads_as_configured(
) -> None:
    store = ClusterStore(parse_config(NEW), configured=False)
    restored = ClusterStore(parse_config(NEW))
    restored.restore(store.snapshot())
    assert not restored.configured and restored.snapshot() == store.snapshot()
    run_log(store, [*groups_log(OLD), ops.reconfigure(NEW)])
    restored.restore(store.snapshot())
    assert restored.configured and list(restored.configs) == [digest_of(OLD), digest_of(NEW)]
    earlier = msgpack.unpackb(store.snapshot())  # format 3: seven fields, old sessions
    earlier = [3, *earlier[1:6], earlier[6][2] + [[c, f, r] for c, _, f, r, *_ in earlier[6][3]]]
    fresh = ClusterStore(parse_config(OLD), configured=False)
    fresh.restore(msgpack.packb(earlier))
    assert fresh.configured and list(fresh.configs) == [digest_of(NEW)]
    assert fresh.allocator.list_groups("") == store.allocator.list_groups("")


def test_a_data_directory_of_an_earlier_build_runs_its_kept_copy(tmp_path: Path) -> None:
    config = cluster(tmp_path, NEW)
    copy = start_config_path(config)
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(OLD)  # what an earlier build kept: its log holds no first configuration
    store = CLUSTER_STATE.build(config)
    assert store.configured and store.topology.digest == digest_of(OLD)
    assert isinstance(run_log(store, groups_log(OLD)[2:])[0], Placed)
    copy.write_text(INVALID)  # a damaged copy is refused, naming it
    with pytest.raises(ConfigError, match=START_CONFIG_NAME):
        CLUSTER_STATE.build(config)


def test_a_bad_file_starts_from_the_replicas_snapshot_or_not_at_all(tmp_path: Path) -> None:
    config = cluster(tmp_path, INVALID)
    with pytest.raises(ConfigError, match=GPU_FILE):
        CLUSTER_STATE.build(config)  # nothing to start from
    seeded = ClusterStore(parse_config(NEW))
    write_snapshot(config.replica_dir(1) / "snapshots",
                   encode_snapshot(SnapshotMeta(40, (0, 0, 0)), seeded.snapshot()), 40)
    store = CLUSTER_STATE.build(config)  # the snapshot's configuration (restored anyway)
    assert store.topology.digest == digest_of(NEW) and not store.configured


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

    def __init__(self, logged: list[bytes], store: ClusterStore | None = None) -> None:
        self.state_machine = store if store is not None else ClusterStore(parse_config(OLD))
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
    node = _LaggingNode([ops.reconfigure(NEW, from_file=True)] if logged else [])
    (tmp_path / GPU_FILE).write_text(NEW)
    await _propose_file_config(node, tmp_path / GPU_FILE, 0)  # type: ignore[arg-type]
    assert node.state_machine.topology.digest == digest_of(NEW)
    assert [ops.decode_op(c.op) for c in node.proposed] == (
        [] if logged else [ops.Reconfigure(NEW, from_file=True)])


@pytest.mark.parametrize("file", ["older", "applied", "first"])
async def test_who_proposes_the_file_after_a_restart(tmp_path: Path, file: str) -> None:
    # The log ran OLD, then NEW was applied with ``ctl config apply``: a replica restarted
    # with OLD (an older file) or NEW (the one applied) proposes nothing; a new cluster's
    # replica proposes its file as the log's first configuration.
    store = ClusterStore(parse_config(OLD), configured=False)
    if file != "first":
        run_log(store, [*groups_log(OLD), ops.reconfigure(NEW)])
    node = _LaggingNode([], store)
    (tmp_path / GPU_FILE).write_text(NEW if file == "applied" else OLD)
    await _propose_file_config(node, tmp_path / GPU_FILE, 0)  # type: ignore[arg-type]
    assert [ops.decode_op(c.op) for c in node.proposed] == (
        [ops.Reconfigure(OLD, from_file=True)] if file == "first" else [])
    assert store.configured and store.topology.digest == digest_of(
        OLD if file == "first" else NEW)


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


def proposals(logs: list[Path]) -> int:
    """How many times the replicas proposed their GPU configuration file, as they logged it."""
    return sum(log.read_text().count("proposing the GPU configuration file") for log in logs
               if log.exists())


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
        assert not start_config_path(cluster.config).exists()  # the log holds what it began with
        logs = [tmp_path / f"replica-{i}.log" for i in range(3)]
        proposed = proposals(logs)
        assert 2 <= proposed <= 4  # the first configuration once or more, the edit once or more

        cluster.stop_all()  # restarted with the same file: the log ran it, nobody proposes it
        cluster.start_all()
        assert await converged(cluster, NEW_NODES) == agreed
        assert proposals(logs) == proposed

        cluster.stop_all()
        (tmp_path / GPU_FILE).write_text(INVALID)
        cluster.start_all()

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


@pytest.mark.timeout(120)
async def test_a_configuration_applied_with_ctl_survives_restarts(tmp_path: Path) -> None:
    # ``ctl config apply NEW`` while every file still says OLD: the replicas restarted (kill
    # -9 and a clean stop) run NEW, and propose nothing (the log ran OLD).
    with LocalCluster(tmp_path, state_machine=STATE_MACHINE) as cluster:
        (tmp_path / GPU_FILE).write_text(OLD)
        cluster.start_all()
        await converged(cluster, OLD_NODES)
        logs = [tmp_path / f"replica-{i}.log" for i in range(3)]
        async with AllocationStore.connect(cluster.client_addresses, timeout_s=2.0,
                                           attempts=6) as store:
            result = await store.reconfigure(NEW)  # what ctl config apply sends
        assert result.changed
        await converged(cluster, NEW_NODES)
        held = await groups_held(cluster)
        proposed = proposals(logs)
        cluster.kill(0)
        cluster.start(0)
        cluster.stop_all()
        cluster.start_all()
        # (the groups, not the digest: the replicas' log-time commands move the revision and
        # the session table's log time on across the restarts)
        await converged(cluster, NEW_NODES)
        assert await groups_held(cluster) == held
        assert proposals(logs) == proposed


async def groups_held(cluster: LocalCluster) -> list[dict[str, Any]]:
    async with AllocationStore.connect(cluster.client_addresses, timeout_s=2.0,
                                       attempts=6) as store:
        return list(await store.allocations())
