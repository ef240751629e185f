"""Tests of how ``consensus.codec`` carries commands: ``Command`` is a named tuple whose fields
are its wire array, so a batch is encoded with no per-command work and a decoded command is
built in one call, equal (and hashing equal) to the one its leader built."""

from __future__ import annotations

import msgpack
import pytest

from consensus import codec
from consensus.codec import (
    checked_command,
    decode_frame,
    decode_record,
    encode_frame,
    encode_record,
)
from consensus.errors import DecodeError
from consensus.messages import CAccept, CAcceptedRecord, CAck, CCommit, Command, PaxosAccept


def batch_of(count: int) -> tuple[Command, ...]:
    return tuple(
        Command(client_id=7, seq=seq, op=b"op%d" % seq, keys=(f"k{seq}",), blind=seq % 2 == 0)
        for seq in range(count)
    )


def test_a_batch_is_its_own_wire_form() -> None:
    batch = batch_of(4)
    assert codec._generated["_enc_seq_Command"](batch, codec.MAX_BATCH, "batch") is batch
    accept = CAccept(src=0, view=0, owner=0, index=3, ballot=0, batch=batch)
    # the array a peer reads is exactly [client_id, seq, op, keys, blind] per command
    _version, [message] = msgpack.unpackb(encode_frame([accept]))
    assert message[-1] == [[7, s, b"op%d" % s, [f"k{s}"], s % 2 == 0] for s in range(4)]


def test_decoded_commands_are_commands_equal_to_the_sent_ones() -> None:
    sent = PaxosAccept(src=1, view=0, slot=9, ballot=4, batch=batch_of(3))
    [received] = decode_frame(encode_frame([sent]))
    assert isinstance(received, PaxosAccept) and received == sent
    assert all(type(command) is Command for command in received.batch)
    assert {*received.batch} == {*sent.batch}  # hashes agree too
    assert received.batch[1].op == b"op1" and received.batch[1].keys == ("k1",)
    record = CAcceptedRecord(owner=1, index=9, ballot=4, batch=received.batch)
    assert decode_record(encode_record(record)) == record


def test_checked_command_is_the_keyword_built_command() -> None:
    built = checked_command(5, 6, b"x", ("a", "b"), True)
    assert type(built) is Command
    assert built == Command(client_id=5, seq=6, op=b"x", keys=("a", "b"), blind=True)


@pytest.mark.parametrize(
    "bad",
    [
        [7, 1, b"op", ["k"]],  # a field short
        [7, 1, b"op", ["k"], True, 0],  # one too many
        [7, 1, "op", ["k"], True],  # op must be bin
        [7, -1, b"op", ["k"], True],  # seq must be non-negative
        [7, 1, b"op", [3], True],  # keys are str
        [7, 1, b"op", ["k"], 1],  # blind is a bool
    ],
)
def test_a_malformed_command_in_a_batch_fails_the_frame(bad: list[object]) -> None:
    frame = msgpack.packb([codec.FORMAT_VERSION, [[codec.TAGS[CAccept], 0, 0, 0, 0, 0, [bad]]]])
    with pytest.raises(DecodeError, match="batch"):
        decode_frame(frame)


def _whole(message: object, encoders: dict[type, object]) -> bytes:
    """The message packed in one go, as the codec did before it spliced batches in."""
    encoder = encoders[type(message)]
    packed: bytes = msgpack.packb((codec.FORMAT_VERSION, encoder(message)))  # type: ignore[operator]
    return packed


def test_a_leader_packs_a_batch_once_for_every_peer_its_log_and_its_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    packed: list[int] = []
    pack = codec._packb

    def counting(value: object) -> bytes:
        if isinstance(value, tuple) and value and type(value[0]) is Command:
            packed.append(len(value))
        result: bytes = pack(value)
        return result

    monkeypatch.setattr(codec, "_packb", counting)
    batch = batch_of(codec.SPLICE_FROM + 3)
    accept = CAccept(src=0, view=0, owner=0, index=3, ballot=0, batch=batch)
    frames = [encode_frame([accept]) for _peer in range(4)]
    record = CAcceptedRecord(owner=0, index=3, ballot=0, batch=batch)
    logged = encode_record(record)
    commit = CCommit(src=0, view=0, owner=0, index=3, ballot=0, batch=batch)
    committed = encode_frame([commit, CAck(src=0, view=0, owner=1, index=0, ballot=0)])
    assert packed == [len(batch)]
    # the same bytes as packing each message whole
    assert frames == [_whole_frame([accept])] * 4
    assert logged == _whole(record, codec._RECORD_ENCODERS)  # type: ignore[arg-type]
    assert committed == _whole_frame([commit, CAck(src=0, view=0, owner=1, index=0, ballot=0)])
    assert decode_frame(frames[0]) == [accept] and decode_record(logged) == record


def _whole_frame(msgs: list[object]) -> bytes:
    body = [codec._PEER_ENCODERS[type(m)](m) for m in msgs]  # type: ignore[index]
    packed: bytes = msgpack.packb((codec.FORMAT_VERSION, body))
    return packed


def test_every_class_carrying_a_batch_packs_as_it_did_whole() -> None:
    batch = batch_of(codec.SPLICE_FROM)
    for cls in codec._SPLICED:
        fields = {
            name: (batch if isinstance(ftype, codec._Array) and ftype.item is Command
                   else () if isinstance(ftype, codec._Array) else 1)
            for name, ftype in codec._LAYOUT[cls]
        }
        message = cls(**fields)
        if cls in codec._RECORD_PACKERS:
            assert encode_record(message) == _whole(message, codec._RECORD_ENCODERS)  # type: ignore[arg-type]
        else:
            assert encode_frame([message]) == _whole_frame([message])


def test_packed_batches_kept_stay_bounded_and_name_their_batch() -> None:
    for index in range(codec.PACKED_BATCHES_KEPT + 20):
        encode_frame([CAccept(src=0, view=0, owner=0, index=index, ballot=0,
                              batch=batch_of(codec.SPLICE_FROM))])
    kept = codec._packed_batches
    assert len(kept) <= codec.PACKED_BATCHES_KEPT
    assert all(id(batch) == key for key, (batch, _) in kept.items())
    assert codec._packed_bytes[0] == sum(len(packed) for _, packed in kept.values())


@pytest.mark.parametrize("keys", [(), ("k",), ("kä", "", "ключ"),
                                  tuple(f"key{i}" for i in range(64)), ("x" * 300,)])
def test_a_command_weighs_its_op_its_keys_characters_and_sixteen(keys: tuple[str, ...]) -> None:
    # what a batch's byte bound counts (consensus.protocol.batch): characters, not UTF-8 bytes
    command = Command(client_id=1, seq=2, op=b"o" * 37, keys=keys)
    assert command.size() == 37 + sum(len(key) for key in keys) + 16
