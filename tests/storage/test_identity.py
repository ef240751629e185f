"""Data-directory identity (``consensus.storage.identity``): a replica runs only on its own
directory, an empty one only when a new cluster is bootstrapped, and peers admit only the
incarnation and directory they met first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from consensus.errors import ConfigError, ForeignDataDir, MemberRemoved, MissingIdentity
from consensus.storage.identity import (
    FIRST_INCARNATION,
    IDENTITY_NAME,
    MEMBERS_NAME,
    NO_INCARNATION,
    KnownMembers,
    mark_removed,
    new_identity,
    open_identity,
    read_identity,
    write_identity,
)


def test_a_new_clusters_directory_gets_an_identity_once(tmp_path: Path) -> None:
    first = open_identity(tmp_path / "r0", "c1", 0, bootstrap=True)
    assert (first.cluster_id, first.replica_id, first.incarnation) == ("c1", 0, FIRST_INCARNATION)
    assert read_identity(tmp_path / "r0") == first
    # started again (either mode): the same identity, not a new token
    assert open_identity(tmp_path / "r0", "c1", 0, bootstrap=True) == first
    assert open_identity(tmp_path / "r0", "c1", 0, bootstrap=False) == first


def test_an_empty_directory_of_an_existing_cluster_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r2").mkdir()
    (tmp_path / "r2" / "LOCK").write_text("123\n")  # the process lock is no data
    with pytest.raises(MissingIdentity) as info:
        open_identity(tmp_path / "r2", "c1", 2, bootstrap=False)
    message = str(info.value)
    assert "replica 2" in message and "must not rejoin" in message
    assert "--initial-cluster-state new" in message and "snapshot" in message
    assert read_identity(tmp_path / "r2") is None  # refused: nothing written
    with pytest.raises(MissingIdentity):
        open_identity(tmp_path / "missing", "c1", 2, bootstrap=False)
    assert not (tmp_path / "missing").exists()


def test_an_older_builds_directory_with_data_is_adopted(tmp_path: Path) -> None:
    (tmp_path / "r1" / "wal").mkdir(parents=True)
    adopted = open_identity(tmp_path / "r1", "c1", 1, bootstrap=False)
    assert adopted.replica_id == 1 and read_identity(tmp_path / "r1") == adopted


@pytest.mark.parametrize(("cluster", "replica"), [("other", 0), ("c1", 1)])
def test_a_foreign_directory_is_refused(tmp_path: Path, cluster: str, replica: int) -> None:
    write_identity(tmp_path, new_identity("c1", 0))
    before = (tmp_path / IDENTITY_NAME).read_bytes()
    with pytest.raises(ForeignDataDir) as info:
        open_identity(tmp_path, cluster, replica, bootstrap=True)
    assert "belongs to replica 0 (incarnation 1) of cluster 'c1'" in str(info.value)
    assert (tmp_path / IDENTITY_NAME).read_bytes() == before


def test_an_edited_or_torn_identity_is_refused_not_trusted(tmp_path: Path) -> None:
    write_identity(tmp_path, new_identity("c1", 0))
    path = tmp_path / IDENTITY_NAME
    data = json.loads(path.read_text())
    data["body"]["replica_id"] = 1  # the checksum no longer matches
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="checksum mismatch"):
        open_identity(tmp_path, "c1", 1, bootstrap=True)
    path.write_text(path.read_text()[:20])
    with pytest.raises(ConfigError, match="not JSON"):
        read_identity(tmp_path)
    data["format"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="unknown format 99"):
        read_identity(tmp_path)


def test_peers_are_admitted_as_first_met_and_remembered_durably(tmp_path: Path) -> None:
    members = KnownMembers(tmp_path)
    assert members.admit(1, 1, "aaaa") is None  # first contact: recorded
    assert members.admit(1, 1, "aaaa") is None
    again = KnownMembers(tmp_path)  # what a restart reads
    assert again.members == {1: (1, "aaaa")}
    wiped = again.admit(1, 1, "bbbb")
    assert wiped is not None and "another data directory" in wiped
    assert again.admit(2, 3, "cccc") is None
    older = again.admit(2, 2, "dddd")
    assert older is not None and "incarnation 2 of replica 2 is retired" in older
    newer = again.admit(2, 4, "cccc")
    assert newer is not None and "no membership change made" in newer
    assert again.admit(1, NO_INCARNATION, "") is None  # an older build: unchecked
    assert KnownMembers(tmp_path).members == {1: (1, "aaaa"), 2: (3, "cccc")}


def test_a_damaged_members_file_is_refused(tmp_path: Path) -> None:
    KnownMembers(tmp_path).admit(1, 1, "aaaa")
    path = tmp_path / MEMBERS_NAME
    path.write_text(path.read_text().replace("aaaa", "zzzz"))
    with pytest.raises(ConfigError, match="checksum mismatch"):
        KnownMembers(tmp_path)


def test_a_removed_members_directory_never_serves_again(tmp_path: Path) -> None:
    identity = open_identity(tmp_path / "r0", "c1", 0, bootstrap=True)
    removed = mark_removed(tmp_path / "r0", identity, epoch=4)
    assert removed.removed_in_epoch == 4 and removed.token == identity.token
    assert read_identity(tmp_path / "r0") == removed  # durable, checksummed as before
    for bootstrap in (True, False):  # whatever the start mode
        with pytest.raises(MemberRemoved) as info:
            open_identity(tmp_path / "r0", "c1", 0, bootstrap=bootstrap)
        assert "replica 0 of cluster 'c1' was removed from the cluster" in str(info.value)
        assert "epoch 4" in str(info.value) and "sdpaxos member add" in str(info.value)
    # a file without the mark (what every build wrote before) is a member's, as ever
    open_identity(tmp_path / "r1", "c1", 1, bootstrap=True)
    assert "removed_in_epoch" not in (tmp_path / "r1" / IDENTITY_NAME).read_text()


def test_a_bad_removal_mark_is_refused_not_trusted(tmp_path: Path) -> None:
    identity = open_identity(tmp_path / "r0", "c1", 0, bootstrap=True)
    body = {"cluster_id": "c1", "replica_id": 0, "incarnation": identity.incarnation,
            "token": identity.token, "removed_in_epoch": "soon"}
    from consensus.storage.identity import _write_checked

    _write_checked(tmp_path / "r0", IDENTITY_NAME, body)
    with pytest.raises(ConfigError, match="is not a valid identity file"):
        open_identity(tmp_path / "r0", "c1", 0, bootstrap=False)
