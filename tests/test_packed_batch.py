"""Tests of batches kept packed (``consensus.packed_batch``, ``decode_frame`` / ``decode_record``
with ``lazy_batches``): an acceptor takes a batch in, logs and acknowledges it without decoding
its commands; they are decoded once, when read, to what the whole decoder gives; a batch whose
commands are malformed reads as empty, the same way everywhere, and never raises."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.codec import (
    FORMAT_VERSION,
    LAZY_FROM_BYTES,
    MAX_BATCH,
    TAGS,
    decode_frame,
    decode_record,
    encode_frame,
    encode_record,
)
from consensus.errors import DecodeError
from consensus.messages import (
    CAccept,
    CAcceptedRecord,
    CAck,
    CCommit,
    Command,
    MenciusAccept,
    PaxosAccept,
    PaxosCommit,
    PeerMessage,
    SlotAcceptedRecord,
)
from consensus.packed_batch import PackedBatch


def batch_of(count: int, client: int = 7) -> tuple[Command, ...]:
    return tuple(
        Command(client_id=client, seq=seq, op=b"op%04d" % seq, keys=(f"k{seq}",),
                blind=seq % 3 == 0)
        for seq in range(count)
    )


def pack(obj: object) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


BIG = batch_of(100)  # its frame is over LAZY_FROM_BYTES: decoded lazily
RAW_BIG = [list(command) for command in BIG]


def forged_caccept(batch: object) -> bytes:
    """A frame holding one CAccept with ``batch`` as its raw (msgpack-able) batch field."""
    return pack([FORMAT_VERSION, [[TAGS[CAccept], 1, 0, 1, 5, 0, batch]]])


def test_a_received_batch_stays_its_bytes_which_are_a_whole_pack() -> None:
    sent = CAccept(src=1, view=0, owner=1, index=5, ballot=0, batch=BIG)
    frame = encode_frame([CAck(src=1, view=0, owner=1, index=4, ballot=0), sent])
    assert len(frame) >= LAZY_FROM_BYTES
    _, received = decode_frame(frame, lazy_batches=True)
    assert isinstance(received, CAccept)
    batch = received.batch
    assert isinstance(batch, PackedBatch) and not batch.decoded
    assert batch.packed == pack(BIG)  # the bytes of the batch packed whole
    # the acceptor's log record splices them: the same bytes as the record of the commands
    record = CAcceptedRecord(owner=1, index=5, ballot=0, batch=batch)
    assert encode_record(record) == encode_record(
        CAcceptedRecord(owner=1, index=5, ballot=0, batch=BIG)
    )
    # ... and so do the messages that pass it on
    assert encode_frame([received]) == encode_frame([sent])
    assert not batch.decoded  # none of it read a command
    assert received == sent and batch.decoded and batch.malformed is None


def test_a_lazily_decoded_batch_equals_the_eager_one() -> None:
    frame = encode_frame([PaxosAccept(src=0, view=0, slot=3, ballot=1, batch=BIG)])
    [lazy] = decode_frame(frame, lazy_batches=True)
    [eager] = decode_frame(frame)
    assert isinstance(lazy, PaxosAccept) and isinstance(eager, PaxosAccept)
    assert type(eager.batch) is tuple and type(lazy.batch) is PackedBatch
    assert lazy.batch == eager.batch and eager.batch == lazy.batch
    assert hash(lazy.batch) == hash(eager.batch) and hash(lazy) == hash(eager)
    assert tuple(lazy.batch) == eager.batch and lazy.batch.commands == eager.batch
    assert all(type(command) is Command for command in lazy.batch)
    assert lazy.batch[3] == BIG[3] and lazy.batch[-2:] == BIG[-2:] and len(lazy.batch) == 100
    assert repr(lazy.batch) == repr(eager.batch)  # traces print the same
    # two packed batches with the same bytes are equal without decoding either
    first, second = PackedBatch(pack(BIG)), PackedBatch(pack(BIG))
    assert first == second and not first.decoded and not second.decoded
    assert PackedBatch(pack(BIG[:-1])) != first


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.sampled_from(["caccept", "ccommit", "ccommit_none", "paxos", "commit", "mencius"]),
        min_size=1, max_size=4,
    ),
    st.integers(0, 120),
)
def test_lazy_and_eager_frames_decode_alike(kinds: list[str], count: int) -> None:
    batch = batch_of(count)
    made: dict[str, PeerMessage] = {
        "caccept": CAccept(src=1, view=0, owner=1, index=5, ballot=0, batch=batch),
        "ccommit": CCommit(src=1, view=0, owner=1, index=5, ballot=0, batch=batch),
        "ccommit_none": CCommit(src=1, view=0, owner=1, index=5, ballot=0, batch=None),
        "paxos": PaxosAccept(src=0, view=0, slot=9, ballot=1, batch=batch),
        "commit": PaxosCommit(src=0, view=0, slot=9, ballot=1, batch=batch),
        "mencius": MenciusAccept(src=2, view=0, slot=8, ballot=0, batch=batch,
                                 skip_start=0, skip_stop=0),
    }
    msgs = [made[kind] for kind in kinds]
    frame = encode_frame(msgs)
    lazy = decode_frame(frame, lazy_batches=True)
    assert lazy == decode_frame(frame) == msgs
    assert encode_frame(lazy) == frame


def test_records_decode_lazily_alike() -> None:
    for record in (
        CAcceptedRecord(owner=2, index=1, ballot=3, batch=BIG),
        SlotAcceptedRecord(slot=4, ballot=2, batch=BIG),
    ):
        data = encode_record(record)
        lazy = decode_record(data, lazy_batches=True)
        assert isinstance(lazy.batch, PackedBatch)  # type: ignore[union-attr]
        assert lazy == decode_record(data) == record
        assert encode_record(lazy) == data


def test_a_malformed_batch_reads_as_empty_and_never_raises() -> None:
    bad = [*RAW_BIG[:50], [7, -1, b"op", ["k"], True], *RAW_BIG[51:]]  # a negative seq
    frame = forged_caccept(bad)
    with pytest.raises(DecodeError, match=r"CAccept.batch\[50\].seq"):
        decode_frame(frame)  # the whole decoder rejects the frame, as ever
    [accept] = decode_frame(frame, lazy_batches=True)
    assert isinstance(accept, CAccept) and isinstance(accept.batch, PackedBatch)
    batch = accept.batch
    assert batch == () and len(batch) == 0 and not batch and list(batch) == []
    assert batch.malformed is not None and "batch[50].seq" in batch.malformed
    assert hash(batch) == hash(())
    # it is logged and passed on as the bytes received, so every replica reads it alike
    record = encode_record(CAcceptedRecord(owner=1, index=5, ballot=0, batch=batch))
    assert pack(bad) in record
    logged = decode_record(record, lazy_batches=True)
    assert logged.batch == () and logged.batch.malformed == batch.malformed  # type: ignore[union-attr]
    assert decode_frame(encode_frame([accept]), lazy_batches=True) == [accept]


@pytest.mark.parametrize(
    "bad",
    [
        [RAW_BIG[0], "x", *RAW_BIG[2:]],  # not a command
        [[*RAW_BIG[0][:4]], *RAW_BIG[1:]],  # a field short
        [[7, 1, "op", ["k"], True], *RAW_BIG[1:]],  # op must be bin
        [[7, 1, b"op", [b"k"], True], *RAW_BIG[1:]],  # keys are str
        [[7, 1, b"op", ["k"], 1], *RAW_BIG[1:]],  # blind is bool
        [[7, 1, b"op", ["k" * 5000], True], *RAW_BIG[1:]],  # a key over MAX_KEY_BYTES
    ],
)
def test_every_malformed_command_reads_the_batch_as_empty(bad: list[Any]) -> None:
    [accept] = decode_frame(forged_caccept(bad), lazy_batches=True)
    assert isinstance(accept, CAccept)
    assert accept.batch == () and accept.batch.malformed  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        ({"a": 1, **{f"k{i}": i for i in range(200)}}, "CAccept.batch: expected array"),
        (b"x" * 2000, "CAccept.batch: expected array"),
        (None, "CAccept.batch: expected array"),
    ],
)
def test_a_batch_that_is_no_array_is_rejected_at_decode_time(batch: object, match: str) -> None:
    for lazy in (False, True):
        with pytest.raises(DecodeError, match=match):
            decode_frame(forged_caccept(batch), lazy_batches=lazy)


def test_an_over_long_batch_is_rejected_at_decode_time() -> None:
    frame = forged_caccept([RAW_BIG[0]] * (MAX_BATCH + 1))
    with pytest.raises(DecodeError) as eager:
        decode_frame(frame)
    with pytest.raises(DecodeError) as lazy:
        decode_frame(frame, lazy_batches=True)
    assert str(lazy.value) == str(eager.value)  # worded by the whole decoder


def test_every_truncation_of_a_lazy_frame_is_rejected() -> None:
    frame = encode_frame([
        CAccept(src=1, view=2, owner=3, index=4, ballot=5, batch=BIG),
        CAck(src=1, view=2, owner=3, index=4, ballot=5),
    ])
    for cut in range(LAZY_FROM_BYTES, len(frame)):  # shorter ones are decoded whole
        with pytest.raises(DecodeError):
            decode_frame(frame[:cut], lazy_batches=True)
    with pytest.raises(DecodeError, match="trailing"):
        decode_frame(frame + b"\x00", lazy_batches=True)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_lazy_frames_decode_or_raise_and_their_batches_read_safely(
    data: st.DataObject,
) -> None:
    frame = bytearray(encode_frame([
        CAccept(src=1, view=2, owner=3, index=4, ballot=5, batch=BIG[:60]),
        CCommit(src=1, view=2, owner=3, index=4, ballot=5, batch=BIG[60:]),
    ]))
    for _ in range(data.draw(st.integers(1, 4))):
        frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    try:
        decoded = decode_frame(bytes(frame), lazy_batches=True)
    except DecodeError:
        return
    for message in decoded:
        batch = getattr(message, "batch", None)
        if batch is not None:
            commands = list(batch)  # never raises: the commands or nothing
            assert all(type(command) is Command for command in commands)
            assert encode_frame([message])  # and it passes on
