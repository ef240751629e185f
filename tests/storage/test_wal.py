import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.storage import wal as wal_module
from consensus.storage.wal import MAGIC, MAX_RECORD, WALCorruption, WriteAheadLog

HEADER = 12  # length, crc, header crc


def record_bytes(payload: bytes) -> bytes:
    """An SDPXWAL2 record, built independently of the module."""
    head = struct.pack(">II", len(payload), zlib.crc32(payload))
    return head + struct.pack(">I", zlib.crc32(head)) + payload


def v1_record_bytes(payload: bytes) -> bytes:
    head = struct.pack(">I", len(payload))
    return head + struct.pack(">I", zlib.crc32(payload, zlib.crc32(head))) + payload


def write(path: Path, payloads: list[bytes], segment_bytes: int = 1 << 20) -> None:
    wal = WriteAheadLog(path, segment_bytes=segment_bytes)
    for payload in payloads:
        wal.append(payload)
    wal.sync()
    wal.close()


def segments(path: Path) -> list[Path]:
    return sorted(path.glob("wal-*.log"))


def only_segment(path: Path) -> Path:
    (segment,) = segments(path)
    return segment


def log_end(payloads: list[bytes]) -> int:
    return len(MAGIC) + sum(HEADER + len(p) for p in payloads)


def overwrite(path: Path, offset: int, data: bytes) -> None:
    """Change bytes in place, keeping the file's size (as a crash or a bad disk would)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def zeros_from(path: Path, offset: int) -> bool:
    data = path.read_bytes()
    return data[offset:] == bytes(len(data) - offset)


def no_temporaries(path: Path) -> bool:
    return not list(path.glob("segment-*.tmp"))


def reopen(path: Path, segment_bytes: int = 1 << 20) -> list[bytes]:
    wal = WriteAheadLog(path, segment_bytes=segment_bytes)
    wal.close()
    return wal.recovered


def append_and_reopen(
    wal: WriteAheadLog, payload: bytes, path: Path, segment_bytes: int = 1 << 20
) -> list[bytes]:
    """Append ``payload`` durably to ``wal``, close it, and read the log back from disk."""
    wal.append(payload)
    wal.sync()
    wal.close()
    return reopen(path, segment_bytes)


# ------------------------------------------------------------------------- basics


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
    assert reopen(tmp_path) == [b"synced"]


def test_sync_without_fsync_still_writes(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.append(b"no fsync")
    wal.sync(fsync=False)
    assert len(wal) == 1
    wal.close()
    assert reopen(tmp_path) == [b"no fsync"]


def test_segment_is_preallocated_and_written_in_place(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=4096)
    segment = only_segment(tmp_path)
    assert segment.stat().st_size == 4096
    assert segment.read_bytes() == MAGIC + bytes(4096 - len(MAGIC))
    wal.append(b"one")
    wal.append(b"two")
    wal.sync()
    assert segment.stat().st_size == 4096
    expected = MAGIC + record_bytes(b"one") + record_bytes(b"two")
    assert segment.read_bytes()[: len(expected)] == expected
    assert zeros_from(segment, len(expected))
    wal.close()


def test_first_segment_is_small_when_segments_are_big(tmp_path: Path) -> None:
    WriteAheadLog(tmp_path).close()  # default segment_bytes, 64 MiB
    assert only_segment(tmp_path).stat().st_size == wal_module.FIRST_SEGMENT_BYTES
    assert no_temporaries(tmp_path)


def test_empty_payload_is_a_record(tmp_path: Path) -> None:
    write(tmp_path, [b"", b"x", b""])
    wal = WriteAheadLog(tmp_path)
    assert wal.recovered == [b"", b"x", b""]
    assert append_and_reopen(wal, b"", tmp_path) == [b"", b"x", b"", b""]


def test_record_over_the_limit_is_rejected(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    with pytest.raises(ValueError):
        wal.append(bytes(MAX_RECORD + 1))
    wal.close()


# ------------------------------------------------------------------------- torn writes

Tear = Callable[[bytes], bytes]


def tear_cut_header(record: bytes) -> bytes:
    return record[:5] + bytes(len(record) - 5)  # length and one byte of the crc landed


def tear_cut_payload(record: bytes) -> bytes:
    return record[: HEADER + 7] + bytes(len(record) - HEADER - 7)


def tear_hole_in_payload(record: bytes) -> bytes:
    # a valid length, a payload partly zeros (a sector in the middle did not land)
    return record[: HEADER + 20] + bytes(30) + record[HEADER + 50 :]


def tear_bad_crc(record: bytes) -> bytes:
    return record[:-1] + bytes([record[-1] ^ 0x40])


def tear_garbled_length(record: bytes) -> bytes:
    return bytes([record[0] ^ 0x01]) + record[1:]


TEARS = [tear_cut_header, tear_cut_payload, tear_hole_in_payload, tear_bad_crc]


@pytest.mark.parametrize("tear", TEARS)
def test_torn_final_record_is_dropped(tmp_path: Path, tear: Tear) -> None:
    good = [b"a" * 10, b"b" * 100]
    write(tmp_path, good)
    segment = only_segment(tmp_path)
    size = segment.stat().st_size
    end = log_end(good)
    torn = tear(record_bytes(b"c" * 80))
    overwrite(segment, end, torn)
    wal = WriteAheadLog(tmp_path)
    assert wal.recovered == good
    # the torn bytes are zeros again before anything new is written
    assert segment.stat().st_size == size
    assert zeros_from(segment, end)
    assert append_and_reopen(wal, b"d", tmp_path) == [*good, b"d"]


def test_header_cut_short_to_zeros_is_the_end_of_the_log(tmp_path: Path) -> None:
    write(tmp_path, [b"keep"])
    segment = only_segment(tmp_path)
    # only the first bytes of a small record's header landed: they are its zero length bytes
    overwrite(segment, log_end([b"keep"]), record_bytes(b"x" * 5)[:3])
    assert reopen(tmp_path) == [b"keep"]


def test_torn_record_in_a_fresh_segment_after_a_roll(tmp_path: Path) -> None:
    first = [bytes([i]) * 50 for i in range(3)]
    write(tmp_path, first, segment_bytes=200)
    wal = WriteAheadLog(tmp_path, segment_bytes=200)
    wal.append(b"z" * 100)
    wal.sync()  # does not fit: rolls over
    wal.close()
    last = segments(tmp_path)[-1]
    overwrite(last, len(MAGIC), tear_cut_payload(record_bytes(b"z" * 100)))
    wal = WriteAheadLog(tmp_path, segment_bytes=200)
    assert wal.recovered == first
    assert append_and_reopen(wal, b"after", tmp_path, 200) == [*first, b"after"]


# ------------------------------------------------------------------------- corruption


def test_corruption_before_the_tail_names_file_and_offset(tmp_path: Path) -> None:
    write(tmp_path, [b"first", b"second", b"third"])
    segment = only_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    second_offset = log_end([b"first"])
    data[second_offset + HEADER] ^= 0xFF  # flip a payload byte of the middle record
    segment.write_bytes(bytes(data))
    with pytest.raises(WALCorruption) as caught:
        WriteAheadLog(tmp_path)
    assert caught.value.offset == second_offset
    assert str(segment) in str(caught.value)


@pytest.mark.parametrize("tear", [*TEARS, tear_garbled_length])
def test_damage_followed_by_a_valid_record_is_corruption(tmp_path: Path, tear: Tear) -> None:
    payloads = [b"a" * 10, b"b" * 80, b"c" * 10]
    write(tmp_path, payloads)
    segment = only_segment(tmp_path)
    offset = log_end(payloads[:1])
    overwrite(segment, offset, tear(record_bytes(payloads[1])))
    with pytest.raises(WALCorruption) as caught:
        WriteAheadLog(tmp_path)
    assert caught.value.offset == offset


def test_length_grown_over_the_following_records_is_corruption(tmp_path: Path) -> None:
    # a damaged length that covers every later record and ends in the zero tail must not pass
    # for a torn final record (which would drop the acknowledged records after it)
    payloads = [b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 10]
    write(tmp_path, payloads)
    segment = only_segment(tmp_path)
    offset = log_end(payloads[:1])
    overwrite(segment, offset, struct.pack(">I", 200))
    with pytest.raises(WALCorruption) as caught:
        WriteAheadLog(tmp_path)
    assert caught.value.offset == offset


@pytest.mark.parametrize("tear", [tear_garbled_length, lambda r: bytes(HEADER) + r[HEADER:]])
def test_final_record_with_a_bad_header_and_data_after_it_is_corruption(
    tmp_path: Path, tear: Tear
) -> None:
    # with its header garbled or lost (zeros) but its payload on disk, the record's extent is
    # unknown: it could as well be acknowledged data whose length went bad. The log refuses
    # to open rather than guess (the docstring's conservative case).
    write(tmp_path, [b"keep"])
    segment = only_segment(tmp_path)
    end = log_end([b"keep"])
    overwrite(segment, end, tear(record_bytes(b"p" * 600)))
    with pytest.raises(WALCorruption) as caught:
        WriteAheadLog(tmp_path)
    assert caught.value.offset == end


def test_garbage_after_the_end_of_the_log_is_corruption(tmp_path: Path) -> None:
    payloads = [b"keep", b"these"]
    write(tmp_path, payloads)
    segment = only_segment(tmp_path)
    end = log_end(payloads)
    overwrite(segment, end + 100, b"\x01")  # a zero header, then a stray non-zero byte
    with pytest.raises(WALCorruption, match="end of the log") as caught:
        WriteAheadLog(tmp_path)
    assert caught.value.offset == end


def test_garbage_after_a_torn_record_is_corruption(tmp_path: Path) -> None:
    write(tmp_path, [b"keep"])
    segment = only_segment(tmp_path)
    end = log_end([b"keep"])
    torn = tear_bad_crc(record_bytes(b"x" * 20))
    overwrite(segment, end, torn)
    overwrite(segment, end + len(torn) + 30, b"junk")
    with pytest.raises(WALCorruption) as caught:
        WriteAheadLog(tmp_path)
    assert caught.value.offset == end


def test_record_running_past_the_end_of_the_file_is_corruption(tmp_path: Path) -> None:
    write(tmp_path, [b"keep", b"cut short"])
    segment = only_segment(tmp_path)
    os.truncate(segment, log_end([b"keep", b"cut short"]) - 2)  # our files never shrink
    with pytest.raises(WALCorruption) as caught:
        WriteAheadLog(tmp_path)
    assert caught.value.offset == log_end([b"keep"])


def test_bad_header_is_corruption(tmp_path: Path) -> None:
    write(tmp_path, [b"x"])
    segment = only_segment(tmp_path)
    segment.write_bytes(b"NOTAWAL!" + segment.read_bytes()[8:])
    with pytest.raises(WALCorruption, match="offset 0"):
        WriteAheadLog(tmp_path)


def test_damage_in_an_earlier_segment_is_corruption(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=64)
    for i in range(10):
        wal.append(bytes([i + 1]) * 40)
        wal.sync()
    wal.close()
    first = segments(tmp_path)[0]
    # a torn-looking last record is damage in a segment that is not the last
    overwrite(first, len(MAGIC) + HEADER + 39, b"\x00")
    with pytest.raises(WALCorruption) as caught:
        WriteAheadLog(tmp_path, segment_bytes=64)
    assert caught.value.path == first
    assert caught.value.offset == len(MAGIC)


# ------------------------------------------------------------------------- segments


def test_segments_roll_over(tmp_path: Path) -> None:
    payloads = [bytes([i % 256]) * 100 for i in range(50)]
    wal = WriteAheadLog(tmp_path, segment_bytes=1000)
    for payload in payloads:
        wal.append(payload)
        wal.sync()
    wal.close()
    assert len(segments(tmp_path)) > 3
    assert all(path.stat().st_size == 1000 for path in segments(tmp_path))
    assert no_temporaries(tmp_path)
    wal = WriteAheadLog(tmp_path, segment_bytes=1000)
    assert wal.recovered == payloads
    assert append_and_reopen(wal, b"more", tmp_path, 1000) == [*payloads, b"more"]


def test_tiny_segments_and_batches_larger_than_a_segment(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=64)
    batch = [bytes([i]) * 30 for i in range(1, 8)]
    for payload in batch:
        wal.append(payload)
    wal.sync()  # 7 records, 294 bytes: one segment sized to fit them
    wal.append(b"small")
    wal.sync()
    wal.close()
    sizes = [path.stat().st_size for path in segments(tmp_path)]
    assert len(MAGIC) + sum(HEADER + len(p) for p in batch) in sizes
    assert reopen(tmp_path, 64) == [*batch, b"small"]


def test_segment_capacities_double_up_to_segment_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wal_module, "FIRST_SEGMENT_BYTES", 1024)
    payloads = [bytes([i % 250 + 1]) * 88 for i in range(200)]  # 100 bytes a record
    wal = WriteAheadLog(tmp_path, segment_bytes=8192)
    for payload in payloads:
        wal.append(payload)
        wal.sync()
    wal.close()
    sizes = [path.stat().st_size for path in segments(tmp_path)]
    assert sizes[:4] == [1024, 2048, 4096, 8192]
    assert set(sizes[3:]) == {8192}
    assert reopen(tmp_path, 8192) == payloads


X, Y, Z = b"x" * 400, b"y" * 400, b"z" * 400  # two fit in a 1000-byte segment, three don't


def test_the_next_segment_is_prepared_in_the_background(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=1000)
    prepared = tmp_path / "segment-next.tmp"
    wal.append(X)
    wal.sync()
    assert wal._preparation is None  # under half full
    wal.append(Y)
    wal.sync()
    assert wal._preparation is not None
    wal._preparation.take()  # wait for the background thread
    assert prepared.read_bytes() == MAGIC + bytes(1000 - len(MAGIC))
    inode = prepared.stat().st_ino
    wal.append(Z)
    wal.sync()  # does not fit: the prepared segment becomes the current one
    assert not prepared.exists()
    assert segments(tmp_path)[-1].stat().st_ino == inode
    wal.close()
    assert no_temporaries(tmp_path)
    assert reopen(tmp_path, 1000) == [X, Y, Z]


def test_prepared_segment_left_by_a_crash_is_removed(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=1000)
    for payload in [X, Y]:
        wal.append(payload)
        wal.sync()
    assert wal._preparation is not None
    wal._preparation.take()
    prepared = (tmp_path / "segment-next.tmp").read_bytes()
    wal.close()
    # the process had died instead: a prepared segment on disk, and one half-written
    (tmp_path / "segment-next.tmp").write_bytes(prepared)
    (tmp_path / "segment-new.tmp").write_bytes(MAGIC + b"\x01" * 10)
    wal = WriteAheadLog(tmp_path, segment_bytes=1000)
    assert wal.recovered == [X, Y]
    assert not (tmp_path / "segment-new.tmp").exists()
    wal.append(Z)
    wal.sync()
    wal.close()
    assert no_temporaries(tmp_path)
    assert reopen(tmp_path, 1000) == [X, Y, Z]


def test_empty_segment_renamed_into_place_before_a_crash(tmp_path: Path) -> None:
    write(tmp_path, [b"a", b"b"], segment_bytes=4096)
    # crash after the rename of a prepared segment, before anything was written into it
    (tmp_path / "wal-00000000000000000001.log").write_bytes(MAGIC + bytes(500))
    wal = WriteAheadLog(tmp_path, segment_bytes=4096)
    assert wal.recovered == [b"a", b"b"]
    assert append_and_reopen(wal, b"c", tmp_path, 4096) == [b"a", b"b", b"c"]
    assert (tmp_path / "wal-00000000000000000001.log").read_bytes()[8:20] == record_bytes(b"c")[:12]


def test_close_stops_a_preparation(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=4 << 20)
    wal.append(bytes(150 << 10))
    wal.sync()  # over half of the first 256 KiB: preparing 512 KiB
    assert wal._preparation is not None
    wal.close()
    assert no_temporaries(tmp_path)
    assert reopen(tmp_path) == [bytes(150 << 10)]


# ------------------------------------------------------------------------- rewrite


def test_rewrite_keeps_only_the_new_records(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=200)
    for i in range(30):
        wal.append(f"old {i}".encode())
        wal.sync()
    wal.rewrite([b"live 1", b"live 2"])
    assert len(wal) == 2
    wal.append(b"after")
    wal.sync()
    wal.close()
    assert len(segments(tmp_path)) == 1
    assert reopen(tmp_path) == [b"live 1", b"live 2", b"after"]


def test_rewrite_larger_than_a_segment(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=64)
    wal.append(b"old")
    wal.sync()
    live = [bytes([i]) * 40 for i in range(1, 6)]
    wal.rewrite(live)
    wal.rewrite(live)  # twice: the second one from a full segment
    wal.close()
    assert len(segments(tmp_path)) == 1
    assert reopen(tmp_path, 64) == live


def test_crash_during_rewrite_replays_a_superset(tmp_path: Path) -> None:
    write(tmp_path, [b"a", b"b"])
    # the new segment is complete, the old one not deleted yet
    (tmp_path / "wal-00000000000000000009.log").write_bytes(
        MAGIC + record_bytes(b"b") + bytes(1000)
    )
    assert reopen(tmp_path) == [b"a", b"b", b"b"]


# ------------------------------------------------------------------------- SDPXWAL1


def test_sdpxwal1_segments_still_read(tmp_path: Path) -> None:
    old = [b"first", b"", b"third" * 20]
    (tmp_path / "wal-00000000000000000000.log").write_bytes(
        b"SDPXWAL1" + b"".join(v1_record_bytes(p) for p in old)
    )
    (tmp_path / "wal-00000000000000000001.log").write_bytes(
        b"SDPXWAL1" + v1_record_bytes(b"fourth") + v1_record_bytes(b"torn")[:-2]
    )
    wal = WriteAheadLog(tmp_path)
    assert wal.recovered == [*old, b"fourth"]  # the torn last record truncated, as before
    assert (tmp_path / "wal-00000000000000000001.log").read_bytes() == (
        b"SDPXWAL1" + v1_record_bytes(b"fourth")
    )
    wal.append(b"fifth")
    wal.sync()
    wal.close()
    # new records go to a new SDPXWAL2 segment; the old ones are never written again
    assert segments(tmp_path)[-1].read_bytes()[:8] == MAGIC
    wal = WriteAheadLog(tmp_path)
    assert wal.recovered == [*old, b"fourth", b"fifth"]
    wal.rewrite([b"live"])
    wal.close()
    assert only_segment(tmp_path).read_bytes()[:8] == MAGIC
    assert reopen(tmp_path) == [b"live"]


def test_sdpxwal1_damage_is_corruption(tmp_path: Path) -> None:
    records = [v1_record_bytes(p) for p in [b"one", b"two", b"three"]]
    damaged = bytearray(records[1])
    damaged[-1] ^= 0xFF
    path = tmp_path / "wal-00000000000000000000.log"
    path.write_bytes(b"SDPXWAL1" + records[0] + bytes(damaged) + records[2])
    with pytest.raises(WALCorruption) as caught:
        WriteAheadLog(tmp_path)
    assert caught.value.offset == 8 + len(records[0])


def test_sdpxwal1_interrupted_segment_creation(tmp_path: Path) -> None:
    (tmp_path / "wal-00000000000000000000.log").write_bytes(b"SDPXWAL1" + v1_record_bytes(b"kept"))
    (tmp_path / "wal-00000000000000000001.log").write_bytes(b"SDPX")  # crashed writing it
    wal = WriteAheadLog(tmp_path)
    assert wal.recovered == [b"kept"]
    assert append_and_reopen(wal, b"new", tmp_path) == [b"kept", b"new"]


# ------------------------------------------------------------------------- properties

SEGMENT_SIZES = st.sampled_from([64, 300, 1000, 4096])


@settings(max_examples=80, deadline=None)
@given(
    batches=st.lists(st.lists(st.binary(max_size=120), min_size=1, max_size=4), max_size=6),
    last=st.binary(max_size=200),
    segment_bytes=SEGMENT_SIZES,
    how=st.sampled_from(["prefix", "hole", "flip"]),
    x=st.integers(min_value=0),
    y=st.integers(min_value=0),
)
def test_torn_final_write_recovers_exactly_the_synced_records(
    batches: list[list[bytes]],
    last: bytes,
    segment_bytes: int,
    how: str,
    x: int,
    y: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = tmp_path_factory.mktemp("wal")
    wal = WriteAheadLog(path, segment_bytes=segment_bytes)
    synced = []
    for batch in batches:
        for payload in batch:
            wal.append(payload)
        wal.sync()
        synced.extend(batch)
    wal.append(last)
    wal.sync(fsync=False)
    wal.close()
    # the crash: only a prefix of the final record landed (the rest still zeros), or its
    # payload has a hole of zeros, or a garbled bit
    segment = segments(path)[-1]
    data = bytearray(segment.read_bytes())
    record = record_bytes(last)
    at = bytes(data).rfind(record)
    assert at >= len(MAGIC) and not any(data[at + len(record) :])
    torn = bytearray(record)
    if how == "prefix" or not last:
        cut = x % (len(record) + 1)
        torn[cut:] = bytes(len(record) - cut)
    elif how == "hole":
        start, stop = sorted((HEADER + x % len(last), HEADER + y % (len(last) + 1)))
        torn[start:stop] = bytes(stop - start)
    else:
        torn[HEADER + x % len(last)] ^= 1 << (y % 8)
    landed = torn == record
    data[at : at + len(record)] = torn
    segment.write_bytes(bytes(data))
    wal = WriteAheadLog(path, segment_bytes=segment_bytes)
    assert wal.recovered == ([*synced, last] if landed else synced)
    assert zeros_from(segment, at + len(record) if landed else at)
    expected = [*synced, *([last] if landed else []), b"next"]
    assert append_and_reopen(wal, b"next", path, segment_bytes) == expected


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=60), min_size=2, max_size=8),
    victim=st.integers(min_value=0),
    where=st.integers(min_value=0),
    how=st.sampled_from(["flip", "zero"]),
)
def test_damage_before_the_last_record_is_corruption(
    payloads: list[bytes],
    victim: int,
    where: int,
    how: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = tmp_path_factory.mktemp("wal")
    write(path, payloads)
    segment = only_segment(path)
    index = victim % (len(payloads) - 1)
    offset = log_end(payloads[:index])
    record = bytearray(record_bytes(payloads[index]))
    spot = where % len(record)
    if how == "flip":
        record[spot] ^= 0x10
    else:
        record[spot:] = bytes(len(record) - spot)
    if bytes(record) == record_bytes(payloads[index]):
        return  # zeroing bytes that were zeros already is no damage
    overwrite(segment, offset, bytes(record))
    with pytest.raises(WALCorruption) as caught:
        WriteAheadLog(path)
    assert caught.value.offset == offset


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=40), min_size=1, max_size=8),
    size=st.integers(min_value=len(MAGIC), max_value=500),
)
def test_truncation_never_silently_drops_a_cut_record(
    payloads: list[bytes], size: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # segment files never shrink (their size is fsynced before they are used), so a shorter
    # file is outside damage: a file ending after a whole record reads as ending there (that
    # is also how a segment filled to the last byte ends), a record cut short is corruption
    # (or where what is left of the cut record is zeros: the start of a length field)
    path = tmp_path_factory.mktemp("wal")
    write(path, payloads, segment_bytes=4096)
    segment = only_segment(path)
    os.truncate(segment, size)
    ends = [log_end(payloads[:n]) for n in range(len(payloads) + 1)]
    whole = [n for n, end in enumerate(ends) if end <= size][-1]
    if whole == len(payloads) or zeros_from(segment, ends[whole]):
        assert reopen(path) == payloads[:whole]
    else:
        with pytest.raises(WALCorruption):
            WriteAheadLog(path)


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(min_value=0, max_value=150)),
            st.tuples(st.just("sync"), st.just(0)),
            st.tuples(st.just("reopen"), st.just(0)),
            st.tuples(st.just("rewrite"), st.integers(min_value=0, max_value=5)),
        ),
        max_size=40,
    ),
    segment_bytes=SEGMENT_SIZES,
)
def test_operations_match_a_model(
    ops: list[tuple[str, int]], segment_bytes: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("wal")
    wal = WriteAheadLog(path, segment_bytes=segment_bytes)
    durable: list[bytes] = []
    pending: list[bytes] = []
    for number, (op, arg) in enumerate(ops):
        if op == "append":
            payload = bytes([number % 256]) * arg
            wal.append(payload)
            pending.append(payload)
        elif op == "sync":
            wal.sync()
            durable += pending
            pending = []
        elif op == "reopen":
            wal.close()  # what was not synced is lost, as in a crash
            pending = []
            wal = WriteAheadLog(path, segment_bytes=segment_bytes)
            assert wal.recovered == durable
        else:
            durable = durable + pending
            durable = durable[len(durable) - min(arg, len(durable)) :]
            pending = []
            wal.rewrite(list(durable))
        assert len(wal) == len(durable)
    wal.close()
    assert reopen(path, segment_bytes) == durable


def test_an_emulated_slow_disk_holds_every_sync_and_is_undone(tmp_path: Path) -> None:
    """``sdpaxos serve --emulate-fsync-ms``: each fdatasync takes that much longer (after the
    real one: the records are as durable), and 0 gives the real one back."""
    wal = WriteAheadLog(tmp_path)
    try:
        wal_module.emulate_slow_disk(0.03)
        wal.append(b"slow")
        wal.sync()
        assert wal.last_sync_seconds >= 0.03
    finally:
        wal_module.emulate_slow_disk(0)
    assert wal_module._datasync is wal_module._REAL_DATASYNC
    wal.close()
    assert reopen(tmp_path) == [b"slow"]
