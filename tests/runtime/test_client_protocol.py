"""Tests of the client port's request decoding (``consensus.runtime.client_protocol``): a
request decoded once is the request its client encoded, built without its ``__init__``."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from consensus.errors import DecodeError
from consensus.messages import MAX_KEY_BYTES, MAX_OP_BYTES, Command
from consensus.runtime.client_protocol import (
    NO_REQUEST,
    BadRequest,
    ClientRequest,
    Cut,
    decode_partition,
    decode_request,
    decode_response,
    empty_ok_response_wire,
    encode_partition,
    ok_response_wire,
)


def test_a_decoded_request_is_the_encoded_one() -> None:
    sent = ClientRequest(7, "cmd", Command(client_id=3, seq=9, op=b"op", keys=("a", "b"),
                                           blind=True))
    received = decode_request(sent.encode())
    assert type(received) is ClientRequest and type(received.command) is Command
    assert received == sent and hash(received) == hash(sent)
    with pytest.raises(dataclasses.FrozenInstanceError):
        received.req_id = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    "fields",
    [
        [7, "cmd", -3, 9, b"op", [], True],  # a negative client id
        [7, "nope", 3, 9, b"op", [], True],  # an unknown kind
        [7, "cmd", 3, 9, "op", [], True],  # op must be bytes
        [7, "cmd", 3, 9, b"op", [1], True],  # keys are strings
        [7, "cmd", 3, 9, b"op", [], 1],  # blind is a bool
    ],
)
def test_a_malformed_request_is_refused(fields: list[object]) -> None:
    with pytest.raises(DecodeError):
        decode_request(msgpack.packb(fields, use_bin_type=True))


def test_a_partition_op_is_a_two_way_list_or_a_one_way_map() -> None:
    both = frozenset({1, 2})
    assert decode_partition(msgpack.packb([1, 2]), 3) == Cut(both, both)
    assert decode_partition(msgpack.packb([]), 3) == Cut(frozenset(), frozenset())  # heal
    one_way = decode_partition(encode_partition([2], []), 3)
    assert one_way == Cut(drop_from=frozenset({2}), drop_to=frozenset())
    assert decode_partition(encode_partition([0], [1, 2]), 3) == Cut(frozenset({0}), both)


@pytest.mark.parametrize(
    "op",
    [
        msgpack.packb([3]),  # not a replica of three
        msgpack.packb([True]),  # a bool is no id
        msgpack.packb({"from": [1]}),  # both directions must be given
        msgpack.packb({"from": [1], "into": [2]}),
        msgpack.packb({"from": 1, "to": []}),
        msgpack.packb([0, 1, 2, 0]),  # longer than the cluster
        b"\xc1",  # not msgpack
    ],
)
def test_a_malformed_partition_op_is_refused(op: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_partition(op, 3)


@pytest.mark.parametrize(("fields", "req_id", "reason"), [
    ([7, "cmd", 3, 9, b"x" * (MAX_OP_BYTES + 1), [], False], 7,
     f"op of {MAX_OP_BYTES + 1} bytes is over the limit of {MAX_OP_BYTES} bytes"),
    ([8, "cmd", 3, 9, b"op", ["k" * (MAX_KEY_BYTES + 1)], False], 8,
     f"a key of {MAX_KEY_BYTES + 1} bytes is over the limit of {MAX_KEY_BYTES} bytes"),
    ([9, "nope", 3, 9, b"op", [], False], 9, "kind must be one of"),
    ([-1, "cmd", 3, 9, b"op", [], False], NO_REQUEST, "req_id must be a non-negative int64"),
    (["x"], NO_REQUEST, "request must be"),
])
def test_a_refused_request_is_answered_under_its_own_id_naming_the_limit(
    fields: list[object], req_id: int, reason: str
) -> None:
    # issue 34: a 1 MiB put was answered under req_id 0 with msgpack's words ("exceeds
    # max_bin_len"): the client matched no request, and timed out with an empty reason
    with pytest.raises(BadRequest) as refused:
        decode_request(msgpack.packb(fields, use_bin_type=True))
    assert refused.value.req_id == req_id and reason in str(refused.value)


@pytest.mark.parametrize("req_id", [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32,
                                    2**63 - 1, 123_456_789])
def test_the_empty_ok_answer_is_the_ok_answer_of_an_empty_payload(req_id: int) -> None:
    wire = empty_ok_response_wire(req_id)
    assert wire == ok_response_wire(req_id, b"", -1)
    assert int.from_bytes(wire[:4], "big") == len(wire) - 4
    response = decode_response(wire[4:])
    assert (response.req_id, response.status, response.payload, response.position) == (
        req_id, "ok", b"", -1)
