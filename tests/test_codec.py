"""Tests of ``consensus.codec``: round trips, hostile input, limits and stream framing."""

from __future__ import annotations

import dataclasses
import itertools
import pickle
import random
import types
from collections.abc import Callable
from typing import Any, get_args, get_origin, get_type_hints
from unittest import mock

import msgpack
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from consensus import codec, messages
from consensus.codec import (
    DEFAULT_MAX_FRAME,
    FORMAT_VERSION,
    INT64_MAX,
    MAX_BATCH,
    MAX_FRAME_MESSAGES,
    MAX_KEY_BYTES,
    MAX_KEYS_PER_COMMAND,
    MAX_OP_BYTES,
    TAGS,
    FrameReader,
    decode_frame,
    decode_message,
    decode_record,
    encode_frame,
    encode_frames,
    encode_message,
    encode_record,
    frame_to_wire,
)
from consensus.errors import ConfigError, DecodeError, LocalProtocolError, UnsupportedVersion
from consensus.messages import (
    NO_CL,
    CAccept,
    CAcceptedRecord,
    CAck,
    Catchup,
    CCommit,
    Command,
    CRequest,
    OAccept,
    OAcceptedRecord,
    OAck,
    OCommit,
    OEntry,
)
from consensus.packed_batch import PackedBatch

PEER_CLASSES: tuple[type, ...] = get_args(messages.PeerMessage)
RECORD_CLASSES: tuple[type, ...] = get_args(messages.Record)
NESTED_CLASSES: tuple[type, ...] = (Command, OEntry, messages.OVote, messages.CVote,
                                     messages.LearnedSlot, messages.MemberEntry)
ALL_CLASSES = (*PEER_CLASSES, *RECORD_CLASSES, *NESTED_CLASSES)

#: the int fields that may be -1 (NO_CL, or "none"), as documented in consensus.messages
MINUS_ONE_ALLOWED = {
    (OEntry, "owner"),
    (messages.OVote, "owner"),
    (messages.NewView, "owners"),
    (messages.NewViewRecord, "owners"),
    (messages.ExecutedRecord, "owners"),
    (messages.Heartbeat, "lease_request"),
    (messages.Vote, "accepted_view"),
    (messages.Vote, "c_high"),
    (messages.CPromise, "high"),
    (messages.RReply, "slot"),
    (messages.ConfigRecord, "closing_member"),
    (messages.MemberEntry, "replaces"),
    # EPaxos dependencies: -1 where an instance depends on none of a replica's
    *((cls, "deps") for cls in (messages.EPreAccept, messages.EPreAcceptReply,
                                 messages.EAccept, messages.ECommit, messages.EPrepareReply,
                                 messages.EInstanceRecord, messages.ETryPreAccept)),
}

#: the int fields that may also be -2 (SEAL: an order instance that ends its epoch)
SEAL_ALLOWED = {
    (OEntry, "owner"),
    (messages.OVote, "owner"),
    (messages.NewView, "owners"),
    (messages.NewViewRecord, "owners"),
    (messages.ExecutedRecord, "owners"),
}

# --------------------------------------------------------------------------- strategies
# Built from the dataclasses' own type hints, not from the codec's tables.

uints = st.one_of(st.integers(0, 3), st.integers(0, INT64_MAX), st.just(INT64_MAX))
minus_one_or_uints = st.one_of(st.just(-1), uints)


def field_names(cls: type) -> list[str]:
    """The fields of a message class: a dataclass's, or a named tuple's (``Command``)."""
    if issubclass(cls, tuple):
        return list(cls._fields)  # type: ignore[attr-defined]
    return [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]


def is_value_class(hint: Any) -> bool:
    return dataclasses.is_dataclass(hint) or hint is Command


def replaced(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` for any message class."""
    if isinstance(obj, tuple):
        return obj._replace(**changes)  # type: ignore[attr-defined]
    return dataclasses.replace(obj, **changes)


def field_strategy(cls: type, name: str, hint: Any) -> st.SearchStrategy[Any]:
    if (cls, name) not in MINUS_ONE_ALLOWED:
        return strategy_for_hint(hint)
    if hint is int:
        return minus_one_or_uints
    return st.lists(minus_one_or_uints, max_size=4).map(tuple)


def strategy_for_hint(hint: Any) -> st.SearchStrategy[Any]:
    if hint is int:
        return uints
    if hint is bool:
        return st.booleans()
    if hint is bytes:
        return st.binary(max_size=40)
    if hint is str:
        return st.text(max_size=8)
    if hint is type(None):
        return st.none()
    if is_value_class(hint):
        return strategy_for(hint)
    origin, args = get_origin(hint), get_args(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(strategy_for_hint(args[0]), max_size=4).map(tuple)
    if origin is types.UnionType:
        return st.one_of(*(strategy_for_hint(arg) for arg in args))
    if hint is PackedBatch:  # a batch as a lazy decoder keeps it: its commands' bytes
        return strategy_for_hint(tuple[Command, ...]).map(lambda c: PackedBatch(pack(c)))
    raise NotImplementedError(f"no strategy for {hint!r}")


def strategy_for(cls: type) -> st.SearchStrategy[Any]:
    hints = get_type_hints(cls)
    return st.builds(
        cls,
        **{name: field_strategy(cls, name, hints[name]) for name in field_names(cls)},
    )


peer_messages = st.one_of(*(strategy_for(cls) for cls in PEER_CLASSES))
records = st.one_of(*(strategy_for(cls) for cls in RECORD_CLASSES))

#: msgpack-able junk, for structure-aware fuzzing
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.binary(max_size=6),
)
junk = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=3), children, max_size=2)
    ),
    max_leaves=12,
)

DECODERS: list[Callable[[bytes], object]] = [decode_frame, decode_message, decode_record]


def decode_or_reject(decode: Callable[[bytes], Any], data: bytes) -> Any:
    """Decode ``data``; a DecodeError gives None, any other exception fails the test."""
    try:
        return decode(data)
    except DecodeError:
        return None


def check_reencodes(decode: Callable[[bytes], Any], result: Any) -> None:
    """Something that decoded must survive a clean round trip unchanged."""
    if decode is decode_frame:
        assert decode_frame(encode_frame(result)) == result
    elif decode is decode_message:
        assert decode_message(encode_message(result)) == result
    else:
        assert decode_record(encode_record(result)) == result


def pack(obj: object) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def raw_frame(*msgs: object) -> bytes:
    return pack([FORMAT_VERSION, list(msgs)])


CMD = Command(client_id=7, seq=8, op=b"0123456789abcdef", keys=("k1",), blind=True)
RAW_CMD = [7, 8, b"0123456789abcdef", ["k1"], True]


def raw_caccept(**changes: object) -> list[object]:
    fields: dict[str, object] = {
        "src": 0, "view": 1, "owner": 2, "index": 3, "ballot": 4, "batch": [RAW_CMD]
    }  # fmt: skip
    fields.update(changes)
    return [TAGS[CAccept], *fields.values()]


# --------------------------------------------------------------------------- the tables


def test_every_message_class_has_a_pinned_tag() -> None:
    defined = {
        obj
        for obj in vars(messages).values()
        if isinstance(obj, type) and is_value_class(obj)
    }
    assert set(TAGS) == defined == set(ALL_CLASSES)
    # the wire tags are part of the format: changing one breaks every peer and every log
    pinned = {
        "CAccept": 1,
        "CAck": 2,
        "CCommit": 3,
        "CRequest": 4,
        "OAccept": 5,
        "OAck": 6,
        "OCommit": 7,
        "Catchup": 8,
        "Heartbeat": 9,
        "LeaseGrant": 10,
        "VRequest": 11,
        "Vote": 12,
        "NewView": 13,
        "NewViewAck": 14,
        "CPrepare": 15,
        "CPromise": 16,
        "CNack": 17,
        "RRequest": 18,
        "RReply": 19,
        "Suspect": 20,
        "PreVote": 21,
        "PreVoteReply": 22,
        "SnapshotChunk": 23,
        "CatchupMarkers": 24,
        "LearnRequest": 25,
        "LearnReply": 26,
        "PaxosForward": 32,
        "PaxosAccept": 33,
        "PaxosAck": 34,
        "PaxosCommit": 35,
        "MenciusAccept": 40,
        "MenciusAck": 41,
        "MenciusSkip": 42,
        "PaxosPrepare": 43,
        "PaxosPromise": 44,
        "MenciusPrepare": 45,
        "MenciusPromise": 46,
        "EPreAccept": 48,
        "EPreAcceptReply": 49,
        "EAccept": 50,
        "EAcceptReply": 51,
        "ECommit": 52,
        "EPrepare": 53,
        "EPrepareReply": 54,
        "ETryPreAccept": 55,
        "ETryPreAcceptReply": 56,
        "CAcceptedRecord": 64,
        "OAcceptedRecord": 65,
        "ViewRecord": 66,
        "NewViewRecord": 67,
        "CPromiseRecord": 68,
        "ExecutedRecord": 69,
        "ConfigRecord": 70,
        "LearnedRecord": 71,
        "ReserveRecord": 72,
        "SlotAcceptedRecord": 80,
        "SkipRecord": 81,
        "PaxosPromiseRecord": 82,
        "MenciusPromiseRecord": 83,
        "EInstanceRecord": 84,
        "Command": 96,
        "OEntry": 97,
        "OVote": 98,
        "CVote": 99,
        "LearnedSlot": 100,
        "MemberEntry": 101,
    }
    assert {cls.__name__: tag for cls, tag in TAGS.items()} == pinned
    assert FORMAT_VERSION == 4
    # the records have not changed since 2 (4 added ReserveRecord)
    assert {2, 3, 4} == codec.RECORD_VERSIONS_READ


def test_the_batches_kept_packed_are_the_fields_typed_batch() -> None:
    """The rules a lazy decoder keeps packed are exactly the fields of messages and records
    typed ``messages.Batch`` (a core that takes a ``PackedBatch``); the codec checks it at
    import."""
    lazy = {
        (cls, name)
        for cls, layout in codec._LAYOUT.items()
        for name, ftype in layout
        if getattr(ftype, "lazy", False)
    }
    typed = {
        (cls, name)
        for cls in (*PEER_CLASSES, *RECORD_CLASSES)
        for name, hint in get_type_hints(cls).items()
        if PackedBatch in get_args(hint)
    }
    assert lazy == typed and (CAccept, "batch") in typed and (CAcceptedRecord, "batch") in typed
    drifted = {**codec._LAYOUT, CAccept: (*codec._LAYOUT[CAccept][:-1], ("batch", codec._BATCH))}
    with mock.patch.object(codec, "_LAYOUT", drifted), pytest.raises(RuntimeError, match="CAccept"):
        codec._check_tables()


def test_golden_encodings() -> None:
    # pins the byte format of version 4 (2: Vote.accepted_from; 3: CPromise.through; 4: an
    # Accept may leave before its sender's acceptance is durable, which its own ack reports)
    ack = CAck(src=1, view=2, owner=3, index=4, ballot=5)
    assert encode_message(ack).hex() == "920496020102030405"
    assert encode_frame([ack]).hex() == "92049196020102030405"
    accept = CAccept(src=0, view=0, owner=0, index=1, ballot=0, batch=(CMD,))
    assert encode_frame([accept]) == pack(
        [4, [[1, 0, 0, 0, 1, 0, [[7, 8, b"0123456789abcdef", ["k1"], True]]]]]
    )
    promise = messages.CPromise(src=1, view=0, owner=2, from_index=3, ballot=4, accepted=(),
                                high=5, through=messages.EVERY_INDEX)
    assert encode_message(promise) == pack([4, [16, 1, 0, 2, 3, 4, [], 5, (1 << 63) - 1]])
    rec = OAcceptedRecord(view=3, entries=(OEntry(slot=9, owner=NO_CL),))
    assert encode_record(rec) == pack([4, [65, 3, [[9, -1]]]])
    assert encode_record(messages.ReserveRecord(below=7)) == pack([4, [72, 7]])
    # records did not change in versions 3 and 4 (one was added): a log written by version 2
    # or 3 is read as it is
    assert decode_record(pack([2, [65, 3, [[9, -1]]]])) == rec
    assert decode_record(pack([3, [65, 3, [[9, -1]]]])) == rec
    for old in (2, 3):
        with pytest.raises(UnsupportedVersion):
            decode_message(pack([old, [2, 1, 2, 3, 4, 5]]))  # peers speak one version


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("cls", PEER_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_message_round_trip(cls: type, data: st.DataObject) -> None:
    msg = data.draw(strategy_for(cls))
    decoded = decode_message(encode_message(msg))
    assert type(decoded) is cls
    assert decoded == msg
    assert hash(decoded) == hash(msg)


@pytest.mark.parametrize("cls", RECORD_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_record_round_trip(cls: type, data: st.DataObject) -> None:
    rec = data.draw(strategy_for(cls))
    decoded = decode_record(encode_record(rec))
    assert type(decoded) is cls
    assert decoded == rec


@settings(max_examples=60, deadline=None)
@given(st.lists(peer_messages, max_size=8))
def test_frame_round_trip(msgs: list[Any]) -> None:
    decoded = decode_frame(encode_frame(msgs))
    assert decoded == msgs
    assert [type(m) for m in decoded] == [type(m) for m in msgs]


@settings(max_examples=40, deadline=None)
@given(st.lists(peer_messages, min_size=1, max_size=12), st.integers(0, 3000))
def test_frames_split_in_order_and_each_fits(msgs: list[Any], extra: int) -> None:
    largest = max(len(encode_frame([m])) for m in msgs)
    limit = largest + extra
    frames = encode_frames(msgs, limit)
    assert all(len(frame) <= limit for frame in frames)
    assert [m for frame in frames for m in decode_frame(frame)] == msgs
    if len(encode_frame(msgs)) <= limit:
        assert frames == [encode_frame(msgs)]  # the common case costs one encoding


def test_a_message_bigger_than_a_frame_is_refused_before_anything_is_sent() -> None:
    big = CCommit(src=0, view=0, owner=0, index=0, ballot=0,
                  batch=(Command(client_id=1, seq=0, op=b"x" * 5000),))
    small = Catchup(src=0, view=0, slot=3)
    with pytest.raises(LocalProtocolError, match=r"CCommit of \d+ bytes .* frame of 4096"):
        encode_frames([small, big], 4096)


BASELINE_MESSAGES = (
    messages.PaxosForward,
    messages.PaxosAccept,
    messages.PaxosAck,
    messages.PaxosCommit,
    messages.MenciusAccept,
    messages.MenciusAck,
    messages.MenciusSkip,
)
BASELINE_RECORDS = (messages.SlotAcceptedRecord, messages.SkipRecord)


def test_the_strategies_cover_the_baselines_messages() -> None:
    # the round-trip tests above are parametrized over these tuples: the baselines' types
    # (Multi-Paxos, Mencius) must be in them, with tags outside SDPaxos's
    assert set(BASELINE_MESSAGES) <= set(PEER_CLASSES)
    assert set(BASELINE_RECORDS) <= set(RECORD_CLASSES)
    assert all(32 <= TAGS[cls] <= 42 for cls in BASELINE_MESSAGES)
    assert all(80 <= TAGS[cls] <= 81 for cls in BASELINE_RECORDS)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(*(strategy_for(cls) for cls in BASELINE_MESSAGES)), min_size=1, max_size=6),
    st.one_of(*(strategy_for(cls) for cls in BASELINE_RECORDS)),
)
def test_baseline_messages_and_records_round_trip(msgs: list[Any], rec: Any) -> None:
    assert decode_frame(encode_frame(msgs)) == msgs
    assert decode_record(encode_record(rec)) == rec


def test_baseline_golden_encodings() -> None:
    accept = messages.MenciusAccept(
        src=1, view=0, slot=4, ballot=1, batch=(CMD,), skip_start=1, skip_stop=4
    )
    assert encode_message(accept) == pack([4, [40, 1, 0, 4, 1, [RAW_CMD], 1, 4]])
    commit = messages.PaxosCommit(src=0, view=0, slot=7, ballot=0, batch=None)
    assert encode_message(commit) == pack([4, [35, 0, 0, 7, 0, None]])
    noop = messages.PaxosCommit(src=0, view=0, slot=7, ballot=0, batch=())
    assert decode_message(encode_message(noop)) == noop
    assert encode_record(messages.SkipRecord(start=2, stop=11)) == pack([4, [81, 2, 11]])
    reject(raw_frame([TAGS[messages.MenciusSkip], 0, 0, 3, -1]), "MenciusSkip.skip_stop")


def test_decoded_objects_are_ordinary_frozen_dataclasses() -> None:
    msg = CCommit(src=1, view=2, owner=3, index=4, ballot=5, batch=(CMD, CMD))
    (decoded,) = decode_frame(encode_frame([msg]))
    assert isinstance(decoded, CCommit)
    assert decoded.batch is not None
    assert dataclasses.replace(decoded, src=9) == dataclasses.replace(msg, src=9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.src = 3  # type: ignore[misc]
    assert type(decoded.batch) is tuple
    assert type(decoded.batch[0].keys) is tuple
    assert repr(decoded) == repr(msg)


def test_ccommit_batch_none_and_empty_are_distinct() -> None:
    for batch in (None, ()):
        msg = CCommit(src=0, view=0, owner=0, index=0, ballot=0, batch=batch)
        decoded = decode_message(encode_message(msg))
        assert isinstance(decoded, CCommit)
        assert decoded.batch == batch


def test_extreme_values_round_trip() -> None:
    big = INT64_MAX
    msgs: list[messages.PeerMessage] = [
        CAccept(
            src=big,
            view=big,
            owner=big,
            index=big,
            ballot=big,
            batch=(
                Command(
                    client_id=big,
                    seq=0,
                    op=b"x" * MAX_OP_BYTES,
                    keys=("é" * (MAX_KEY_BYTES // 2),) * MAX_KEYS_PER_COMMAND,
                ),
            ),
        ),
        OAccept(src=0, view=0, entries=(OEntry(slot=big, owner=NO_CL), OEntry(slot=0, owner=big))),
        OAck(src=0, view=0, slots=(0, big)),
        CRequest(src=0, view=0, owner=0, index=0, keys=(), o_prefix=big),
    ]
    assert decode_frame(encode_frame(msgs)) == msgs


def test_largest_batch_and_frame_decode() -> None:
    batch = (CMD,) * MAX_BATCH
    msg = CAccept(src=0, view=0, owner=0, index=0, ballot=0, batch=batch)
    assert decode_frame(encode_frame([msg]))[0] == msg
    ack = Catchup(src=0, view=0, slot=0)
    assert decode_frame(encode_frame([ack] * MAX_FRAME_MESSAGES)) == [ack] * MAX_FRAME_MESSAGES


# --------------------------------------------------------------------------- fuzzing


@pytest.mark.parametrize("decode", DECODERS, ids=lambda f: f.__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_decode_or_raise_decode_error(
    decode: Callable[[bytes], Any], data: bytes
) -> None:
    result = decode_or_reject(decode, data)
    if result is not None:
        check_reencodes(decode, result)


@pytest.mark.parametrize("decode", DECODERS, ids=lambda f: f.__name__)
@settings(max_examples=100, deadline=None)
@given(
    tag=st.one_of(st.sampled_from(sorted(TAGS.values())), st.integers(-5, 40)),
    fields=st.lists(junk, max_size=8),
    wrap_in_frame=st.booleans(),
)
def test_random_structures_decode_or_raise_decode_error(
    decode: Callable[[bytes], Any], tag: int, fields: list[object], wrap_in_frame: bool
) -> None:
    body = [tag, *fields]
    data = pack([FORMAT_VERSION, [body] if wrap_in_frame else body])
    result = decode_or_reject(decode, data)
    if result is not None:
        check_reencodes(decode, result)


Mutation = tuple[str, int, int]
mutations = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "delete", "truncate", "set"]),
        st.integers(0, 1 << 16),
        st.integers(0, 255),
    ),
    min_size=1,
    max_size=4,
)


def mutate(data: bytes, ops: list[Mutation]) -> bytes:
    buf = bytearray(data)
    for op, where, value in ops:
        pos = where % (len(buf) + 1)
        if op == "flip" and buf:
            buf[pos % len(buf)] ^= 1 << (value % 8)
        elif op == "set" and buf:
            buf[pos % len(buf)] = value
        elif op == "insert":
            buf[pos:pos] = bytes([value])
        elif op == "delete" and buf:
            del buf[pos % len(buf)]
        elif op == "truncate":
            del buf[pos:]
    return bytes(buf)


@settings(max_examples=300, deadline=None)
@given(msgs=st.lists(peer_messages, min_size=1, max_size=4), ops=mutations)
def test_mutated_frames_decode_or_raise_decode_error(msgs: list[Any], ops: list[Mutation]) -> None:
    data = mutate(encode_frame(msgs), ops)
    result = decode_or_reject(decode_frame, data)
    if result is not None:
        check_reencodes(decode_frame, result)


@settings(max_examples=150, deadline=None)
@given(msg=peer_messages, rec=records, ops=mutations)
def test_mutated_messages_and_records(msg: Any, rec: Any, ops: list[Mutation]) -> None:
    for decode, data in (
        (decode_message, encode_message(msg)),
        (decode_record, encode_record(rec)),
        (decode_frame, encode_record(rec)),  # a record is never a frame
        (decode_record, encode_message(msg)),
    ):
        result = decode_or_reject(decode, mutate(data, ops))
        if result is not None:
            check_reencodes(decode, result)


def leaf_paths(obj: object, path: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Every position in a nested list structure (containers included)."""
    found = [path]
    if isinstance(obj, list):
        for i, item in enumerate(obj):
            found += leaf_paths(item, (*path, i))
    return found


def replaced_at(tree: Any, path: tuple[int, ...], replacement: object) -> Any:
    """``tree`` (nested lists) with its value at ``path`` replaced (in place)."""
    if not path:
        return replacement
    parent = tree
    for i in path[:-1]:
        parent = parent[i]
    parent[path[-1]] = replacement
    return tree


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=st.lists(peer_messages, min_size=1, max_size=3), data=st.data())
def test_one_value_replaced_in_a_valid_frame(msgs: list[Any], data: st.DataObject) -> None:
    """Structure-aware mutation: swap one value (any depth) of a valid frame for junk."""
    tree = msgpack.unpackb(encode_frame(msgs), use_list=True, raw=False)
    paths = leaf_paths(tree)
    path = data.draw(st.sampled_from(paths))
    result = decode_or_reject(decode_frame, pack(replaced_at(tree, path, data.draw(junk))))
    if result is not None:
        check_reencodes(decode_frame, result)


# --------------------------------------------------------------------------- eager and lazy
# ``lazy_batches`` keeps the batches an acceptor takes in packed; it must change nothing
# else: for any bytes, the eager and the lazy decoder accept and refuse alike (a kept batch
# whose commands are malformed reads as empty: that is the lazy decoder's refusal of it, so
# it is counted as one here), refuse with the same error, and decode to equal messages.


def takes_packed(cls: type) -> bool:
    """A message or record with a field typed ``messages.Batch`` (its cores take one packed)."""
    return any(PackedBatch in get_args(hint) for hint in get_type_hints(cls).values())


LAZY_PEER_CLASSES = tuple(cls for cls in PEER_CLASSES if takes_packed(cls))
LAZY_RECORD_CLASSES = tuple(cls for cls in RECORD_CLASSES if takes_packed(cls))
#: frames mostly of messages carrying batches: where the two decoders differ most
batch_frames = st.lists(
    st.one_of(*(strategy_for(cls) for cls in LAZY_PEER_CLASSES), peer_messages),
    min_size=1, max_size=4,
)
batch_records = st.one_of(*(strategy_for(cls) for cls in LAZY_RECORD_CLASSES), records)


def listed(decoded: Any) -> list[Any]:
    """A decoded frame's messages, or a decoded record alone."""
    return decoded if isinstance(decoded, list) else [decoded]


def kept_batch_paths(tree: Any) -> list[tuple[int, ...]]:
    """The positions of every value inside a batch a lazy decoder keeps packed, in a frame
    unpacked as lists (``leaf_paths``)."""
    classes = {TAGS[cls]: cls for cls in LAZY_PEER_CLASSES}
    paths: list[tuple[int, ...]] = []
    for i, raw in enumerate(tree[1]):
        cls = classes.get(raw[0])
        if cls is None:
            continue
        hints = get_type_hints(cls)
        for position, name in enumerate(field_names(cls), start=1):
            if PackedBatch in get_args(hints[name]) and isinstance(raw[position], list):
                paths += [(1, i, position, *path) for path in leaf_paths(raw[position])]
    return paths


class MalformedBatch(DecodeError):
    """A batch the lazy decoder kept packed reads as empty: its commands are malformed."""


def decode_lazily(decode: Callable[..., Any], data: bytes) -> Any:
    """``decode(data, lazy_batches=True)``, walking any frame (not only those of at least
    ``LAZY_FROM_BYTES``), then every kept batch read: one that reads as empty because its
    commands are malformed raises ``MalformedBatch``."""
    with mock.patch.object(codec, "LAZY_FROM_BYTES", 0):
        decoded = decode(data, lazy_batches=True)
    for value in listed(decoded):
        for field in dataclasses.fields(value):
            batch = getattr(value, field.name)
            if type(batch) is PackedBatch:
                assert isinstance(batch.commands, tuple)  # read: never raises
                if batch.malformed is not None:
                    raise MalformedBatch(batch.malformed)
    return decoded


def outcome(decode: Callable[[], Any]) -> tuple[Any, DecodeError | None]:
    """What ``decode()`` returned, or the ``DecodeError`` it raised (anything else fails)."""
    try:
        return decode(), None
    except DecodeError as error:
        return None, error


def assert_eager_and_lazy_agree(decode: Callable[..., Any], data: bytes) -> None:
    eager, eager_error = outcome(lambda: decode(data))
    lazy, lazy_error = outcome(lambda: decode_lazily(decode, data))
    if eager_error is None:
        assert lazy_error is None, f"lazy refused what eager took: {lazy_error}"
        assert lazy == eager
        assert [type(m) for m in listed(lazy)] == [type(m) for m in listed(eager)]
        reencode = encode_frame if decode is decode_frame else encode_record
        assert decode(reencode(lazy)) == eager  # what it logs and passes on reads the same
        event("accepted")
    elif isinstance(lazy_error, MalformedBatch):
        assert type(eager_error) is DecodeError  # the eager decoder refuses the frame at once
        event("refused at once by eager, a kept batch read as empty by lazy")
    else:
        assert lazy_error is not None, f"lazy took what eager refused: {eager_error}"
        assert type(lazy_error) is type(eager_error)
        assert str(lazy_error) == str(eager_error)  # in the same words
        event("refused by both")


@settings(max_examples=400, deadline=None)
@given(msgs=batch_frames, ops=mutations)
def test_eager_and_lazy_decoders_agree_on_mutated_frames(
    msgs: list[Any], ops: list[Mutation]
) -> None:
    frame = encode_frame(msgs)
    assert_eager_and_lazy_agree(decode_frame, frame)
    assert_eager_and_lazy_agree(decode_frame, mutate(frame, ops))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=batch_frames, data=st.data())
def test_eager_and_lazy_decoders_agree_on_one_value_replaced(
    msgs: list[Any], data: st.DataObject
) -> None:
    """A value at any depth (a command's field, a batch, a tag, the envelope) replaced by
    junk (msgpack values of any type and shape)."""
    tree = msgpack.unpackb(encode_frame(msgs), use_list=True, raw=False)
    in_batches = kept_batch_paths(tree)
    if in_batches and data.draw(st.booleans()):  # half the time: inside a batch
        path = data.draw(st.sampled_from(in_batches))
    else:
        path = data.draw(st.sampled_from(leaf_paths(tree)))
    assert_eager_and_lazy_agree(decode_frame, pack(replaced_at(tree, path, data.draw(junk))))


@settings(max_examples=300, deadline=None)
@given(rec=batch_records, ops=mutations)
def test_eager_and_lazy_decoders_agree_on_mutated_records(rec: Any, ops: list[Mutation]) -> None:
    data = encode_record(rec)
    assert_eager_and_lazy_agree(decode_record, data)
    assert_eager_and_lazy_agree(decode_record, mutate(data, ops))
    assert_eager_and_lazy_agree(decode_frame, data)  # a record is never a frame


def test_the_differential_tests_walk_lazily() -> None:
    """The tests above compare two decoders, not one with itself: under ``decode_lazily``
    a frame of a few bytes keeps its batch packed, and its malformed commands are counted."""
    accept = CAccept(src=0, view=0, owner=0, index=1, ballot=0, batch=(CMD,))
    with mock.patch.object(codec, "LAZY_FROM_BYTES", 0):
        [kept] = decode_frame(encode_frame([accept]), lazy_batches=True)
    assert isinstance(kept, CAccept) and type(kept.batch) is PackedBatch
    assert decode_lazily(decode_frame, encode_frame([accept])) == [accept]
    forged = raw_frame(raw_caccept(batch=[[7, -1, b"op", ["k"], True]]))
    with pytest.raises(MalformedBatch, match=r"batch\[0\].seq"):
        decode_lazily(decode_frame, forged)
    with pytest.raises(DecodeError, match=r"CAccept.batch\[0\].seq"):
        decode_frame(forged)



# --------------------------------------------------------------------------- targeted rejects


def reject(
    data: bytes, match: str | None = None, decode: Callable[[bytes], Any] = decode_frame
) -> str:
    with pytest.raises(DecodeError, match=match) as info:
        decode(data)
    return str(info.value)


def test_every_truncation_is_rejected() -> None:
    data = encode_frame(
        [
            CAccept(src=1, view=2, owner=3, index=4, ballot=5, batch=(CMD, CMD)),
            OAck(src=1, view=2, slots=(1, 2, 3)),
        ]
    )
    for cut in range(len(data)):
        reject(data[:cut])


def test_trailing_garbage_is_rejected() -> None:
    data = encode_frame([Catchup(src=0, view=0, slot=0)])
    reject(data + b"\x00", "trailing bytes")
    reject(encode_message(Catchup(src=0, view=0, slot=0)) + b"\xc0", decode=decode_message)


def test_unknown_tags_are_rejected() -> None:
    reject(raw_frame([99, 0, 0, 0]), "unknown tag 99")
    reject(raw_frame([TAGS[Command], 0, 0, b"", [], False]), "unknown tag 96")
    # records and peer messages do not mix
    rec = CAcceptedRecord(owner=0, index=0, ballot=0, batch=())
    reject(raw_frame(msgpack.unpackb(encode_record(rec))[1]), "CAcceptedRecord is not a peer")
    reject(encode_record(rec), "unknown tag 64", decode=decode_message)
    reject(encode_message(CAck(src=0, view=0, owner=0, index=0, ballot=0)), decode=decode_record)
    # a tag must be an int, not a bool that happens to equal one
    reject(raw_frame([True, 0, 0, 0]), r"expected \[tag")


@pytest.mark.parametrize("version", [0, 1, 2, 3, 5, 255, -1, 2**63])
def test_unknown_versions_raise_unsupported_version(version: int) -> None:
    cases = [
        (decode_frame, pack([version, []])),
        (decode_message, pack([version, [8, 0, 0, 0]])),
        (decode_frame, pack([version, "a future layout", {"x": 1}])),
    ]
    if version not in codec.RECORD_VERSIONS_READ:
        cases.append((decode_record, pack([version, [17, 0, []]])))
    for decode, data in cases:
        with pytest.raises(UnsupportedVersion) as info:
            decode(data)
        assert info.value.version == version
        assert info.value.supported == FORMAT_VERSION
        assert isinstance(info.value, DecodeError)


def test_unsupported_version_pickles() -> None:
    error = pickle.loads(pickle.dumps(UnsupportedVersion(3, 1)))
    assert (error.version, error.supported, str(error)) == (3, 1, str(UnsupportedVersion(3, 1)))


@pytest.mark.parametrize("envelope", [[True, []], ["1", []], [1.0, []], [None, []], [], {}, 1])
def test_malformed_envelope_is_a_plain_decode_error(envelope: object) -> None:
    with pytest.raises(DecodeError) as info:
        decode_frame(pack(envelope))
    assert not isinstance(info.value, UnsupportedVersion)


def test_wrong_field_count_is_rejected() -> None:
    reject(raw_frame([TAGS[Catchup], 0, 0]), "Catchup: expected 3 fields, got 2")
    reject(raw_frame([TAGS[Catchup], 0, 0, 0, 0]), "Catchup: expected 3 fields, got 4")
    reject(raw_frame(raw_caccept(batch=[[7, 8, b"op", ["k"]]])), r"CAccept.batch\[0\]: expected")
    reject(raw_frame([TAGS[OAccept], 0, 0, [[1, 2, 3]]]), r"OAccept.entries\[0\]: expected")


def test_bool_and_int_are_not_interchangeable() -> None:
    message = reject(raw_frame([TAGS[Catchup], True, 0, 0]))
    assert "Catchup.src: expected non-negative int64, got bool True" in message
    reject(raw_frame(raw_caccept(index=False)), "CAccept.index")
    reject(raw_frame(raw_caccept(batch=[[7, 8, b"op", ["k"], 1]])), r"batch\[0\].blind.*got 1")
    reject(raw_frame([TAGS[OAck], 0, 0, [1, True]]), r"OAck.slots\[1\].*got bool True")


def test_bytes_and_str_are_not_interchangeable() -> None:
    reject(raw_frame(raw_caccept(batch=[[7, 8, "op", ["k"], True]])), r"\.op: expected bin")
    reject(raw_frame(raw_caccept(batch=[[7, 8, b"op", [b"k"], True]])), r"\.keys\[0\]: expected")
    reject(raw_frame([TAGS[CRequest], 0, 0, 0, 0, ["a", b"b"], 0]), r"CRequest.keys\[1\]")
    reject(raw_frame([TAGS[CRequest], 0, 0, 0, 0, "ab", 0]), "CRequest.keys: expected array")


def test_other_wrong_types_are_rejected() -> None:
    reject(raw_frame(raw_caccept(index=1.0)), "got float 1.0")
    reject(raw_frame(raw_caccept(index=None)), "got nil")
    reject(raw_frame(raw_caccept(batch={"a": 1})), "CAccept.batch: expected array")
    reject(raw_frame(raw_caccept(batch=None)), "CAccept.batch: expected array")
    reject(raw_frame(raw_caccept(batch=[RAW_CMD, "x"])), r"CAccept.batch\[1\]")
    reject(pack([FORMAT_VERSION, {"a": 1}]), "frame: expected array")
    reject(pack([FORMAT_VERSION, [5]]), r"message: expected \[tag")
    reject(pack({1: 2}))  # non-str map key (strict_map_key)
    reject(b"\x92\x01\x91\xd6\xff\x00\x00\x00\x01")  # a msgpack timestamp extension
    reject(b"\x92\x01\x91\xa2\xff\xfe")  # invalid UTF-8
    reject(b"\xc1")  # never-used type byte


def test_negative_and_oversized_ints_are_rejected() -> None:
    message = reject(raw_frame(raw_caccept(index=-3)))
    assert message == "frame message 0: CAccept.index: expected non-negative int64, got -3"
    reject(raw_frame(raw_caccept(ballot=2**63)), "CAccept.ballot.*9223372036854775808")
    reject(raw_frame(raw_caccept(src=2**64 - 1)), "CAccept.src")
    reject(raw_frame(raw_caccept(batch=[[7, -1, b"", [], True]])), r"CAccept.batch\[0\].seq")
    reject(raw_frame([TAGS[OAck], 0, 0, [1, -1]]), r"OAck.slots\[1\]")
    reject(raw_frame([TAGS[Catchup], 0, -1, 0]), "Catchup.view")
    (accept,) = decode_frame(raw_frame(raw_caccept(ballot=INT64_MAX)))
    assert isinstance(accept, CAccept)
    assert accept.ballot == INT64_MAX


def test_no_cl_is_accepted_only_as_oentry_owner() -> None:
    for cls in (OAccept, OCommit):
        (msg,) = decode_frame(raw_frame([TAGS[cls], 0, 0, [[5, NO_CL], [6, 1]]]))
        assert isinstance(msg, OAccept | OCommit)
        assert msg.entries[0] == OEntry(slot=5, owner=NO_CL)
    rec = decode_record(pack([FORMAT_VERSION, [TAGS[OAcceptedRecord], 0, [[5, NO_CL]]]]))
    assert rec == OAcceptedRecord(view=0, entries=(OEntry(slot=5, owner=NO_CL),))
    (seal,) = decode_frame(raw_frame([TAGS[OAccept], 0, 0, [[5, messages.SEAL]]]))
    assert seal == OAccept(src=0, view=0, entries=(OEntry(slot=5, owner=messages.SEAL),))
    reject(raw_frame([TAGS[OAccept], 0, 0, [[5, -3]]]), r"entries\[0\].owner")
    reject(raw_frame([TAGS[OAccept], 0, 0, [[NO_CL, 1]]]), r"entries\[0\].slot")
    # everywhere else -1 is just a negative number
    reject(raw_frame(raw_caccept(owner=NO_CL)), "CAccept.owner")
    reject(raw_frame([TAGS[CAck], 0, 0, NO_CL, 0, 0]), "CAck.owner")
    reject(raw_frame([TAGS[CCommit], 0, 0, NO_CL, 0, 0, None]), "CCommit.owner")
    reject(raw_frame([TAGS[CRequest], 0, 0, NO_CL, 0, [], 0]), "CRequest.owner")
    bad_owner = pack([FORMAT_VERSION, [TAGS[CAcceptedRecord], NO_CL, 0, 0, []]])
    reject(bad_owner, "owner", decode=decode_record)


def test_size_limits() -> None:
    def caccept_with(cmd: list[object]) -> bytes:
        return raw_frame(raw_caccept(batch=[cmd]))

    decode_frame(caccept_with([0, 0, b"x" * MAX_OP_BYTES, [], True]))
    reject(caccept_with([0, 0, b"x" * (MAX_OP_BYTES + 1), [], True]), "max_bin_len")
    decode_frame(caccept_with([0, 0, b"", ["é" * (MAX_KEY_BYTES // 2)], True]))
    reject(caccept_with([0, 0, b"", ["é" * (MAX_KEY_BYTES // 2) + "x"], True]), "max_str_len")
    decode_frame(caccept_with([0, 0, b"", ["k"] * MAX_KEYS_PER_COMMAND, True]))
    reject(caccept_with([0, 0, b"", ["k"] * (MAX_KEYS_PER_COMMAND + 1), True]), "at most 64")
    reject(raw_frame(raw_caccept(batch=[RAW_CMD] * (MAX_BATCH + 1))), "max_array_len")
    catchup = [TAGS[Catchup], 0, 0, 0]
    reject(raw_frame(*[catchup] * (MAX_FRAME_MESSAGES + 1)), "max_array_len")


def test_hostile_length_headers_allocate_little() -> None:
    # an array32 header claiming 2**32-1 elements, then nothing
    reject(b"\x92\x01\xdd\xff\xff\xff\xff", "max_array_len")
    # str and bin headers: msgpack wants the bytes present before it allocates
    reject(b"\x92\x01\x91\xdb\xff\xff\xff\xff", "incomplete")
    reject(b"\x92\x01\x91\xc6\xff\xff\xff\xff", "incomplete")
    reject(b"\x92\x01\xdf\xff\xff\xff\xff", "max_map_len")
    # nested arrays each claiming 65536 elements: limited by the input's own length
    reject(b"\x92\x01" + b"\xdd\x00\x01\x00\x00" * 200, "max_array_len")


def test_deeply_nested_garbage() -> None:
    reject(b"\x91" * 100_000, "nested too deeply")
    reject(b"\x92\x01\x91" + b"\x91" * 100_000 + b"\x01")
    nested: object = 1
    for _ in range(100):  # deep, but within msgpack's stack
        nested = [nested]
    reject(raw_frame(raw_caccept(batch=nested)), r"CAccept.batch\[0\]")
    reject(raw_frame(nested), "frame message 0")
    # error messages describe values without printing them whole
    assert len(reject(raw_frame(raw_caccept(index=nested)))) < 100


def test_decode_accepts_buffer_types() -> None:
    data = encode_frame([Catchup(src=0, view=0, slot=1)])
    assert decode_frame(memoryview(data)) == decode_frame(bytearray(data)) == decode_frame(data)  # type: ignore[arg-type]


def minimal_instance(cls: type) -> Any:
    """An instance with every field at its smallest valid value (one item per tuple)."""
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for name in field_names(cls):
        values[name] = minimal_value(hints[name])
    return cls(**values)


def minimal_value(hint: Any) -> Any:
    if hint in (int, bool, bytes, str):
        return {int: 0, bool: False, bytes: b"", str: ""}[hint]
    if is_value_class(hint):
        return minimal_instance(hint)
    origin, args = get_origin(hint), get_args(hint)
    if origin is tuple:
        return (minimal_value(args[0]),)
    if origin is types.UnionType:
        return minimal_value(args[0])
    raise NotImplementedError(hint)


def int_field_cases() -> list[tuple[type, str, bool]]:
    """(class, field, is a tuple of ints) for every int-valued field of every tagged class."""
    cases = []
    for cls in (*PEER_CLASSES, *RECORD_CLASSES):
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if hints[f.name] is int:
                cases.append((cls, f.name, False))
            elif hints[f.name] == tuple[int, ...]:
                cases.append((cls, f.name, True))
    return cases


@pytest.mark.parametrize(
    ("cls", "name", "in_tuple"),
    int_field_cases(),
    ids=lambda v: v.__name__ if isinstance(v, type) else str(v),
)
def test_every_int_field_checks_sign_range_and_type(cls: type, name: str, in_tuple: bool) -> None:
    is_record = cls in RECORD_CLASSES
    encode: Callable[[Any], bytes] = encode_record if is_record else encode_message
    decode: Callable[[bytes], Any] = decode_record if is_record else decode_message
    base = minimal_instance(cls)
    position = [f.name for f in dataclasses.fields(cls)].index(name) + 1

    def with_value(value: object) -> bytes:
        version, body = msgpack.unpackb(encode(base), use_list=True)
        body[position] = [value] if in_tuple else value
        return pack([version, body])

    where = f"{cls.__name__}.{name}" + (r"\[0\]" if in_tuple else "")
    assert decode(with_value(INT64_MAX)) == dataclasses.replace(
        base, **{name: (INT64_MAX,) if in_tuple else INT64_MAX}
    )
    below = -3 if (cls, name) in SEAL_ALLOWED else -2
    for bad in (True, False, 2**63, 2**64 - 1, below, 1.0, "0", None):
        reject(with_value(bad), where, decode=decode)
    if (cls, name) in SEAL_ALLOWED:
        assert getattr(decode(with_value(-2)), name) == ((-2,) if in_tuple else -2)
    if (cls, name) in MINUS_ONE_ALLOWED:
        assert getattr(decode(with_value(-1)), name) == ((-1,) if in_tuple else -1)
    else:
        reject(with_value(-1), f"{where}: expected non-negative int64, got -1", decode=decode)


def test_nested_values_report_their_path() -> None:
    promise = minimal_instance(messages.CPromise)
    version, body = msgpack.unpackb(encode_message(promise), use_list=True)
    body[6][0][2][0][1] = -5  # accepted[0].batch[0].seq
    reject(
        pack([version, body]), r"CPromise.accepted\[0\].batch\[0\].seq: .* got -5", decode_message
    )


# --------------------------------------------------------------------------- encoding misuse


def test_encoding_the_wrong_class_is_a_type_error() -> None:
    rec = OAcceptedRecord(view=0, entries=())
    ack = CAck(src=0, view=0, owner=0, index=0, ballot=0)
    with pytest.raises(TypeError, match="OAcceptedRecord"):
        encode_message(rec)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Command"):
        encode_frame([ack, CMD])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="CAck"):
        encode_record(ack)  # type: ignore[arg-type]


def test_encode_frame_limits_messages() -> None:
    catchup = Catchup(src=0, view=0, slot=0)
    with pytest.raises(LocalProtocolError):
        encode_frame([catchup] * (MAX_FRAME_MESSAGES + 1))
    assert decode_frame(encode_frame([])) == []


# --------------------------------------------------------------------------- stream framing


def wire(*payloads: bytes) -> bytes:
    return b"".join(frame_to_wire(p) for p in payloads)


def test_frame_to_wire_prefixes_big_endian_length() -> None:
    assert frame_to_wire(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame_to_wire(b"") == b"\x00\x00\x00\x00"
    with pytest.raises(LocalProtocolError):
        frame_to_wire(b"x" * 11, max_frame=10)


@settings(max_examples=100, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=50), max_size=6),
    cuts=st.lists(st.integers(0, 400), max_size=10),
)
def test_frame_reader_reassembles_any_chunking(payloads: list[bytes], cuts: list[int]) -> None:
    stream = wire(*payloads)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    reader = FrameReader()
    got: list[bytes] = []
    for start, end in itertools.pairwise(points):
        got += reader.feed(stream[start:end])
    assert got == payloads
    assert reader.buffered == 0
    assert all(type(p) is bytes for p in got)


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=60), max_size=6),
    cuts=st.lists(st.integers(0, 500), max_size=12),
    max_frame=st.integers(0, 64),
    kind=st.sampled_from([bytes, bytearray, memoryview]),
)
def test_frame_reader_holds_exactly_the_partial_frame_and_refuses_at_the_header(
        payloads: list[bytes], cuts: list[int], max_frame: int, kind: type) -> None:
    # after every read: the payloads completed so far came out (as bytes, whatever the read
    # was), the rest of the stream is held; an over-limit length raises once its whole header
    # arrived (the frames before it returned by earlier reads only), and poisons the reader
    stream = wire(*payloads)
    ends = list(itertools.accumulate(len(p) + 4 for p in payloads))
    over = next((i for i, p in enumerate(payloads) if len(p) > max_frame), None)
    refused_at = None if over is None else (ends[over - 1] if over else 0) + 4
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    reader = FrameReader(max_frame=max_frame)
    got: list[bytes] = []
    for start, end in itertools.pairwise(points):
        if refused_at is not None and end >= refused_at:
            with pytest.raises(DecodeError, match="over the limit"):
                reader.feed(kind(stream[start:end]))
            assert reader.poisoned and reader.buffered == 0
            assert got == [p for p, e in zip(payloads, ends, strict=True) if e <= start]
            return
        got += reader.feed(kind(stream[start:end]))
        done = [p for p, e in zip(payloads, ends, strict=True) if e <= end]
        assert got == done and all(type(p) is bytes for p in got)
        assert reader.buffered == end - (ends[len(done) - 1] if done else 0)
    assert got == payloads and refused_at is None


def test_frame_reader_byte_by_byte_and_merged() -> None:
    payloads = [encode_frame([Catchup(src=0, view=0, slot=i)]) for i in range(3)]
    stream = wire(*payloads)
    reader = FrameReader()
    got: list[bytes] = []
    for i in range(len(stream)):
        got += reader.feed(stream[i : i + 1])
    assert got == payloads
    assert FrameReader().feed(stream) == payloads  # all merged into one read
    reader = FrameReader()
    assert reader.feed(stream[:-1]) == payloads[:2]
    assert reader.buffered == len(frame_to_wire(payloads[2])) - 1
    assert reader.feed(stream[-1:]) == payloads[2:]


def test_frame_reader_rejects_an_over_limit_length_and_stays_poisoned() -> None:
    reader = FrameReader(max_frame=10)
    assert reader.feed(wire(b"x" * 10)) == [b"x" * 10]
    with pytest.raises(DecodeError, match="frame length 11 is over the limit 10"):
        reader.feed(b"\x00\x00\x00\x0b")  # rejected from the header alone
    assert reader.poisoned
    assert reader.buffered == 0
    with pytest.raises(DecodeError, match="already failed"):
        reader.feed(wire(b"ok"))
    with pytest.raises(DecodeError):
        FrameReader().feed(b"\xff\xff\xff\xff")  # default limit: 16 MiB
    assert (
        FrameReader().feed(frame_to_wire(b"y" * DEFAULT_MAX_FRAME))[0] == b"y" * DEFAULT_MAX_FRAME
    )


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, True])
def test_frame_reader_checks_its_limit(bad: Any) -> None:
    with pytest.raises(ConfigError):
        FrameReader(max_frame=bad)


def test_generated_code_is_inspectable() -> None:
    assert "def _dec_CAccept(v):" in codec._GENERATED_SOURCE


# --------------------------------------------------------------------------- largest legal sizes


def _largest(ftype: Any) -> Any:
    """A field value at the decoder's limits: every array full, the first nested value of an
    array itself at its largest (the others minimal, so that the whole stays a few MB)."""
    if isinstance(ftype, str):
        return {
            "uint": INT64_MAX,
            "no_cl": INT64_MAX,
            "none": INT64_MAX,
            "bin": b"\xff" * MAX_OP_BYTES,
            "bool": True,
            "str": "k" * MAX_KEY_BYTES,
        }[ftype]
    if isinstance(ftype.item, str):
        item = "é" * (MAX_KEY_BYTES // 2) if ftype.item == "str" else _largest(ftype.item)
        return (item,) * ftype.limit
    first = _instance(ftype.item, largest=True)
    return (first,) + (_instance(ftype.item, largest=False),) * (ftype.limit - 1)


def _instance(cls: type, *, largest: bool = True) -> Any:
    if not largest:  # the smallest legal value of a nested class
        return cls(**{
            name: b"" if ftype == "bin" else False if ftype == "bool" else
            "" if ftype == "str" else () if not isinstance(ftype, str) else 0
            for name, ftype in codec._LAYOUT[cls]
        })
    return cls(**{name: _largest(ftype) for name, ftype in codec._LAYOUT[cls]})


def _one_past(value: Any, ftype: Any) -> Any:
    if ftype == "bin":
        return value + b"\x00"
    return value + value[-1:]


@pytest.mark.parametrize("cls", [*PEER_CLASSES, *RECORD_CLASSES], ids=lambda c: c.__name__)
def test_every_class_round_trips_at_its_largest_legal_size(cls: type) -> None:
    """Each array at its limit (arrays of nested values with their first value at its limit
    too), each bin at MAX_OP_BYTES, each key at MAX_KEY_BYTES, each int at INT64_MAX."""
    value = _instance(cls)
    if cls in PEER_CLASSES:
        assert decode_message(encode_message(value)) == value
    else:
        assert decode_record(encode_record(value)) == value


def _sized_fields() -> list[tuple[type, str, Any]]:
    return [
        (cls, name, ftype)
        for cls in (*PEER_CLASSES, *RECORD_CLASSES, *NESTED_CLASSES)
        for name, ftype in codec._LAYOUT[cls]
        if (ftype == "bin" or not isinstance(ftype, str)) and cls is not Command
    ]


@pytest.mark.parametrize("core", ["sdpaxos", "multipaxos", "mencius"])
@pytest.mark.parametrize(
    "command",
    [
        Command(client_id=1, seq=1, op=b"x" * (MAX_OP_BYTES + 1), keys=(), blind=True),
        Command(client_id=1, seq=1, op=b"", keys=("k",) * (MAX_KEYS_PER_COMMAND + 1), blind=True),
        Command(client_id=1, seq=1, op=b"", keys=("é" * MAX_KEY_BYTES,), blind=True),
    ],
    ids=["op", "keys", "key-bytes"],
)
def test_a_command_the_decoder_would_refuse_never_enters_a_core(
    core: str, command: Command
) -> None:
    """The encoder leaves a Command's own limits to the cores' entry points: every core's
    ``propose`` and ``read`` refuse such a command, so no batch can hold one."""
    from consensus.config import ProtocolConfig
    from consensus.protocol.registry import load_core

    replica = load_core(core)(ProtocolConfig(replicas=3), 0, rng=random.Random(0))
    with pytest.raises(LocalProtocolError):
        replica.propose(command, 0)
    with pytest.raises(LocalProtocolError):
        replica.read(command, 0)
    assert not replica.ready().persist


@pytest.mark.parametrize(
    ("cls", "name", "ftype"), _sized_fields(), ids=lambda v: getattr(v, "__name__", str(v))
)
def test_the_encoder_refuses_what_the_decoder_would_refuse(
    cls: type, name: str, ftype: Any
) -> None:
    """One value (or byte) past a field's limit is a LocalProtocolError at encoding, for a
    field of a message and of every nested value in it, never a frame the peer rejects."""
    holders = [c for c in (*PEER_CLASSES, *RECORD_CLASSES) if c is cls] or [
        c
        for c in (*PEER_CLASSES, *RECORD_CLASSES)
        if any(getattr(t, "item", None) is cls for _, t in codec._LAYOUT[c])
        or (cls is Command and any(getattr(t, "item", None) is messages.CVote
                                   for _, t in codec._LAYOUT[c]))
    ]
    assert holders, f"{cls.__name__} occurs in no message or record"
    for holder in holders:
        base = _instance(cls, largest=False)
        field_value = _largest(ftype)
        if ftype != "bin" and isinstance(ftype.item, type):
            field_value = (_instance(ftype.item, largest=False),) * ftype.limit
        bad = replaced(base, **{name: _one_past(field_value, ftype)})
        outer = _wrap(holder, cls, bad)
        encode = encode_message if holder in PEER_CLASSES else encode_record
        with pytest.raises(LocalProtocolError, match=name):
            encode(outer)
        good = _wrap(holder, cls, replaced(base, **{name: field_value}))
        decode = decode_message if holder in PEER_CLASSES else decode_record
        assert decode(encode(good)) == good


def _wrap(holder: type, cls: type, value: Any) -> Any:
    """A minimal ``holder`` that contains ``value`` (of ``cls``) where its type goes."""
    if holder is cls:
        return value
    fields_: dict[str, Any] = {}
    for name, ftype in codec._LAYOUT[holder]:
        item = getattr(ftype, "item", None)
        if item is cls:
            fields_[name] = (value,)
        elif item is messages.CVote and cls is Command:
            fields_[name] = (messages.CVote(index=0, ballot=0, batch=(value,)),)
        else:
            fields_[name] = _instance(holder, largest=False).__getattribute__(name)
    return holder(**fields_)
