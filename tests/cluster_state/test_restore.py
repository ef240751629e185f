"""Restoring a GPU store never drops work silently (issue 34 point 4): ``snapshot restore``
seeds the backup's own kind and configuration by default; another configuration goes through
the report ``ctl config apply`` gives and is refused when it drops, trims or downgrades a
group unless ``--allow-drop``; ``snapshot status`` says what a backup holds; a failed restore
writes nothing."""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

import msgpack
import pytest
import yaml

from bench.cli import main
from cluster_state import ops
from cluster_state.client import Allocations, AllocationStore
from cluster_state.config import load_config, synthetic_config
from cluster_state.ops import GroupSpec, Member, Placed
from cluster_state.store import ClusterStore
from consensus.messages import Command
from consensus.protocol.types import SnapshotMeta
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.exit_codes import OK, REFUSED, USAGE
from consensus.runtime.local_cluster import free_base_port
from consensus.statemachine import KVStore
from consensus.storage.backup import encode_backup
from consensus.storage.snapshot import encode_snapshot, latest_snapshot

#: the backed-up cluster's configuration: two racks of eight 8-GPU nodes, two VCs
CONFIG = synthetic_config(nodes=16, vcs=2, pinned=0)
#: the groups of the backup and the nodes they were placed on (``_store``)
JOB1_NODES = ("node0000",)
JOB2_NODES = ("node0001", "node0002", "node0003", "node0004")


def _store() -> ClusterStore:
    store = ClusterStore(CONFIG)
    for seq, (name, vc, pods) in enumerate([("job1", "vc00", 1), ("job2", "vc01", 4)]):
        result = ops.decode_result(store.apply(seq + 1, Command(
            client_id=1, seq=seq, op=ops.submit(name, vc, 10, [(pods, 8)]), keys=(),
            blind=False)))
        assert isinstance(result, ops.Placed)
    assert store.allocator.group_info("job1")["pods"][0][1] == JOB1_NODES[0]
    return store


def _backup(path: Path, state: bytes, kind: str = "cluster_state") -> Path:
    snapshot = encode_snapshot(SnapshotMeta(7, (3, 2, 2)), state)
    path.write_bytes(encode_backup(cluster_id="prod", state_machine=kind, replicas=3,
                                   taken_at="2026-11-28T00:00:00+00:00", snapshot=snapshot))
    return path


def _yaml_without(nodes: tuple[str, ...]) -> str:
    """The backup's configuration with ``nodes`` renamed: their GPUs are gone."""
    text = CONFIG.to_yaml()
    for node in nodes:
        assert node in text
        text = text.replace(node, node.replace("node", "spare"))
    return text


def _seeded(directory: Path) -> ClusterStore:
    """The store every replica of the restored cluster starts from (they are identical)."""
    config = load_cluster_config(directory / "cluster.toml")
    states = set()
    for spec in config.replicas:
        found = latest_snapshot(config.replica_dir(spec.id) / "snapshots")
        assert found is not None
        states.add(found[2])
    assert len(states) == 1
    store = ClusterStore(synthetic_config(nodes=8, vcs=1, pinned=0))
    store.restore(states.pop())
    return store


def test_restore_seeds_the_backups_own_configuration_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _store()
    backup = _backup(tmp_path / "b.snap", store.snapshot())
    target = tmp_path / "restored"
    # was: "pass that kind's init options", exit 1, and cluster.toml and IDENTITY left behind
    assert main(["snapshot", "restore", str(backup), "--dir", str(target), "--no-wan"]) == OK
    out = capsys.readouterr().out
    assert f"wrote {target / 'gpu.yaml'} (the backup's GPU configuration" in out
    raw = tomllib.loads((target / "cluster.toml").read_text())
    assert raw["state_machine"] == {"kind": "cluster_state", "gpu_config": "gpu.yaml"}
    assert all("grpc_address" in replica for replica in raw["replica"])
    seeded = _seeded(target)
    assert seeded.snapshot() == store.snapshot()
    assert sorted(seeded.allocator.groups) == ["job1", "job2"]
    assert load_cluster_config(target / "cluster.toml").state_machine == "cluster_state"
    assert (target / "gpu.yaml").read_text() == CONFIG.to_yaml()


def test_a_configuration_that_drops_work_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backup = _backup(tmp_path / "b.snap", _store().snapshot())
    other = tmp_path / "other.yaml"
    other.write_text(_yaml_without(JOB1_NODES + JOB2_NODES[-1:]))
    target = tmp_path / "restored"
    # was: exit 0, and the restored cluster came up with "groups: {'job1': 'dropped'}" logged
    assert main(["snapshot", "restore", str(backup), "--dir", str(target),
                 "--gpu-config", str(other)]) == REFUSED
    captured = capsys.readouterr()
    assert "job1: dropped" in captured.out and "job2: trimmed" in captured.out
    assert "refused" in captured.err and "--allow-drop" in captured.err
    assert "job1: dropped" in captured.err and "job2: trimmed" in captured.err
    assert set(tmp_path.iterdir()) == {backup, other}


def test_a_configuration_without_a_groups_virtual_cluster_is_refused_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A group whose VC is gone keeps its GPUs but not its guarantee (downgraded to
    opportunistic: preemptible): that is lost work too."""
    backup = _backup(tmp_path / "b.snap", _store().snapshot())
    narrow = CONFIG.to_dict()
    del narrow["virtualClusters"]["vc01"]
    other = tmp_path / "narrow.yaml"
    other.write_text(yaml.safe_dump(narrow))
    assert main(["snapshot", "restore", str(backup), "--dir", str(tmp_path / "r"),
                 "--gpu-config", str(other)]) == REFUSED
    assert "job2: downgraded (virtual cluster vc01 is gone)" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_allow_drop_restores_onto_the_given_configuration_and_says_what_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backup = _backup(tmp_path / "b.snap", _store().snapshot())
    other = tmp_path / "other.yaml"
    other.write_text(_yaml_without(JOB1_NODES))
    target = tmp_path / "restored"
    assert main(["snapshot", "restore", str(backup), "--dir", str(target), "--gpu-config",
                 str(other), "--allow-drop"]) == OK
    out = capsys.readouterr().out
    assert "--allow-drop: 1 group(s) lose GPUs or guarantees:\n  job1: dropped" in out
    seeded = _seeded(target)
    assert sorted(seeded.allocator.groups) == ["job2"]
    # the new cluster begins with the given configuration: its replicas propose nothing
    assert not seeded.needs_reconfiguration(load_config(other))


def test_the_same_configuration_given_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _store()
    backup = _backup(tmp_path / "b.snap", store.snapshot())
    same = tmp_path / "same.yaml"
    same.write_text(CONFIG.to_yaml())
    assert main(["snapshot", "restore", str(backup), "--dir", str(tmp_path / "r"),
                 "--gpu-config", str(same)]) == OK
    assert "moved to the configuration given" not in capsys.readouterr().out
    assert _seeded(tmp_path / "r").snapshot() == store.snapshot()


def test_options_of_another_kind_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backup = _backup(tmp_path / "b.snap", KVStore().snapshot(), kind="kv")
    assert main(["snapshot", "restore", str(backup), "--dir", str(tmp_path / "r"),
                 "--gpu-store"]) == USAGE
    assert "holds a 'kv' state machine" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_restore_failing_while_it_writes_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    backup = _backup(tmp_path / "b.snap", _store().snapshot())

    def full_disk(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("consensus.runtime.backup.write_snapshot", full_disk)
    assert main(["snapshot", "restore", str(backup), "--dir", str(tmp_path / "r")]) == REFUSED
    assert "No space left on device" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.snap"]
    monkeypatch.undo()
    assert main(["snapshot", "restore", str(backup), "--dir", str(tmp_path / "r")]) == OK


def test_snapshot_status_says_what_a_backup_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _store()
    backup = _backup(tmp_path / "b.snap", store.snapshot())
    assert main(["snapshot", "status", str(backup), "--json"]) == OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["position"] == 7 and doc["kind"] == "cluster_state"
    assert doc["cluster_id"] == "prod" and doc["replicas"] == 3 and len(doc["sha256"]) == 64
    assert doc["size"] == len(encode_snapshot(SnapshotMeta(7, (3, 2, 2)), store.snapshot()))
    assert doc["configuration"].startswith(store.topology.digest.hex()[:12])
    assert "16 nodes, 128 GPUs, virtual clusters vc00, vc01" in doc["configuration"]
    assert (doc["groups"], doc["GPUs in use"], doc["revision"]) == (2, 40, 2)
    assert main(["snapshot", "status", str(backup)]) == OK
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[:2] == ["position", "7"] for line in lines)
    kv = KVStore()
    kv.apply(0, Command(client_id=1, seq=0, op=msgpack.packb(["put", "k", "v"]), keys=("k",),
                        blind=False))
    assert main(["snapshot", "status", str(_backup(tmp_path / "kv.snap", kv.snapshot(), "kv")),
                 "--json"]) == OK
    assert json.loads(capsys.readouterr().out)["keys"] == 1
    (tmp_path / "bad.snap").write_bytes(backup.read_bytes()[:-1])
    assert main(["snapshot", "status", str(tmp_path / "bad.snap")]) == REFUSED
    assert "truncated" in capsys.readouterr().err


def test_a_restored_gpu_cluster_serves_every_allocation_of_the_backup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real processes: save a live GPU cluster, restore it with no options, serve it."""
    source, restored, backup = tmp_path / "s", tmp_path / "r", tmp_path / "b.snap"
    assert main(["cluster", "init", "--dir", str(source), "--no-wan", "--gpu-store",
                 "--base-port", str(free_base_port())]) == OK
    assert main(["cluster", "up", "--dir", str(source)]) == OK
    try:
        config = str(source / "cluster.toml")
        for name, vc in (("job1", "vc00"), ("job2", "vc01")):
            assert main(["ctl", "--config", config, "submit", name, "--vc", vc,
                         "--pods", "2x8"]) == OK
        assert main(["snapshot", "save", str(backup), "--config", config]) == OK
        before = asyncio.run(listing([s.client_address for s in
                                      load_cluster_config(source / "cluster.toml").replicas]))
    finally:
        assert main(["cluster", "down", "--dir", str(source)]) == OK
    capsys.readouterr()
    assert main(["snapshot", "restore", str(backup), "--dir", str(restored), "--no-wan",
                 "--base-port", str(free_base_port())]) == OK
    assert main(["cluster", "up", "--dir", str(restored)]) == OK
    try:
        addresses = [s.client_address for s in
                     load_cluster_config(restored / "cluster.toml").replicas]

        async def groups() -> list[str]:
            async with AllocationStore.connect(addresses) as store:
                return sorted(g["name"] for g in await store.allocations())

        assert asyncio.run(groups()) == ["job1", "job2"]
        # the new log goes on from the backup's position: a new group's fencing token is
        # above every token the backup's groups hold (seeded at slot 0, it was not)
        async def submit_another() -> int:
            async with AllocationStore.connect(addresses) as store:
                placed = await store.submit(GroupSpec(name="job3", vc="vc00", priority=100,
                                                      members=(Member(1, 8),)))
                assert isinstance(placed, Placed)
                return placed.token

        assert submit_another_token_above(asyncio.run(submit_another()), before)
    finally:
        assert main(["cluster", "down", "--dir", str(restored)]) == OK


async def listing(addresses: list[tuple[str, int]]) -> Allocations:
    async with AllocationStore.connect(addresses) as store:
        return await store.allocations()


def submit_another_token_above(token: int, before: Allocations) -> bool:
    held = [group["token"] for group in before]
    return bool(held) and token > max(held) and token > before.revision
