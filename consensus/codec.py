"""Wire and write-ahead-log encoding of every message and record: msgpack, never pickle.

Format (``FORMAT_VERSION`` 4)
-----------------------------
Everything is msgpack. A dataclass instance is an array of its fields in declaration order
(see ``consensus.messages``), preceded by its type tag from ``TAGS`` wherever the type is not
known statically::

    frame    := [FORMAT_VERSION, [message, ...]]      encode_frame / decode_frame
    single   := [FORMAT_VERSION, message]             encode_message / decode_message
    logged   := [FORMAT_VERSION, record]              encode_record / decode_record (the WAL)
    message  := [tag, field, ...]                     a peer message (tags 1..63)
    record   := [tag, field, ...]                     a durable record (tags 64..95)
    Command  := [client_id, seq, op, keys, blind]     nested values (tags 96..127 reserved):
    OEntry   := [slot, owner]                         untagged, their type is known
    OVote    := [slot, owner, ballot]
    CVote    := [index, ballot, batch]

Field types: every field has a rule in ``_LAYOUT``, and the rules are written next to it
(``_RULES``, ``_Array``): ids, indices, slots, views, ballots, counters and clock readings
are non-negative ints that fit in int64; ``-1`` is accepted only where
``consensus.messages`` gives it a meaning (``NO_CL`` as the owner of an order instance, and
there ``SEAL``, -2, too; "none" in a few fields); ``op`` is bin, keys are str, ``blind`` is
bool, a batch is an array of commands (``CCommit.batch`` may be nil) and every tuple is an
array.

Every future format keeps the ``[version, ...]`` envelope, so an old reader reports
``UnsupportedVersion`` rather than garbage. Adding, removing or reordering a field of any class
changes the format: update ``_LAYOUT`` and bump ``FORMAT_VERSION`` (a layout that no longer
matches ``consensus.messages``, or a message class without a tag, fails at import). A new
class takes a new, never used tag and needs no bump (an old reader rejects it as an unknown
tag): the baselines' messages use tags 32..46 and records 80..83, EPaxos's 48..56 and 84.
A bump that leaves every record's layout as it was adds the old version to
``RECORD_VERSIONS_READ``, so data directories survive the upgrade; peers must speak the same
version (the handshake checks).

A frame is the unit of per-peer message merging: the transport sends one frame per peer per
loop turn (two when a turn's early messages leave before its fsync, ``Ready.send``). On TCP
each frame travels as ``frame_to_wire(payload)`` (a 4-byte big-endian length, then the
payload) and ``FrameReader`` splits the byte stream back into payloads.

Trust
-----
Decoding assumes hostile input: it returns a valid object or raises ``DecodeError`` (for an
unknown version, its subclass ``UnsupportedVersion``) and nothing else. Sizes are bounded by the
``MAX_*`` constants; the msgpack unpacker gets the same limits, and its array limit is also
capped by the input's length, so a hostile length header cannot make it allocate much. (msgpack
pre-allocates each array it opens; hostile nesting to msgpack's depth limit can still cost a
transient ~5x the input's size, e.g. ~80 MB for a 16 MiB frame.)
``MAX_OP_BYTES`` and ``MAX_KEY_BYTES`` are enforced by the unpacker itself (bin values occur
only as ``op`` and ``SnapshotChunk.data``, str values only as keys and in configuration
records), the other limits by the decoders.

Both decoders, the eager one and ``lazy_batches=True`` (what a replica's node and the
simulator use), run one set of checks: the code generated from ``_LAYOUT``. The lazy one
keeps the batches an acceptor takes in packed (``consensus.packed_batch.PackedBatch``):
their msgpack structure and command count are checked at decode time, the commands' fields
by the same code when first read, and a batch whose commands fail those checks reads as
empty — on every replica alike, since each logs and passes on the bytes it received —
instead of failing the frame. Otherwise the two accept and refuse the same bytes, with the
same error (``tests/test_codec.py``'s differential tests).

Encoding trusts its input's types and values, which come from the local protocol core, but
never builds what a decoder would refuse for its size: it checks the class of each message
(``TypeError`` otherwise), the number of messages in a frame, and every size limit — each
array's length and each bin's bytes (``LocalProtocolError`` naming the field); a
``Command``'s op and keys are checked where commands enter a core, by ``propose`` and ``read``.
A message that breaks another field rule (a negative id, say) still encodes, and its
receiver rejects it.

Speed
-----
Per-class encoders and decoders are generated once, at import, from ``_LAYOUT`` (print
``_GENERATED_SOURCE`` to read them). Decoders build the frozen dataclasses with
``object.__new__`` and the slot descriptors, which is about 2x cheaper than calling the
keyword-only ``__init__`` (there is no ``__post_init__`` to skip; a class that gains one, or
loses its slots, gets a plain keyword constructor instead). ``Command`` is a named tuple whose
fields are its array: a batch of commands goes to msgpack as it is (no per-command work to
encode it for each peer, log record and commit), and a decoded array becomes a ``Command`` in
one call once its fields are checked. A batch received with ``lazy_batches`` is walked over
(msgpack's streaming unpacker skips it) and kept as its bytes: its acceptor's log record and
any message passing it on splice them, and its commands are decoded once, when executed.
"""

from __future__ import annotations

import struct
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from types import MappingProxyType
from typing import Any, Final, get_args, get_type_hints

import msgpack

from consensus import messages
from consensus.errors import ConfigError, DecodeError, LocalProtocolError, UnsupportedVersion
from consensus.messages import (
    MAX_BATCH,
    MAX_ENTRIES,
    MAX_FRAME_MESSAGES,
    MAX_KEY_BYTES,
    MAX_KEYS_PER_COMMAND,
    MAX_OP_BYTES,
    MAX_REQUEST_KEYS,
    MAX_SLOTS,
    CAccept,
    CAcceptedRecord,
    CAck,
    Catchup,
    CatchupMarkers,
    CCommit,
    CNack,
    Command,
    ConfigRecord,
    CPrepare,
    CPromise,
    CPromiseRecord,
    CRequest,
    CVote,
    EAccept,
    EAcceptReply,
    ECommit,
    EInstanceRecord,
    EPreAccept,
    EPreAcceptReply,
    EPrepare,
    EPrepareReply,
    ETryPreAccept,
    ETryPreAcceptReply,
    ExecutedRecord,
    Heartbeat,
    LearnedRecord,
    LearnedSlot,
    LearnReply,
    LearnRequest,
    LeaseGrant,
    MemberEntry,
    MenciusAccept,
    MenciusAck,
    MenciusPrepare,
    MenciusPromise,
    MenciusPromiseRecord,
    MenciusSkip,
    NewView,
    NewViewAck,
    NewViewRecord,
    OAccept,
    OAcceptedRecord,
    OAck,
    OCommit,
    OEntry,
    OVote,
    PaxosAccept,
    PaxosAck,
    PaxosCommit,
    PaxosForward,
    PaxosPrepare,
    PaxosPromise,
    PaxosPromiseRecord,
    PeerMessage,
    PreVote,
    PreVoteReply,
    Record,
    ReserveRecord,
    RReply,
    RRequest,
    SkipRecord,
    SlotAcceptedRecord,
    SnapshotChunk,
    Suspect,
    ViewRecord,
    Vote,
    VRequest,
)
from consensus.packed_batch import PackedBatch

__all__ = [
    "DEFAULT_MAX_FRAME",
    "FORMAT_VERSION",
    "INT64_MAX",
    "MAX_BATCH",
    "MAX_ENTRIES",
    "MAX_FRAME_MESSAGES",
    "MAX_KEYS_PER_COMMAND",
    "MAX_KEY_BYTES",
    "MAX_OP_BYTES",
    "MAX_REQUEST_KEYS",
    "MAX_SLOTS",
    "RECORD_VERSIONS_READ",
    "TAGS",
    "FrameReader",
    "checked_command",
    "decode_frame",
    "decode_message",
    "decode_record",
    "encode_frame",
    "encode_frames",
    "encode_message",
    "encode_record",
    "frame_to_wire",
]

#: Version of the encoding; every frame, message and record carries it. 3: ``CPromise``
#: gained ``through`` (paged promises). 4: no layout changed, but a proposer's ``CAccept``
#: and a sequencer's ``OAccept`` may leave before the sender's own acceptance is durable,
#: which the sender then reports with its own ``CAck``/``OAck``: a version-3 acceptor would
#: count the sender's acceptance from the Accept itself (peers of 3 and 4 must not mix).
FORMAT_VERSION: Final = 4
#: Versions whose records this build reads (its records are what versions 2 and 3 wrote, plus
#: ``ReserveRecord``, so a data directory written by an earlier build restarts). Peers speak
#: ``FORMAT_VERSION`` only.
RECORD_VERSIONS_READ: Final = frozenset({2, 3, FORMAT_VERSION})
_SAME_VERSION: Final = frozenset({FORMAT_VERSION})

# --------------------------------------------------------------------------- limits

#: default largest frame payload on a stream (``frame_to_wire`` / ``FrameReader``)
DEFAULT_MAX_FRAME: Final = 16 << 20
#: every int on the wire fits in a signed 64-bit integer
INT64_MAX: Final = (1 << 63) - 1

_MAX_ARRAY: Final = max(
    MAX_KEYS_PER_COMMAND, MAX_BATCH, MAX_REQUEST_KEYS, MAX_ENTRIES, MAX_SLOTS, MAX_FRAME_MESSAGES
)

# --------------------------------------------------------------------------- type tags

#: The wire tag of every class: 1..63 peer messages, 64..95 records, 96..127 nested values.
#: Never renumber or reuse a tag. Nested values only occur where their type is known, so
#: their tags are reserved rather than written.
TAGS: Final[Mapping[type, int]] = MappingProxyType(
    {
        # peer messages
        CAccept: 1,
        CAck: 2,
        CCommit: 3,
        CRequest: 4,
        OAccept: 5,
        OAck: 6,
        OCommit: 7,
        Catchup: 8,
        Heartbeat: 9,
        LeaseGrant: 10,
        VRequest: 11,
        Vote: 12,
        NewView: 13,
        NewViewAck: 14,
        CPrepare: 15,
        CPromise: 16,
        CNack: 17,
        RRequest: 18,
        RReply: 19,
        Suspect: 20,
        PreVote: 21,
        PreVoteReply: 22,
        SnapshotChunk: 23,
        CatchupMarkers: 24,
        # membership: a learner's catch-up (consensus.protocol.membership)
        LearnRequest: 25,
        LearnReply: 26,
        # peer messages of the baselines (consensus.protocol.multipaxos, .mencius)
        PaxosForward: 32,
        PaxosAccept: 33,
        PaxosAck: 34,
        PaxosCommit: 35,
        MenciusAccept: 40,
        MenciusAck: 41,
        MenciusSkip: 42,
        # baseline failover: Multi-Paxos takeover, Mencius revocation
        PaxosPrepare: 43,
        PaxosPromise: 44,
        MenciusPrepare: 45,
        MenciusPromise: 46,
        # peer messages of EPaxos (consensus.protocol.epaxos)
        EPreAccept: 48,
        EPreAcceptReply: 49,
        EAccept: 50,
        EAcceptReply: 51,
        ECommit: 52,
        EPrepare: 53,
        EPrepareReply: 54,
        ETryPreAccept: 55,
        ETryPreAcceptReply: 56,
        # durable records
        CAcceptedRecord: 64,
        OAcceptedRecord: 65,
        ViewRecord: 66,
        NewViewRecord: 67,
        CPromiseRecord: 68,
        ExecutedRecord: 69,
        ConfigRecord: 70,
        LearnedRecord: 71,
        ReserveRecord: 72,
        # durable records of the baselines
        SlotAcceptedRecord: 80,
        SkipRecord: 81,
        # durable records of EPaxos
        EInstanceRecord: 84,
        # durable records of baseline failover
        PaxosPromiseRecord: 82,
        MenciusPromiseRecord: 83,
        # nested values
        Command: 96,
        OEntry: 97,
        OVote: 98,
        CVote: 99,
        LearnedSlot: 100,
        MemberEntry: 101,
    }
)

_PEER_CLASSES: Final[tuple[type, ...]] = get_args(PeerMessage)
_RECORD_CLASSES: Final[tuple[type, ...]] = get_args(Record)

# --------------------------------------------------------------------------- field rules
# Every field has a rule in ``_LAYOUT`` (below), and the rules are these two tables: a
# scalar kind's in ``_RULES``, an array's in ``_Array``. The decoders generated from them
# (see "code generation") are the only checks of untrusted values, and both decoders run
# them: the eager one on what msgpack unpacked, the lazy one on the same values with some
# batches still packed (see "lazy batches"), whose commands the same code checks when they
# are first read.

_UINT: Final = "uint"
_NO_CL: Final = "no_cl"
_NONE: Final = "none"
_BIN: Final = "bin"
_BOOL: Final = "bool"
_STR: Final = "str"


@dataclass(frozen=True, slots=True)
class _Rule:
    """What a decoder accepts for a scalar field."""

    refuses: str  # a condition on the local ``{x}``, true for every value the rule refuses
    expected: str  # what the error says was expected


#: A scalar kind -> its rule. ``-1`` is accepted only where ``consensus.messages`` gives it a
#: meaning: the fields of kind ``_NO_CL`` or ``_NONE`` in ``_LAYOUT``.
_RULES: Final[Mapping[str, _Rule]] = MappingProxyType({
    # ids, indices, slots, views, ballots, counters and clock readings: every int on the
    # wire fits in a signed 64-bit integer (a bool is no int)
    _UINT: _Rule("type({x}) is not int or not 0 <= {x} <= _I64", "non-negative int64"),
    # the owner of an order instance: a replica, NO_CL (-1: none yet) or SEAL (-2: the
    # instance ends its epoch)
    _NO_CL: _Rule("type({x}) is not int or not -2 <= {x} <= _I64",
                  "non-negative int64, NO_CL (-1) or SEAL (-2)"),
    # a position, view or replica that may be none (-1)
    _NONE: _Rule("type({x}) is not int or not -1 <= {x} <= _I64", "non-negative int64 or -1"),
    # a command's op, a snapshot chunk's data: at most MAX_OP_BYTES (msgpack's max_bin_len)
    _BIN: _Rule("type({x}) is not bytes", "bin"),
    _BOOL: _Rule("type({x}) is not bool", "bool"),
    # keys, and the strs of a configuration record: at most MAX_KEY_BYTES of UTF-8 (msgpack's
    # max_str_len)
    _STR: _Rule("type({x}) is not str", "str"),
})


@dataclass(frozen=True, slots=True)
class _Array:
    """The rule of a tuple: an array of at most ``limit`` values, each following ``item``'s
    rule (a scalar kind, or a nested class: an untagged array of its fields).

    ``nullable``: nil, for None, too. ``lazy``: a batch of commands that an acceptor takes
    in, which ``lazy_batches`` keeps packed (``PackedBatch``): exactly the fields of
    messages and records typed ``messages.Batch``, whose cores take a ``PackedBatch``
    (checked at import)."""

    item: str | type
    limit: int
    nullable: bool = False
    lazy: bool = False


_FieldType = str | _Array
_KEYS: Final = _Array(_STR, MAX_KEYS_PER_COMMAND)
_REQUEST_KEYS: Final = _Array(_STR, MAX_REQUEST_KEYS)
#: a batch decoded with its message (inside a nested value, or where no core takes it packed)
_BATCH: Final = _Array(Command, MAX_BATCH)
#: a batch an acceptor takes in (kept packed by a lazy decoder), and one that may be None:
#: the only lazy rules (``PackedBatch.decoder`` decodes with their limit)
_LAZY_BATCH: Final = _Array(Command, MAX_BATCH, lazy=True)
_LAZY_BATCH_OR_NIL: Final = _Array(Command, MAX_BATCH, nullable=True, lazy=True)
#: EPaxos dependencies: one index (or -1, none) per replica
_DEPS: Final = _Array(_NONE, MAX_SLOTS)

#: Every class's fields, in wire order (= dataclass declaration order, checked at import).
_LAYOUT: Final[dict[type, tuple[tuple[str, _FieldType], ...]]] = {
    # nested values
    Command: (
        ("client_id", _UINT),
        ("seq", _UINT),
        ("op", _BIN),
        ("keys", _KEYS),
        ("blind", _BOOL),
    ),
    OEntry: (("slot", _UINT), ("owner", _NO_CL)),
    OVote: (("slot", _UINT), ("owner", _NO_CL), ("ballot", _UINT)),
    CVote: (("index", _UINT), ("ballot", _UINT), ("batch", _BATCH)),
    # peer messages
    CAccept: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
        ("batch", _LAZY_BATCH),
    ),
    CAck: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
    ),
    CCommit: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
        ("batch", _LAZY_BATCH_OR_NIL),
    ),
    CRequest: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("keys", _REQUEST_KEYS),
        ("o_prefix", _UINT),
    ),
    OAccept: (("src", _UINT), ("view", _UINT), ("entries", _Array(OEntry, MAX_ENTRIES))),
    OAck: (("src", _UINT), ("view", _UINT), ("slots", _Array(_UINT, MAX_SLOTS))),
    OCommit: (("src", _UINT), ("view", _UINT), ("entries", _Array(OEntry, MAX_ENTRIES))),
    Catchup: (("src", _UINT), ("view", _UINT), ("slot", _UINT)),
    CatchupMarkers: (("src", _UINT), ("view", _UINT), ("slot", _UINT)),
    Heartbeat: (
        ("src", _UINT),
        ("view", _UINT),
        ("executed", _UINT),
        ("lease_request", _NONE),
    ),
    LeaseGrant: (("src", _UINT), ("view", _UINT), ("request", _UINT)),
    VRequest: (("src", _UINT), ("view", _UINT), ("from_slot", _UINT)),
    PreVote: (("src", _UINT), ("view", _UINT)),
    PreVoteReply: (("src", _UINT), ("view", _UINT), ("granted", _BOOL)),
    SnapshotChunk: (
        ("src", _UINT),
        ("view", _UINT),
        ("slot", _UINT),
        ("offset", _UINT),
        ("total", _UINT),
        ("data", _BIN),
    ),
    Vote: (
        ("src", _UINT),
        ("view", _UINT),
        ("accepted_view", _NONE),
        ("accepted_from", _UINT),
        ("executed", _UINT),
        ("entries", _Array(OVote, MAX_ENTRIES)),
        ("c_high", _Array(_NONE, MAX_SLOTS)),
    ),
    NewView: (
        ("src", _UINT),
        ("view", _UINT),
        ("start", _UINT),
        ("owners", _Array(_NO_CL, MAX_SLOTS)),
    ),
    NewViewAck: (("src", _UINT), ("view", _UINT)),
    CPrepare: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("from_index", _UINT),
        ("ballot", _UINT),
    ),
    CPromise: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("from_index", _UINT),
        ("ballot", _UINT),
        ("accepted", _Array(CVote, MAX_ENTRIES)),
        ("high", _NONE),
        ("through", _UINT),
    ),
    CNack: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
    ),
    RRequest: (("src", _UINT), ("view", _UINT), ("read_id", _UINT), ("keys", _REQUEST_KEYS)),
    RReply: (("src", _UINT), ("view", _UINT), ("read_id", _UINT), ("slot", _NONE)),
    Suspect: (("src", _UINT), ("view", _UINT)),
    PaxosForward: (("src", _UINT), ("view", _UINT), ("commands", _BATCH)),
    PaxosAccept: (
        ("src", _UINT),
        ("view", _UINT),
        ("slot", _UINT),
        ("ballot", _UINT),
        ("batch", _LAZY_BATCH),
    ),
    PaxosAck: (
        ("src", _UINT),
        ("view", _UINT),
        ("ballot", _UINT),
        ("slots", _Array(_UINT, MAX_SLOTS)),
    ),
    PaxosCommit: (
        ("src", _UINT),
        ("view", _UINT),
        ("slot", _UINT),
        ("ballot", _UINT),
        ("batch", _LAZY_BATCH_OR_NIL),
    ),
    MenciusAccept: (
        ("src", _UINT),
        ("view", _UINT),
        ("slot", _UINT),
        ("ballot", _UINT),
        ("batch", _LAZY_BATCH),
        ("skip_start", _UINT),
        ("skip_stop", _UINT),
    ),
    MenciusAck: (
        ("src", _UINT),
        ("view", _UINT),
        ("ballot", _UINT),
        ("slots", _Array(_UINT, MAX_SLOTS)),
        ("skip_start", _UINT),
        ("skip_stop", _UINT),
    ),
    MenciusSkip: (
        ("src", _UINT),
        ("view", _UINT),
        ("skip_start", _UINT),
        ("skip_stop", _UINT),
    ),
    PaxosPrepare: (("src", _UINT), ("view", _UINT), ("ballot", _UINT), ("from_slot", _UINT)),
    PaxosPromise: (
        ("src", _UINT),
        ("view", _UINT),
        ("ballot", _UINT),
        ("ok", _BOOL),
        ("from_slot", _UINT),
        ("through", _UINT),
        ("complete", _BOOL),
        ("accepted", _Array(CVote, MAX_ENTRIES)),
    ),
    MenciusPrepare: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("start", _UINT),
        ("stop", _UINT),
        ("ballot", _UINT),
    ),
    MenciusPromise: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("start", _UINT),
        ("stop", _UINT),
        ("ballot", _UINT),
        ("ok", _BOOL),
        ("accepted", _Array(CVote, MAX_ENTRIES)),
    ),
    # EPaxos
    EPreAccept: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
        ("batch", _BATCH),
        ("seq", _UINT),
        ("deps", _DEPS),
    ),
    EPreAcceptReply: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
        ("ok", _BOOL),
        ("seq", _UINT),
        ("deps", _DEPS),
        ("changed", _BOOL),
    ),
    EAccept: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
        ("batch", _BATCH),
        ("seq", _UINT),
        ("deps", _DEPS),
    ),
    EAcceptReply: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
        ("ok", _BOOL),
    ),
    ECommit: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
        ("batch", _BATCH),
        ("seq", _UINT),
        ("deps", _DEPS),
    ),
    EPrepare: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
    ),
    EPrepareReply: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
        ("ok", _BOOL),
        ("status", _UINT),
        ("vballot", _UINT),
        ("batch", _BATCH),
        ("seq", _UINT),
        ("deps", _DEPS),
    ),
    ETryPreAccept: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
        ("batch", _BATCH),
        ("seq", _UINT),
        ("deps", _DEPS),
    ),
    ETryPreAcceptReply: (
        ("src", _UINT),
        ("view", _UINT),
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
        ("ok", _BOOL),
        ("conflict", _UINT),
    ),
    LearnedSlot: (("seal", _BOOL), ("batch", _BATCH)),
    MemberEntry: (
        ("id", _UINT),
        ("incarnation", _UINT),
        ("voter", _BOOL),
        ("info", _STR),
        ("replaces", _NONE),
    ),
    LearnRequest: (("src", _UINT), ("view", _UINT), ("slot", _UINT)),
    LearnReply: (
        ("src", _UINT),
        ("view", _UINT),
        ("start", _UINT),
        ("executed", _UINT),
        ("slots", _Array(LearnedSlot, MAX_ENTRIES)),
    ),
    ConfigRecord: (
        ("epoch", _UINT),
        ("base", _UINT),
        ("next_id", _UINT),
        ("voters", _Array(_UINT, MAX_SLOTS)),
        ("members", _Array(MemberEntry, MAX_SLOTS)),
        ("closing", _STR),
        ("closing_member", _NONE),
    ),
    LearnedRecord: (("start", _UINT), ("slots", _Array(LearnedSlot, MAX_ENTRIES))),
    # durable records
    CAcceptedRecord: (
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
        ("batch", _LAZY_BATCH),
    ),
    OAcceptedRecord: (("view", _UINT), ("entries", _Array(OEntry, MAX_ENTRIES))),
    ViewRecord: (("view", _UINT),),
    NewViewRecord: (("view", _UINT), ("start", _UINT), ("owners", _Array(_NO_CL, MAX_SLOTS))),
    CPromiseRecord: (("owner", _UINT), ("from_index", _UINT), ("ballot", _UINT)),
    ReserveRecord: (("below", _UINT),),
    ExecutedRecord: (
        ("start", _UINT),
        ("owners", _Array(_NO_CL, MAX_SLOTS)),
        ("ballots", _Array(_UINT, MAX_SLOTS)),
    ),
    SlotAcceptedRecord: (("slot", _UINT), ("ballot", _UINT), ("batch", _LAZY_BATCH)),
    SkipRecord: (("start", _UINT), ("stop", _UINT)),
    PaxosPromiseRecord: (("ballot", _UINT),),
    MenciusPromiseRecord: (
        ("owner", _UINT),
        ("start", _UINT),
        ("stop", _UINT),
        ("ballot", _UINT),
    ),
    EInstanceRecord: (
        ("owner", _UINT),
        ("index", _UINT),
        ("ballot", _UINT),
        ("vballot", _UINT),
        ("status", _UINT),
        ("batch", _BATCH),
        ("seq", _UINT),
        ("deps", _DEPS),
    ),
}

_NESTED_CLASSES: Final = tuple(
    cls for cls in _LAYOUT if cls not in _PEER_CLASSES and cls not in _RECORD_CLASSES
)


def _is_named_tuple(cls: type) -> bool:
    """A ``typing.NamedTuple`` class (``Command``): its fields are its array."""
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _check_tables() -> None:
    """Fail at import if the tables drifted from ``consensus.messages``."""
    defined = {
        obj for obj in vars(messages).values()
        if isinstance(obj, type) and (is_dataclass(obj) or _is_named_tuple(obj))
    }
    for name, table in (("TAGS", set(TAGS)), ("_LAYOUT", set(_LAYOUT))):
        if table != defined:
            missing = sorted(c.__name__ for c in defined - table)
            extra = sorted(c.__name__ for c in table - defined)
            raise RuntimeError(f"codec: {name} is missing {missing}, has extra {extra}")
    if len(set(TAGS.values())) != len(TAGS):
        raise RuntimeError("codec: duplicate type tag")
    for cls, tag in TAGS.items():
        low, high = (
            (1, 63) if cls in _PEER_CLASSES else (64, 95) if cls in _RECORD_CLASSES else (96, 127)
        )
        if not low <= tag <= high:
            raise RuntimeError(f"codec: {cls.__name__}'s tag {tag} is outside {low}..{high}")
    for cls, layout in _LAYOUT.items():
        if _is_named_tuple(cls):
            declared: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
        else:
            declared = tuple(f.name for f in fields(cls))
        if declared != tuple(name for name, _ in layout):
            raise RuntimeError(
                f"codec: {cls.__name__} fields {declared} no longer match the wire layout "
                f"{tuple(name for name, _ in layout)}: update _LAYOUT and bump FORMAT_VERSION"
            )
        # field names become locals of the generated code, next to `v`, `m`, `where`, `_*`
        if any(name.startswith("_") or name in ("v", "m", "where") for name in declared):
            raise RuntimeError(f"codec: {cls.__name__} has a field name the codec cannot use")
        tagged = cls in _PEER_CLASSES or cls in _RECORD_CLASSES
        hints = get_type_hints(cls)
        for name, ftype in layout:
            lazy = isinstance(ftype, _Array) and ftype.lazy
            takes_packed = tagged and PackedBatch in get_args(hints[name])  # messages.Batch
            if lazy != takes_packed or (lazy and ftype not in (_LAZY_BATCH, _LAZY_BATCH_OR_NIL)):
                raise RuntimeError(
                    f"codec: {cls.__name__}.{name}: the batches a lazy decoder keeps packed "
                    "are the fields of messages and records typed messages.Batch"
                )


_check_tables()

# --------------------------------------------------------------------------- error helpers


def _describe(value: object) -> str:
    """A short description of a decoded value, safe for any size or nesting."""
    t = type(value)
    if value is None:
        return "nil"
    if t is int:
        return repr(value)
    if t is bool or t is float:
        return f"{t.__name__} {value!r}"
    if t is str:
        text = repr(value)
        return f"str {text[:40]}..." if len(text) > 40 else f"str {text}"
    if t is bytes:
        return f"bin of {len(value)} bytes"  # type: ignore[arg-type]
    if t is tuple:
        return f"array of {len(value)}"  # type: ignore[arg-type]
    if t is dict:
        return f"map of {len(value)}"  # type: ignore[arg-type]
    return f"msgpack {t.__name__}"


def _bad(where: str, expected: str, got: object) -> DecodeError:
    return DecodeError(f"{where}: expected {expected}, got {_describe(got)}")


def _at(where: str, index: int) -> str:
    return f"{where}[{index}]"


def _index_of(seq: tuple[Any, ...], item: object) -> int:
    """Position of ``item`` (by identity) in ``seq``; only used to word an error."""
    return next((i for i, x in enumerate(seq) if x is item), -1)


def _field_count(name: str, expected: int, value: tuple[Any, ...]) -> DecodeError:
    return DecodeError(f"{name}: expected {expected} fields, got {len(value) - 1}")


# --------------------------------------------------------------------------- msgpack layer


def _commands_of(value: object) -> object:
    """msgpack's ``default``: a packed batch inside a value packed whole (a promise's votes,
    say) goes as its commands, which pack to its bytes when they came from this codec."""
    if type(value) is PackedBatch:
        return value.commands
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


#: msgpack with our ``default``: one packer kept, as ``msgpack.packb`` builds one per call
#: (1.9 µs against 0.5 µs for a small message: every message and record pays it)
_packb: Final = msgpack.Packer(use_bin_type=True, default=_commands_of).pack

#: msgpack's limits on untrusted ``data``, the keywords of both unpackers (``_unpack`` and
#: the lazy decoder's streaming one), generated with them: a ``**`` of a dict of them would
#: cost more than unpacking a small frame.
_UNPACK_LIMITS: Final = (
    "use_list=False, raw=False, strict_map_key=True, max_ext_len=0, "
    f"max_bin_len={MAX_OP_BYTES}, max_str_len={MAX_KEY_BYTES}, "
    # an array of n values takes at least n bytes: no need to allocate for more
    f"max_array_len=min(len(data), {_MAX_ARRAY}), "
    # no format has maps, but reading them lets a future one fail as UnsupportedVersion
    f"max_map_len=min(len(data) // 2, {_MAX_ARRAY})"
)
_UNPACK_ERRORS: Final = (
    ValueError,  # incl. msgpack's FormatError, StackError, ExtraData, bad UTF-8, size limits
    TypeError,
    OverflowError,
    RecursionError,
    msgpack.UnpackException,
)


def _unpack_error(error: BaseException) -> DecodeError:
    """The ``DecodeError`` for what msgpack raised unpacking untrusted bytes."""
    if isinstance(error, msgpack.ExtraData):
        return DecodeError("trailing bytes after the msgpack value")
    if isinstance(error, msgpack.StackError):
        return DecodeError("malformed msgpack: values nested too deeply")
    return DecodeError(f"malformed msgpack: {error or type(error).__name__}")


def _unpack_lines() -> list[str]:
    """``_unpack(data)``: ``data`` unpacked within ``_UNPACK_LIMITS`` (``DecodeError``
    otherwise); ``_unpacker(data)``: a streaming unpacker over ``data`` with those limits."""
    return [
        "def _unpack(data):",
        "    try:",
        f"        return _unpackb(data, {_UNPACK_LIMITS})",
        "    except _UNPACK_ERRORS as _e:",
        "        raise _unpack_error(_e) from None",
        "",
        "def _unpacker(data):",
        f"    _u = _Unpacker({_UNPACK_LIMITS}, max_buffer_size=max(len(data), 1))",
        "    _u.feed(data)",
        "    return _u",
    ]


# --------------------------------------------------------------------------- code generation
# The generated functions are plain straight-line Python; `_GENERATED_SOURCE` holds them.

def _scalar_check(kind: str, var: str, where: str) -> list[str]:
    rule = _RULES[kind]
    return [
        f"if {rule.refuses.format(x=var)}:",
        f"    raise _bad({where}, {rule.expected!r}, {var})",
    ]


def _check_lines(ftype: _FieldType, var: str, where: str) -> list[str]:
    """Source lines that validate (and, for nested classes, decode) local ``var``.

    ``where`` is a source expression naming the field; it is evaluated only on failure.
    """
    if isinstance(ftype, str):
        return _scalar_check(ftype, var, where)
    if isinstance(ftype.item, type):
        decode = f"{var} = _dec_seq_{ftype.item.__name__}({var}, {where}, {ftype.limit})"
        # a batch the lazy decoder kept packed: an array within the limit, its commands
        # checked by the same _dec_seq_Command when first read (_decode_packed_batch)
        packed = f"type({var}) is not _PackedBatch" if ftype.lazy else ""
        condition = " and ".join(c for c in (
            f"{var} is not None" if ftype.nullable else "", packed) if c)
        if condition:
            return [f"if {condition}:", f"    {decode}"]
        return [decode]
    if ftype.nullable:
        raise AssertionError("nullable arrays of scalars are not needed yet")
    expected = f"array of at most {ftype.limit} {_RULES[ftype.item].expected}"
    return [
        f"if type({var}) is not tuple or len({var}) > {ftype.limit}:",
        f"    raise _bad({where}, {expected!r}, {var})",
        f"for _k in {var}:",
        *(
            f"    {line}"
            for line in _scalar_check(ftype.item, "_k", f"_at({where}, _index_of({var}, _k))")
        ),
    ]


def _construct_lines(cls: type, result: str, fields_tuple: str | None = None) -> list[str]:
    """Source lines that build ``cls`` from same-named locals into local ``result``
    (``fields_tuple``: a local tuple of exactly those values, in order, if there is one)."""
    names = [name for name, _ in _LAYOUT[cls]]
    if _is_named_tuple(cls):  # one C call, no per-field work
        values = fields_tuple or f"({', '.join(names)},)"
        return [f"{result} = _tuple_new({cls.__name__}, {values})"]
    fast = not hasattr(cls, "__post_init__") and all(
        isinstance(cls.__dict__.get(name), types.MemberDescriptorType) for name in names
    )
    if not fast:
        args = ", ".join(f"{name}={name}" for name in names)
        return [f"{result} = {cls.__name__}({args})"]
    lines = [f"{result} = _new({cls.__name__})"]
    lines += [f"_set_{cls.__name__}_{name}({result}, {name})" for name in names]
    return lines


def _unpack_line(layout: tuple[tuple[str, _FieldType], ...], source: str, tagged: bool) -> str:
    names = [name for name, _ in layout]
    targets = ", ".join(["_", *names] if tagged else names)
    return f"{targets}{',' if len(names) + tagged == 1 else ''} = {source}"


def _seq_decoder(cls: type) -> list[str]:
    """``_dec_seq_<cls>(v, where, limit)``: a tuple of untagged ``cls`` arrays -> tuple."""
    name = cls.__name__
    layout = _LAYOUT[cls]
    # the item's position comes from enumerate: searching for it (``_index_of``) per item
    # made decoding an array of nested values quadratic (a 16k-vote CPromise took 4 s)
    item_where = "_at(where, _i)"
    body = [
        f"if type(_item) is not tuple or len(_item) != {len(layout)}:",
        f"    raise _bad({item_where}, '{name} array of {len(layout)} fields', _item)",
        _unpack_line(layout, "_item", tagged=False),
    ]
    # nested values' checks only look at the fields, never rebind them: _item holds them as
    # they were checked
    nested = any(isinstance(ftype, _Array) and isinstance(ftype.item, type) for _, ftype in layout)
    for field, ftype in layout:
        body += _check_lines(ftype, field, f"{item_where} + '.{field}'")
    body += _construct_lines(cls, "_o", None if nested else "_item")
    body.append("_append(_o)")
    return [
        f"def _dec_seq_{name}(v, where, limit):",
        "    if type(v) is not tuple or len(v) > limit:",
        f"        raise _bad(where, f'array of at most {{limit}} {name}', v)",
        "    _out = []",
        "    _append = _out.append",
        "    for _i, _item in enumerate(v):",
        *(f"        {line}" for line in body),
        "    return tuple(_out)",
    ]


def _decoder(cls: type) -> list[str]:
    """``_dec_<cls>(v)``: a tagged array whose tag the caller matched -> ``cls``."""
    name = cls.__name__
    layout = _LAYOUT[cls]
    body = [
        f"if len(v) != {len(layout) + 1}:",
        f"    raise _field_count({name!r}, {len(layout)}, v)",
        _unpack_line(layout, "v", tagged=True),
    ]
    for field, ftype in layout:
        body += _check_lines(ftype, field, repr(f"{name}.{field}"))
    body += _construct_lines(cls, "_o")
    body.append("return _o")
    return [f"def _dec_{name}(v):", *(f"    {line}" for line in body)]


def _encode_expr(ftype: _FieldType, value: str, where: str) -> str:
    """Source expression that turns field value ``value`` into msgpack-ready data (nested
    classes through their sequence encoder, which checks the array's length)."""
    if isinstance(ftype, _Array) and isinstance(ftype.item, type):
        listed = f"_enc_seq_{ftype.item.__name__}({value}, {ftype.limit}, {where})"
        return f"None if {value} is None else {listed}" if ftype.nullable else listed
    return value  # scalars and tuples of scalars go as they are


def _limit_lines(ftype: _FieldType, value: str, where: str) -> list[str]:
    """Source lines that refuse ``value`` if the decoder would refuse its size: the length
    of an array of scalars, the bytes of a bin, the UTF-8 bytes of each str in an array
    (arrays of nested classes are checked by their sequence encoder)."""
    if ftype == _BIN:
        return [
            f"if len({value}) > {MAX_OP_BYTES}:",
            f"    raise _oversized({where}, {MAX_OP_BYTES}, len({value}), 'bytes')",
        ]
    if not isinstance(ftype, _Array) or isinstance(ftype.item, type):
        return []
    lines = [
        f"if len({value}) > {ftype.limit}:",
        f"    raise _oversized({where}, {ftype.limit}, len({value}), 'values')",
    ]
    if ftype.item == _STR:
        # only a str of over a quarter of the limit in characters can be over it in bytes
        lines += [
            f"for _s in {value}:",
            f"    if len(_s) > {MAX_KEY_BYTES // 4} and len(_s.encode()) > {MAX_KEY_BYTES}:",
            f"        raise _oversized({where}, {MAX_KEY_BYTES}, len(_s.encode()), 'bytes')",
        ]
    return lines


def _seq_encoder(cls: type) -> list[str]:
    """``_enc_seq_<cls>(values, limit, where)``: tuple of at most ``limit`` ``cls`` -> list of
    untagged arrays; ``where`` names the field in an error."""
    layout = _LAYOUT[cls]
    item_where = "where + '[]'"
    parts = [_encode_expr(ft, f"_x.{n}", f"{item_where} + '.{n}'") for n, ft in layout]
    # A Command's own limits are checked where commands come from: ``propose`` / ``read`` of
    # every core (``messages.check_command``) and the decoders. A loop over every command of
    # every batch here would add ~35 % to encoding a CAccept.
    checks = [
        line
        for name, ftype in layout
        for line in _limit_lines(ftype, f"_x.{name}", f"{item_where} + '.{name}'")
        if cls is not Command
    ]
    return [
        f"def _enc_seq_{cls.__name__}(values, limit, where):",
        # a packed batch came within the limits and goes as its bytes (see _packer)
        *(["    if type(values) is _PackedBatch:", "        return values"]
          if cls is Command else []),
        "    if len(values) > limit:",
        "        raise _oversized(where, limit, len(values), 'values')",
        *(["    for _x in values:"] + [f"        {line}" for line in checks] if checks else []),
        # a named tuple is its own array (its fields are the layout, checked at import)
        "    return values" if _is_named_tuple(cls)
        else f"    return [({', '.join(parts)}{',' if len(parts) == 1 else ''}) for _x in values]",
    ]


def _encoder(cls: type) -> list[str]:
    """``_enc_<cls>(m)``: ``cls`` -> ``(tag, field, ...)``, refusing what the decoder would
    refuse for its size."""
    layout = _LAYOUT[cls]
    name = cls.__name__
    parts = [str(TAGS[cls])] + [_encode_expr(ft, f"m.{n}", repr(f"{name}.{n}")) for n, ft in layout]
    checks = [
        line for n, ftype in layout for line in _limit_lines(ftype, f"m.{n}", repr(f"{name}.{n}"))
    ]
    return [
        f"def _enc_{name}(m):",
        *(f"    {line}" for line in checks),
        f"    return ({', '.join(parts)})",
    ]


def _oversized(where: str, limit: int, size: int, unit: str) -> LocalProtocolError:
    return LocalProtocolError(
        f"cannot encode {where}: {size} {unit}, the decoder takes at most {limit}"
    )


def _generate() -> tuple[str, dict[str, Any]]:
    namespace: dict[str, Any] = {
        "_I64": INT64_MAX,
        "_bad": _bad,
        "_at": _at,
        "_index_of": _index_of,
        "_field_count": _field_count,
        "_oversized": _oversized,
        "_new": object.__new__,
        "_tuple_new": tuple.__new__,
        "_PackedBatch": PackedBatch,
        "_unpackb": msgpack.unpackb,
        "_Unpacker": msgpack.Unpacker,
        "_UNPACK_ERRORS": _UNPACK_ERRORS,
        "_unpack_error": _unpack_error,
    }
    for cls, layout in _LAYOUT.items():
        namespace[cls.__name__] = cls
        for field, _ in layout:
            descriptor = cls.__dict__.get(field)
            if isinstance(descriptor, types.MemberDescriptorType):
                namespace[f"_set_{cls.__name__}_{field}"] = descriptor.__set__
    lines = [*_unpack_lines(), ""]
    for cls in _NESTED_CLASSES:
        lines += [*_seq_decoder(cls), "", *_seq_encoder(cls), ""]
    for cls in (*_PEER_CLASSES, *_RECORD_CLASSES):
        lines += [*_decoder(cls), "", *_encoder(cls), ""]
    source = "\n".join(lines)
    exec(compile(source, "<consensus.codec generated>", "exec"), namespace)
    return source, namespace


_GENERATED_SOURCE, _generated = _generate()

_Encoder = Callable[[Any], tuple[Any, ...]]

_tuple_new: Final = tuple.__new__


def checked_command(
    client_id: int, seq: int, op: bytes, keys: tuple[str, ...], blind: bool
) -> Command:
    """``Command(...)`` from values the caller already checked for type and range, built the
    way the decoders build theirs (one C call: the keyword constructor costs several times
    as much, and the client port builds one per request)."""
    command: Command = _tuple_new(Command, (client_id, seq, op, keys, blind))
    return command


_PEER_ENCODERS: Final[dict[type, _Encoder]] = {
    cls: _generated[f"_enc_{cls.__name__}"] for cls in _PEER_CLASSES
}
_RECORD_ENCODERS: Final[dict[type, _Encoder]] = {
    cls: _generated[f"_enc_{cls.__name__}"] for cls in _RECORD_CLASSES
}
_PEER_DECODERS: Final[dict[int, Callable[[tuple[Any, ...]], PeerMessage]]] = {
    TAGS[cls]: _generated[f"_dec_{cls.__name__}"] for cls in _PEER_CLASSES
}
_RECORD_DECODERS: Final[dict[int, Callable[[tuple[Any, ...]], Record]]] = {
    TAGS[cls]: _generated[f"_dec_{cls.__name__}"] for cls in _RECORD_CLASSES
}
_TAG_NAMES: Final = {tag: cls.__name__ for cls, tag in TAGS.items()}
_unpack: Final[Callable[[bytes], object]] = _generated["_unpack"]
_unpacker: Final[Callable[[bytes], msgpack.Unpacker]] = _generated["_unpacker"]

# --------------------------------------------------------------------------- envelopes
# The rules of what holds the messages and records, checked on the unpacked value by the
# eager and the lazy decoder alike:
#     frame   := [FORMAT_VERSION, [message, ...]]   at most MAX_FRAME_MESSAGES messages
#     single  := [FORMAT_VERSION, message]
#     logged  := [version, record]                  a version in RECORD_VERSIONS_READ
# and a message or record is a [tag, field, ...] array whose tag is one of its kind's.


def _open(top: object, what: str, readable: frozenset[int] = _SAME_VERSION) -> object:
    """Check the unpacked ``[version, body]`` envelope (a version in ``readable``); returns
    ``body``."""
    if type(top) is not tuple or not top:
        raise _bad(what, "[version, ...] array", top)
    version = top[0]
    if type(version) is not int:
        raise _bad(f"{what} version", "int", version)
    if version not in readable:
        raise UnsupportedVersion(version, FORMAT_VERSION)
    if len(top) != 2:
        raise _bad(what, "[version, body] array", top)
    return top[1]


def _decode_tagged(
    value: object, decoders: Mapping[int, Callable[[tuple[Any, ...]], Any]], what: str
) -> Any:
    if type(value) is not tuple or not value or type(value[0]) is not int:
        raise _bad(what, "[tag, field, ...] array", value)
    decoder = decoders.get(value[0])
    if decoder is None:
        known = _TAG_NAMES.get(value[0])
        suffix = f" ({known} is not a {what})" if known else ""
        raise DecodeError(f"{what}: unknown tag {value[0]}{suffix}")
    return decoder(value)


def _messages(body: object) -> list[PeerMessage]:
    """The peer messages of a frame's unpacked body, in order."""
    if type(body) is not tuple or len(body) > MAX_FRAME_MESSAGES:
        raise _bad("frame", f"array of at most {MAX_FRAME_MESSAGES} messages", body)
    decoders = _PEER_DECODERS
    out: list[PeerMessage] = []
    append = out.append
    try:
        for item in body:
            if type(item) is not tuple or not item or type(item[0]) is not int:
                raise _bad("message", "[tag, field, ...] array", item)
            decoder = decoders.get(item[0])
            if decoder is None:
                _decode_tagged(item, decoders, "peer message")  # raises, naming the tag
            append(decoder(item))  # type: ignore[misc]
    except DecodeError as e:
        raise DecodeError(f"frame message {len(out)}: {e}") from None
    return out


def _wrong_class(value: object, expected: str) -> TypeError:
    return TypeError(f"cannot encode {type(value).__name__} as a {expected}")


# --------------------------------------------------------------------------- batches packed once
# A message or record that carries a batch of commands is packed field by field, its batch
# spliced in as the bytes packed the first time that batch (the same object) was packed: its
# leader's CAccepts to every peer, its log record and its commits pack the commands once.
# The bytes are the same as packing the message whole (a msgpack array is its header followed
# by its values).

#: most batches, and most bytes of them, kept packed (more than one turn's worth)
PACKED_BATCHES_KEPT: Final = 256
PACKED_BATCH_BYTES_KEPT: Final = 16 << 20
#: a batch of fewer commands is packed with its message (packing field by field costs more)
SPLICE_FROM: Final = 16
#: id(batch) -> (batch, its msgpack bytes); holding the batch keeps its id from being reused
_packed_batches: Final[dict[int, tuple[tuple[Command, ...], bytes]]] = {}
_packed_bytes = [0]  # what _packed_batches holds, in bytes
_Packer = Callable[[Any], bytes]


def _packed_batch(batch: tuple[Command, ...] | PackedBatch) -> bytes:
    if isinstance(batch, PackedBatch):
        return batch.packed  # as it was received: an acceptor's record splices those bytes
    hit = _packed_batches.get(id(batch))
    if hit is not None and hit[0] is batch:
        return hit[1]
    packed: bytes = _packb(batch)  # a Command is its own array (see _seq_encoder)
    kept = _packed_batches
    kept[id(batch)] = (batch, packed)
    _packed_bytes[0] += len(packed)
    while len(kept) > PACKED_BATCHES_KEPT or _packed_bytes[0] > PACKED_BATCH_BYTES_KEPT:
        oldest = next(iter(kept))  # dicts keep insertion order
        _packed_bytes[0] -= len(kept.pop(oldest)[1])
    return packed


def _packer(cls: type, encoder: _Encoder) -> tuple[_Packer, bool]:
    """``cls`` -> its msgpack bytes (``[tag, field, ...]``), and whether it splices batches."""
    layout = _LAYOUT[cls]
    batch_at = frozenset(
        position + 1  # after the tag
        for position, (_, ftype) in enumerate(layout)
        if isinstance(ftype, _Array) and ftype.item is Command
    )
    if not batch_at:
        def whole(m: Any) -> bytes:
            packed: bytes = _packb(encoder(m))
            return packed

        return whole, False
    header = _array_header(len(layout) + 1)

    def spliced(m: Any) -> bytes:
        values = encoder(m)  # the encoder checks the limits
        if all(
            values[at] is None
            or (type(values[at]) is not PackedBatch and len(values[at]) < SPLICE_FROM)
            for at in batch_at
        ):
            whole: bytes = _packb(values)  # cheaper for a short batch
            return whole
        parts = [header]
        for position, value in enumerate(values):
            if position in batch_at and value is not None:
                parts.append(_packed_batch(value))
            else:
                parts.append(_packb(value))
        return b"".join(parts)

    return spliced, True


# --------------------------------------------------------------------------- public API


def encode_message(msg: PeerMessage) -> bytes:
    """Encode one peer message as ``[FORMAT_VERSION, message]``."""
    packer = _PEER_PACKERS.get(type(msg))
    if packer is None:
        raise _wrong_class(msg, "peer message")
    result: bytes = _ENVELOPE + packer(msg)
    return result


def decode_message(data: bytes) -> PeerMessage:
    """Decode what ``encode_message`` made. Raises ``DecodeError`` for anything else."""
    body = _open(_unpack(data), "message")
    result: PeerMessage = _decode_tagged(body, _PEER_DECODERS, "peer message")
    return result


def encode_frame(msgs: Sequence[PeerMessage]) -> bytes:
    """Encode peer messages for one peer as one frame ``[FORMAT_VERSION, [message, ...]]``."""
    if len(msgs) > MAX_FRAME_MESSAGES:
        raise LocalProtocolError(
            f"a frame holds at most {MAX_FRAME_MESSAGES} messages, got {len(msgs)}"
        )
    encoders = _PEER_ENCODERS
    try:
        if any(type(m) in _SPLICED for m in msgs):  # batches in it: packed once each
            packers = _PEER_PACKERS
            return _frame_of([packers[type(m)](m) for m in msgs])
        body = [encoders[type(m)](m) for m in msgs]
    except KeyError:
        bad = next(m for m in msgs if type(m) not in encoders)
        raise _wrong_class(bad, "peer message") from None
    result: bytes = _packb((FORMAT_VERSION, body))
    return result


def encode_frames(
    msgs: Sequence[PeerMessage], max_bytes: int, *, target_bytes: int | None = None
) -> list[bytes]:
    """``encode_frame`` for any number of messages: as few frames as possible, in order, each
    at most ``target_bytes`` long (default ``max_bytes``) unless it holds one message alone,
    and none over ``max_bytes`` (a turn's messages for one peer, say, a catch-up answer
    included, may add up to more than a frame may hold). A smaller target bounds how long
    the receiver spends decoding one frame.

    Raises ``LocalProtocolError`` if a single message is over ``max_bytes`` (cores bound
    their batches so that this cannot happen).
    """
    target = max_bytes if target_bytes is None else min(target_bytes, max_bytes)
    if len(msgs) <= MAX_FRAME_MESSAGES:
        frame = encode_frame(msgs)  # the common case: one pack, one frame
        if len(frame) <= target:
            return [frame]
    # Big (a catch-up answer, say): each message packed once, then grouped greedily. A
    # frame's body is an array header followed by its messages' packed bytes.
    packers = _PEER_PACKERS
    frames: list[bytes] = []
    group: list[bytes] = []
    size = 0
    for msg in msgs:
        packer = packers.get(type(msg))
        if packer is None:
            raise _wrong_class(msg, "peer message")
        packed = packer(msg)
        if len(_ENVELOPE) + len(_array_header(1)) + len(packed) > max_bytes:
            raise LocalProtocolError(
                f"a {type(msg).__name__} of {len(packed)} bytes does not fit a frame of "
                f"{max_bytes}"
            )
        grown = len(_ENVELOPE) + len(_array_header(len(group) + 1)) + size + len(packed)
        if group and (grown > target or len(group) == MAX_FRAME_MESSAGES):
            frames.append(_frame_of(group))
            group, size = [], 0
        group.append(packed)
        size += len(packed)
    if group:
        frames.append(_frame_of(group))
    return frames


def _array_header(count: int) -> bytes:
    """msgpack's header of an array of ``count`` values."""
    if count < 16:
        return bytes((0x90 | count,))
    if count <= 0xFFFF:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def _frame_of(packed: list[bytes]) -> bytes:
    """``[FORMAT_VERSION, [message, ...]]`` from messages packed one by one."""
    return b"".join((_ENVELOPE, _array_header(len(packed)), *packed))


#: a frame's first bytes: a two-value array, then the version
_ENVELOPE: Final = bytes((0x92,)) + msgpack.packb(FORMAT_VERSION)

# (after _array_header, which the packers use)
_PEER_PACKERS: Final = {cls: _packer(cls, enc)[0] for cls, enc in _PEER_ENCODERS.items()}
_RECORD_PACKERS: Final = {cls: _packer(cls, enc)[0] for cls, enc in _RECORD_ENCODERS.items()}
_SPLICED: Final = frozenset(
    cls for cls, enc in (*_PEER_ENCODERS.items(), *_RECORD_ENCODERS.items())
    if _packer(cls, enc)[1]
)


def decode_frame(data: bytes, *, lazy_batches: bool = False) -> list[PeerMessage]:
    """Decode what ``encode_frame`` made, in order. Raises ``DecodeError`` for anything else.

    ``lazy_batches``: the batches of the messages an acceptor takes in (the fields whose
    rule is ``lazy``) stay packed, as ``PackedBatch``: the frame passes the same checks as
    without, except that such a batch's commands are checked when something first reads
    them (a batch that fails those reads as empty, alike on every replica). A frame shorter
    than ``LAZY_FROM_BYTES`` is decoded whole (its batches are short: decoding them costs
    less than keeping them). A frame refused is refused as without ``lazy_batches``, in the
    same words.
    """
    if lazy_batches and len(data) >= LAZY_FROM_BYTES:
        try:
            return _messages(_open(_unpack_keeping_batches(data, framed=True), "frame"))
        except DecodeError:
            pass  # refused: worded below, where the checks may stop earlier (in a batch)
    return _messages(_open(_unpack(data), "frame"))


def encode_record(rec: Record) -> bytes:
    """Encode one durable record as ``[FORMAT_VERSION, record]`` (a WAL payload)."""
    packer = _RECORD_PACKERS.get(type(rec))
    if packer is None:
        raise _wrong_class(rec, "record")
    result: bytes = _ENVELOPE + packer(rec)
    return result


def decode_record(data: bytes, *, lazy_batches: bool = False) -> Record:
    """Decode what ``encode_record`` made. Raises ``DecodeError`` for anything else.

    ``lazy_batches``: as for ``decode_frame`` (a log holds the bytes its replica received,
    so it reads them back the way it took them in)."""
    if lazy_batches and len(data) >= LAZY_FROM_BYTES:
        try:
            return _record(_open(_unpack_keeping_batches(data, framed=False), "record",
                                 RECORD_VERSIONS_READ))
        except DecodeError:
            pass  # refused: worded below, as for a frame
    return _record(_open(_unpack(data), "record", RECORD_VERSIONS_READ))


def _record(body: object) -> Record:
    result: Record = _decode_tagged(body, _RECORD_DECODERS, "record")
    return result


# --------------------------------------------------------------------------- lazy batches
# An acceptor persists a batch and acknowledges it without reading its commands. The lazy
# decoder differs from the eager one in how it unpacks, never in what it checks:
# ``_unpack_keeping_batches`` gives the value ``_unpack`` gives, except that each batch of a
# ``lazy`` rule is a ``PackedBatch`` of its bytes (msgpack's streaming unpacker skips over
# it), and the checks above run on that value. The walk keeps a batch packed only if its
# field's check would pass it, an array within the rule's limit, and the same generated code
# checks its commands when they are first read (``_decode_packed_batch``). Anything else it
# reads as a value, for the checks to refuse; what it does not expect (a msgpack error,
# trailing bytes, an envelope that is not [version, body]) it refuses, and the decoder
# then unpacks the bytes whole, to refuse them in ``_unpack``'s words.

#: a frame or record shorter than this is decoded whole (a batch of a few commands decodes
#: for less than walking its frame value by value costs)
LAZY_FROM_BYTES: Final = 1024


def _lazy_rules() -> dict[int, tuple[_Array | None, ...]]:
    """tag -> for each value of its tagged array (the tag first), its rule if the value is a
    batch a lazy decoder keeps packed, else None (only the tags of classes with one)."""
    found: dict[int, tuple[_Array | None, ...]] = {}
    for cls in (*_PEER_CLASSES, *_RECORD_CLASSES):
        rules = (None, *(
            ftype if isinstance(ftype, _Array) and ftype.lazy else None
            for _, ftype in _LAYOUT[cls]
        ))
        if any(rules):
            found[TAGS[cls]] = rules
    return found


_LAZY_AT: Final = _lazy_rules()
_WALK_ERRORS: Final = (*_UNPACK_ERRORS, msgpack.OutOfData, IndexError)
_FIXARRAY: Final = 0x90
_ARRAY16: Final = 0xDC
_ARRAY32: Final = 0xDD


def _array_count(data: bytes, at: int) -> int:
    """The length of the msgpack array whose header is at ``data[at]``, or -1."""
    head = data[at]
    if head & 0xF0 == _FIXARRAY:
        return head & 0x0F
    if head == _ARRAY16:
        return int.from_bytes(data[at + 1 : at + 3], "big")
    if head == _ARRAY32:
        return int.from_bytes(data[at + 1 : at + 5], "big")
    return -1


class _NotPlain(DecodeError):
    """The walk met what it does not expect: ``_unpack`` words the error."""


def _unpack_keeping_batches(data: bytes, *, framed: bool) -> tuple[object, object]:
    """``_unpack(data)`` for a frame (``framed``) or a record, its lazy batches kept packed.
    Raises ``_NotPlain`` for what it does not expect (see above)."""
    try:
        unpacker = _unpacker(data)
        if unpacker.read_array_header() != 2:
            raise _NotPlain
        version = unpacker.unpack()
        if framed:
            count = unpacker.read_array_header()
            if count > MAX_FRAME_MESSAGES:  # _messages refuses it: no need to walk it
                raise _NotPlain
            body: object = tuple([_take_tagged(unpacker, data) for _ in range(count)])
        else:
            body = _take_tagged(unpacker, data)
        if unpacker.tell() != len(data):
            raise _NotPlain
    except _WALK_ERRORS:
        raise _NotPlain from None
    return version, body


def _take_tagged(unpacker: msgpack.Unpacker, data: bytes) -> object:
    """The tagged array at the unpacker's position, its lazy batches kept packed."""
    start = unpacker.tell()
    rules = _LAZY_AT.get(data[start + 1]) if data[start] & 0xF0 == _FIXARRAY else None
    if rules is None or data[start] & 0x0F != len(rules):
        return unpacker.unpack()  # no batch to keep: what _unpack gives
    unpacker.read_array_header()
    values: list[object] = []
    append = values.append
    for rule in rules:
        if rule is not None:
            at = unpacker.tell()
            if 0 <= _array_count(data, at) <= rule.limit:
                unpacker.skip()
                append(PackedBatch(data[at : unpacker.tell()]))
                continue
        append(unpacker.unpack())
    return tuple(values)


_decode_batch: Final = _generated["_dec_seq_Command"]


def _decode_packed_batch(packed: bytes) -> tuple[Command, ...]:
    """``PackedBatch.decoder``: its bytes -> its commands, checked by the code that checks a
    batch decoded with its message (every lazy batch has ``_LAZY_BATCH``'s limit)."""
    commands: tuple[Command, ...] = _decode_batch(_unpack(packed), "batch", _LAZY_BATCH.limit)
    return commands


PackedBatch.decoder = _decode_packed_batch

# --------------------------------------------------------------------------- stream framing

_LENGTH: Final = struct.Struct(">I")


def frame_to_wire(payload: bytes, *, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """``payload`` with its 4-byte big-endian length in front, for a byte stream.

    Raises ``LocalProtocolError`` if the payload is over ``max_frame`` (the receiving
    ``FrameReader`` would drop the connection).
    """
    if len(payload) > max_frame:
        raise LocalProtocolError(f"frame of {len(payload)} bytes is over {max_frame}")
    return _LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Splits a byte stream of ``frame_to_wire`` frames back into payloads.

    Feed it whatever the socket returns; it buffers partial frames across calls. A declared
    length over ``max_frame`` raises ``DecodeError`` as soon as the 4-byte header arrives,
    before anything is buffered for it. That leaves the stream position unknown, so the reader
    is then *poisoned*: it drops its buffer (and any payload completed by the same ``feed``
    call) and every later ``feed`` raises ``DecodeError`` again. The caller should close the
    connection.
    """

    __slots__ = ("_buffer", "_error", "max_frame")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if type(max_frame) is not int or not 0 <= max_frame <= 0xFFFFFFFF:
            raise ConfigError(f"max_frame must be an int in 0..2**32-1, got {max_frame!r}")
        self.max_frame: Final = max_frame
        self._buffer = bytearray()
        self._error: str | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned (a partial frame)."""
        return len(self._buffer)

    @property
    def poisoned(self) -> bool:
        """True once ``feed`` has raised: the connection should be closed."""
        return self._error is not None

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data`` from the stream; return every payload it completes, in order."""
        if self._error is not None:
            raise DecodeError(f"stream already failed: {self._error}")
        buffer = self._buffer
        if buffer:
            buffer += data
            held = len(buffer)
            if held < 4:
                return []
            (length,) = _LENGTH.unpack_from(buffer)
            if length <= self.max_frame and held - 4 < length:
                return []  # the frame held is still partial: nothing copied until it is whole
            data = bytes(buffer)
            buffer.clear()
        elif type(data) is not bytes:
            data = bytes(data)
        # the payloads are sliced out of the bytes read (most reads end on a frame's end, so
        # nothing is held between them): one copy each, no bytearray or memoryview between
        end = len(data)
        out: list[bytes] = []
        append, unpack_from, max_frame = out.append, _LENGTH.unpack_from, self.max_frame
        pos = 0
        while end - pos >= 4:
            (length,) = unpack_from(data, pos)
            if length > max_frame:
                self._error = f"frame length {length} is over the limit {max_frame}"
                break
            start = pos + 4
            if end - start < length:
                break
            pos = start + length
            append(data[start:pos])
        if self._error is not None:
            self._buffer = bytearray()
            raise DecodeError(self._error)
        if pos < end:
            buffer += memoryview(data)[pos:]
        return out
