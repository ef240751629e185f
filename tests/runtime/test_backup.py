"""Backup and restore (issue 21 point 3): ``sdpaxos snapshot save`` takes a consistent snapshot
of a live cluster with its log position and a checksum; ``sdpaxos snapshot restore`` seeds a
new cluster (a new cluster id) from it; a damaged file is refused and changes nothing."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path

import msgpack
import pytest

from bench.cli import main
from consensus.errors import DecodeError
from consensus.protocol.types import SnapshotMeta
from consensus.runtime.client import Client
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.statemachine import KVStore, kv_get, kv_put
from consensus.storage.backup import decode_backup, encode_backup
from consensus.storage.snapshot import encode_snapshot

KEYS = 60


def _backup_bytes(state: bytes = b"state") -> bytes:
    snapshot = encode_snapshot(SnapshotMeta(42, (20, 22, 0)), state)
    return encode_backup(cluster_id="c1", state_machine="kv", replicas=3,
                         taken_at="2026-11-26T00:00:00+00:00", snapshot=snapshot)


def test_a_backup_round_trips_with_its_position_and_checksum() -> None:
    header, meta, state = decode_backup(_backup_bytes())
    assert (header.cluster_id, header.state_machine, header.replicas) == ("c1", "kv", 3)
    assert header.slot == meta.slot == 42 and meta.exec_counts == (20, 22, 0)
    assert state == b"state" and len(header.sha256) == 64


@pytest.mark.parametrize("damage", ["magic", "header", "snapshot", "truncated", "padded"])
def test_every_damaged_backup_is_refused(damage: str) -> None:
    data = bytearray(_backup_bytes(b"x" * 100))
    if damage == "magic":
        data[0] ^= 0xFF
    elif damage == "header":
        data[20] ^= 0xFF
    elif damage == "snapshot":
        data[-10] ^= 0xFF
    elif damage == "truncated":
        del data[-1]
    else:
        data += b"\0"
    with pytest.raises(DecodeError):
        decode_backup(bytes(data))


def test_restore_refuses_a_damaged_file_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.bak"
    bad.write_bytes(_backup_bytes()[:-3])
    target = tmp_path / "new"
    assert main(["snapshot", "restore", str(bad), "--dir", str(target)]) == 1
    assert "truncated" in capsys.readouterr().err
    assert not target.exists()


def test_restore_refuses_the_old_cluster_id_and_a_directory_with_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backup = tmp_path / "b.bak"
    backup.write_bytes(_backup_bytes(KVStore().snapshot()))
    assert main(["snapshot", "restore", str(backup), "--dir", str(tmp_path / "x"),
                 "--cluster-id", "c1"]) == 2
    assert "id of its own" in capsys.readouterr().err
    (tmp_path / "y" / "data" / "replica-0").mkdir(parents=True)
    assert main(["snapshot", "restore", str(backup), "--dir", str(tmp_path / "y")]) == 1
    assert "already holds a cluster" in capsys.readouterr().err
    assert not (tmp_path / "y" / "cluster.toml").exists()


async def _client(directory: Path, client_id: int) -> Client:
    config = load_cluster_config(directory / "cluster.toml")
    return Client(client_id, [spec.client_address for spec in config.replicas], timeout_s=5.0)


async def _write(directory: Path, client_id: int) -> None:
    client = await _client(directory, client_id)
    try:
        for i in range(KEYS):
            await client.execute(kv_put(f"k{i}", f"v{i}"), (f"k{i}",))
    finally:
        await client.close()


async def _read_all(directory: Path) -> dict[str, bytes]:
    client = await _client(directory, 8)
    try:
        return {f"k{i}": (await client.read(kv_get(f"k{i}"), (f"k{i}",))).payload
                for i in range(KEYS)}  # type: ignore[misc]
    finally:
        await client.close()


def test_a_restored_cluster_serves_the_backed_up_state_under_a_new_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, restored, backup = tmp_path / "source", tmp_path / "restored", tmp_path / "s.bak"
    assert main(["cluster", "init", "--dir", str(source), "--no-wan",
                 "--base-port", str(free_base_port())]) == 0
    assert main(["cluster", "up", "--dir", str(source)]) == 0
    try:
        asyncio.run(_write(source, 7))  # every write acknowledged before the backup is asked for
        expected = asyncio.run(_read_all(source))
        assert main(["snapshot", "save", str(backup), "--config",
                     str(source / "cluster.toml")]) == 0
    finally:
        assert main(["cluster", "down", "--dir", str(source)]) == 0
    assert {key: msgpack.unpackb(value) for key, value in expected.items()} == {
        f"k{i}": ["value", f"v{i}"] for i in range(KEYS)
    }
    header, _, _ = decode_backup(backup.read_bytes())
    assert header.cluster_id == "local" and header.slot >= 1
    capsys.readouterr()
    assert main(["snapshot", "restore", str(backup), "--dir", str(restored), "--no-wan",
                 "--base-port", str(free_base_port())]) == 0
    assert "seeded 3 replicas" in capsys.readouterr().out
    new_id = tomllib.loads((restored / "cluster.toml").read_text())["cluster_id"]
    assert new_id.startswith("restored-") and new_id != header.cluster_id
    assert main(["cluster", "up", "--dir", str(restored)]) == 0
    try:
        assert asyncio.run(_read_all(restored)) == expected
        asyncio.run(_write(restored, 9))  # and it goes on taking writes
    finally:
        assert main(["cluster", "down", "--dir", str(restored)]) == 0
