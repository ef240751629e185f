"""The cluster file's ``[wan]`` table: an explicit one-way delay matrix is checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from consensus.errors import ConfigError
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import ClusterConfig, load_cluster_config


def _load(tmp_path: Path, matrix: str) -> ClusterConfig:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, 20_000, wan=True) + f"one_way_ms = {matrix}\n")
    return load_cluster_config(path)


def test_a_symmetric_matrix_gives_the_delays_in_microseconds(tmp_path: Path) -> None:
    config = _load(tmp_path, "[[0, 10, 26], [10, 0, 0.5], [26, 0.5, 0]]")
    assert config.one_way_us == ((0, 10_000, 26_000), (10_000, 0, 500), (26_000, 500, 0))


@pytest.mark.parametrize(("matrix", "message"), [
    ("[[0, 10, 26], [12, 0, 34], [26, 34, 0]]", "must be symmetric: [0][1] is 10, [1][0] is 12"),
    ("[[0, -1, 26], [-1, 0, 34], [26, 34, 0]]", "[0][1] must be milliseconds >= 0, got -1"),
    ('[[0, "ten", 26], ["ten", 0, 34], [26, 34, 0]]', "[0][1] must be milliseconds >= 0"),
    ("[[0, true, 26], [true, 0, 34], [26, 34, 0]]", "[0][1] must be milliseconds >= 0"),
    ("[[0, 10], [10, 0]]", "must be a 3x3 matrix"),
])
def test_a_bad_matrix_is_a_clear_error(tmp_path: Path, matrix: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _load(tmp_path, matrix)


# ------------------------------------------------------------------ ids with gaps
def _drop(text: str, *ids: int) -> str:
    """The cluster file ``text`` without the [[replica]] entries of ``ids``."""
    blocks = text.split("[[replica]]\n")
    kept = [b for b in blocks[1:] if int(b.split("\n", 1)[0].removeprefix("id = ")) not in ids]
    return "[[replica]]\n".join([blocks[0], *kept])


def _joined(replica_id: int, base: int) -> str:
    return (f'\n[[replica]]\nid = {replica_id}\naddress = "127.0.0.1:{base + replica_id}"\n'
            f'client_address = "127.0.0.1:{base + 100 + replica_id}"\nsite = "IRE"\n'
            "joined = true\n")


def _write(tmp_path: Path, text: str) -> ClusterConfig:
    path = tmp_path / "cluster.toml"
    head, sep, tail = text.partition("[protocol]")
    path.write_text(head + sep + tail)
    return load_cluster_config(path)


def test_cluster_init_writes_how_many_replicas_the_cluster_started_with(tmp_path: Path) -> None:
    text = cluster_toml(3, 20_000, wan=False)
    assert "initial_replicas = 3" in text
    config = _write(tmp_path, text)
    assert config.protocol.replicas == 3 and [s.id for s in config.replicas] == [0, 1, 2]


def test_removed_members_entries_may_go_and_ids_have_gaps(tmp_path: Path) -> None:
    # started with 0, 1, 2; 3 and 4 joined; 0 and 2 were removed and their entries deleted
    text = cluster_toml(3, 20_000, wan=False)
    head, sep, tail = _drop(text, 0, 2).partition("[protocol]")
    config = _write(tmp_path, head + _joined(3, 20_000) + _joined(4, 20_000) + "\n" + sep + tail)
    assert [s.id for s in config.replicas] == [1, 3, 4]
    assert [s.joined for s in config.replicas] == [False, True, True]
    assert config.protocol.replicas == 3  # what every replica's log starts from
    assert config.replica(3).client_address == ("127.0.0.1", 20_103)
    assert config.replica_dir(4).name == "replica-4"
    with pytest.raises(ConfigError, match=r"no replica with id 0 in the cluster file \(its ids: "
                       r"\[1, 3, 4\]\)"):
        config.replica(0)
    assert config.delays_from(4) == {1: 0, 3: 0, 4: 0}


def test_delays_follow_ids_with_gaps(tmp_path: Path) -> None:
    text = _drop(cluster_toml(3, 20_000, wan=False), 1)
    config = _write(tmp_path, text + "\n[wan]\nemulate = true\none_way_ms = [[0, 7], [7, 0]]\n")
    assert config.delays_from(2) == {0: 7_000, 2: 0} and config.delays_from(1) == {}


@pytest.mark.parametrize(("edit", "message"), [
    # without initial_replicas (an older file) the first replicas must be 0..N-1
    (lambda t: _drop(t.replace("initial_replicas = 3\n", ""), 1),
     r"without joined = true must have ids 0..N-1, got \[0, 2\]; give initial_replicas"),
    (lambda t: t.replace("initial_replicas = 3", "initial_replicas = 2"),
     "odd number of replicas"),
    (lambda t: t.replace("initial_replicas = 3", "initial_replicas = 0"),
     "initial_replicas must be a positive integer"),
    (lambda t: t.replace("initial_replicas = 3", 'initial_replicas = "3"'),
     "initial_replicas must be a positive integer"),
    # an initial replica marked joined, a joined one with an initial id
    (lambda t: t.replace('site = "OR"', 'site = "OR"\njoined = true'),
     "replica 1: the cluster was initialized with replicas 0..2"),
    (lambda t: t.replace("id = 2", "id = 1"), "replica id 1 is used twice"),
    (lambda t: t.replace("id = 2", "id = -2"), "id must be an integer in 0.."),
    (lambda t: t.replace("id = 2", 'id = "2"'), "id must be an integer in 0.."),
])
def test_bad_ids_are_clear_errors(tmp_path: Path, edit: object, message: str) -> None:
    text = edit(cluster_toml(3, 20_000, wan=False))  # type: ignore[operator]
    with pytest.raises(ConfigError, match=message):
        _write(tmp_path, text)


def test_an_older_file_without_initial_replicas_reads_as_before(tmp_path: Path) -> None:
    text = cluster_toml(3, 20_000, wan=False).replace("initial_replicas = 3\n", "")
    head, sep, tail = text.partition("[protocol]")
    config = _write(tmp_path, head + _joined(3, 20_000) + "\n" + sep + tail)
    assert config.protocol.replicas == 3 and [s.id for s in config.replicas] == [0, 1, 2, 3]
