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


def test_a_file_that_is_not_utf8_is_a_config_error_not_a_traceback(tmp_path: Path) -> None:
    # issue 34: a UnicodeDecodeError traceback (exit 1) from every verb given such a file
    path = tmp_path / "cluster.toml"
    path.write_bytes(b'cluster_id = "\xff\xfe"\n')
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 14\)"):
        load_cluster_config(path)


def test_a_port_out_of_range_is_named_as_such(tmp_path: Path) -> None:
    # issue 34: "expected host:port, got '127.0.0.1:70000'"
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, 20_000, wan=False).replace("127.0.0.1:20001",
                                                               "127.0.0.1:70001"))
    with pytest.raises(ConfigError, match=r"port 70001 of '127.0.0.1:70001' is out of range "
                                          r"\(1..65535\)"):
        load_cluster_config(path)
