import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.storage.wal import MAGIC, WALCorruption, WriteAheadLog


def record_bytes(payload: bytes) -> bytes:
    head = struct.pack(">I", len(payload))
    return head + struct.pack(">I", zlib.crc32(payload, zlib.crc32(head))) + payload


def write(path: Path, payloads: list[bytes], segment_bytes: int = 1 << 20) -> None:
    wal = WriteAheadLog(path, segment_bytes=segment_bytes)
    for payload in payloads:
        wal.append(payload)
    wal.sync()
    wal.close()


def only_segment(path: Path) -> Path:
    (segment,) = sorted(path.glob("wal-*.log"))
    return segment


def test_records_survive_reopen_in_order(tmp_path: Path) -> None:
    payloads = [f"record {i}".encode() * (i % 5 + 1) for i in range(100)]
    write(tmp_path, payloads[:60])
    write(tmp_path, payloads[60:])
    wal = WriteAheadLog(tmp_path)
    assert wal.recovered == payloads
    assert len(wal) == 100


def test_unsynced_records_are_not_durable(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.append(b"synced")
    wal.sync()
    wal.append(b"lost in the crash")
    wal.close()  # no sync: a crash
    assert WriteAheadLog(tmp_path).recovered == [b"synced"]


def test_segments_roll_over(tmp_path: Path) -> None:
    payloads = [bytes([i % 256]) * 100 for i in range(50)]
    wal = WriteAheadLog(tmp_path, segment_bytes=1000)
    for payload in payloads:
        wal.append(payload)
        wal.sync()
    wal.close()
    assert len(list(tmp_path.glob("wal-*.log"))) > 3
    assert WriteAheadLog(tmp_path, segment_bytes=1000).recovered == payloads


@pytest.mark.parametrize("cut", [1, 3, 4, 7, 8, 9, 20])
def test_torn_tail_is_truncated(tmp_path: Path, cut: int) -> None:
    write(tmp_path, [b"a" * 10, b"b" * 10, b"c" * 10])
    segment = only_segment(tmp_path)
    size = segment.stat().st_size
    os.truncate(segment, size - cut)
    record_size = 8 + 10
    intact = [b"a" * 10, b"b" * 10, b"c" * 10][: 3 - -(-cut // record_size)]
    wal = WriteAheadLog(tmp_path)
    assert wal.recovered == intact
    wal.append(b"d")
    wal.sync()
    wal.close()
    assert WriteAheadLog(tmp_path).recovered == [*intact, b"d"]


def test_garbage_final_record_is_a_torn_write(tmp_path: Path) -> None:
    write(tmp_path, [b"keep"])
    segment = only_segment(tmp_path)
    with open(segment, "ab") as f:
        f.write(struct.pack(">II", 6, 12345) + b"tornxx")  # complete length, bad checksum
    assert WriteAheadLog(tmp_path).recovered == [b"keep"]


def test_corruption_before_the_tail_names_file_and_offset(tmp_path: Path) -> None:
    write(tmp_path, [b"first", b"second", b"third"])
    segment = only_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    second_offset = len(MAGIC) + 8 + len(b"first")
    data[second_offset + 8] ^= 0xFF  # flip a payload byte of the middle record
    segment.write_bytes(bytes(data))
    with pytest.raises(WALCorruption) as caught:
        WriteAheadLog(tmp_path)
    assert caught.value.offset == second_offset
    assert str(segment) in str(caught.value)


def test_bad_header_is_corruption(tmp_path: Path) -> None:
    write(tmp_path, [b"x"])
    segment = only_segment(tmp_path)
    segment.write_bytes(b"NOTAWAL!" + segment.read_bytes()[8:])
    with pytest.raises(WALCorruption, match="offset 0"):
        WriteAheadLog(tmp_path)


def test_damage_in_an_earlier_segment_is_corruption(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=64)
    for i in range(10):
        wal.append(bytes([i]) * 40)
        wal.sync()
    wal.close()
    first = sorted(tmp_path.glob("wal-*.log"))[0]
    os.truncate(first, first.stat().st_size - 3)
    with pytest.raises(WALCorruption):
        WriteAheadLog(tmp_path, segment_bytes=64)


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=40), min_size=1, max_size=8),
    cut=st.integers(min_value=0, max_value=400),
)
def test_any_truncation_recovers_a_prefix(
    payloads: list[bytes], cut: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("wal")
    write(path, payloads)
    segment = only_segment(path)
    os.truncate(segment, max(0, segment.stat().st_size - cut))
    recovered = WriteAheadLog(path).recovered
    assert recovered == payloads[: len(recovered)]


def test_rewrite_keeps_only_the_new_records(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=200)
    for i in range(30):
        wal.append(f"old {i}".encode())
        wal.sync()
    wal.rewrite([b"live 1", b"live 2"])
    wal.append(b"after")
    wal.sync()
    wal.close()
    assert len(list(tmp_path.glob("wal-*.log"))) == 1
    assert WriteAheadLog(tmp_path).recovered == [b"live 1", b"live 2", b"after"]


def test_crash_during_rewrite_replays_a_superset(tmp_path: Path) -> None:
    write(tmp_path, [b"a", b"b"])
    # the new segment is complete, the old one not deleted yet
    (tmp_path / "wal-00000000000000000009.log").write_bytes(MAGIC + record_bytes(b"b"))
    assert WriteAheadLog(tmp_path).recovered == [b"a", b"b", b"b"]
