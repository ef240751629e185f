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
from consensus.messages import CAccept, CAcceptedRecord, Command, PaxosAccept


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
