"""The client wire protocol: length-prefixed msgpack frames (``codec.frame_to_wire``).

Request ``[req_id, kind, client_id, seq, op, keys, blind]``:

* ``kind`` is ``"cmd"`` (a command through the log), ``"read"`` (a linearizable read through
  the sequencer) or ``"stale"`` (a read of the replica's local state, possibly stale);
  ``"partition"`` is the test-only fault layer (refused unless the replica runs with
  ``--fault-injection``): ``op`` is a msgpack array of the peer ids to cut off from now on, in
  both directions (empty: heal), or a map ``{"from": [ids], "to": [ids]}`` for one-way cuts
  (frames arriving from the first are dropped, frames sent to the second are; see
  ``Cut``), and ``client_id``, ``seq``, ``keys`` are ignored;
* ``"backup"`` takes a consistent snapshot (``consensus.runtime.backup``): a linearizable read
  barrier, then the state machine's snapshot at the position it reached, kept by the replica
  for chunked reading; the ``ok`` payload is msgpack ``[token, size, sha256, slot]``. A TLS
  cluster answers it to an admin only. ``"backup-chunk"``: ``op`` is msgpack
  ``[token, offset]``, the ``ok`` payload the next bytes of that snapshot (``definite`` once
  the replica dropped it: a newer backup replaced it);
* ``"status"`` asks the replica about itself (``consensus.runtime.status``): the ``ok``
  payload is a msgpack map (role, view, applied position, lag, disk use, readiness, the
  cluster's members, ...); it goes through no log and any client may ask;
* ``req_id`` is the connection's own number for matching answers (pipelining);
* ``(client_id, seq)`` identifies the request across retries and replicas.

Response ``[req_id, status, payload, position]``:

* ``"ok"``: ``payload`` is the state machine's result (bytes; empty for a blind write acked
  when ready) and ``position`` its place in the global log (-1 when not executed yet or a read);
* ``"definite"``: it did not and will not take effect, ``payload`` says why (str);
* ``"indefinite"``: it may or may not take effect; retry with the same ``(client_id, seq)``;
* ``"error"``: the request itself was invalid (str reason); nothing was done;
* ``"denied"``: a TLS cluster refused it to the principal of the client's certificate (str
  reason); nothing was done (a definite failure: ``consensus.auth.PermissionDenied``);
* ``"expired"``: the request's session is gone from the replicated session table (evicted,
  closed, or never opened in time: ``consensus.sessions``), so it was not applied and never
  will be (str reason; ``position`` is the cluster's log time, Unix seconds, from which the
  client opens its next session: ``consensus.errors.SessionExpired``).

A request that does not decode is answered ``"error"`` under its own ``req_id`` when that much
of it can be read (``BadRequest.req_id``), the reason naming the limit it broke (an op over
``MAX_OP_BYTES``, say), else under ``req_id`` 0, which the client takes as the answer to
every request it has in flight on the connection: ``NO_REQUEST``. A TLS cluster that refuses a
client's certificate after the handshake (revoked, of another cluster, not a client's)
answers ``NO_REQUEST`` ``"denied"`` with the reason before it closes the connection (the
client raises ``TlsRefused``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

import msgpack

from consensus.codec import (
    MAX_KEY_BYTES,
    MAX_KEYS_PER_COMMAND,
    MAX_OP_BYTES,
    checked_command,
    frame_to_wire,
)
from consensus.errors import DecodeError
from consensus.messages import Command

__all__ = [
    "NO_REQUEST",
    "BadRequest",
    "ClientRequest",
    "ClientResponse",
    "Cut",
    "decode_partition",
    "decode_request",
    "decode_request_parts",
    "decode_response",
    "empty_ok_response_wire",
    "encode_partition",
    "ok_response_wire",
]

Kind = Literal["cmd", "read", "stale", "partition", "backup", "backup-chunk", "status"]
Status = Literal["ok", "definite", "indefinite", "error", "denied", "expired"]
KINDS = ("cmd", "read", "stale", "partition", "backup", "backup-chunk", "status")
STATUSES = ("ok", "definite", "indefinite", "error", "denied", "expired")


@dataclass(frozen=True, slots=True)
class ClientRequest:
    req_id: int
    kind: Kind
    command: Command

    def encode(self) -> bytes:
        c = self.command
        packed: bytes = msgpack.packb(
            [self.req_id, self.kind, c.client_id, c.seq, c.op, list(c.keys), c.blind]
        )
        return packed


@dataclass(frozen=True, slots=True)
class ClientResponse:
    req_id: int
    status: Status
    payload: bytes | str
    position: int = -1

    def encode(self) -> bytes:
        packed: bytes = msgpack.packb([self.req_id, self.status, self.payload, self.position])
        return packed


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_INT64_END = 1 << 63
#: a request is the hot path of every read: exact type checks (msgpack yields exact types;
#: ``type(x) is int`` also excludes bool) and tuples straight from the decoder
_REQUEST_LIMITS = {
    "use_list": False,
    "max_bin_len": MAX_OP_BYTES,
    "max_str_len": MAX_KEY_BYTES,
    "max_array_len": max(MAX_KEYS_PER_COMMAND, 7),
    "max_map_len": 0,
}


# a request is built as the codec builds messages (``object.__new__`` and the slots'
# setters): the frozen dataclass's ``__init__`` costs about twice as much, once per request
_new = object.__new__
_set_req_id = ClientRequest.__dict__["req_id"].__set__
_set_kind = ClientRequest.__dict__["kind"].__set__
_set_command = ClientRequest.__dict__["command"].__set__


#: the ``req_id`` of an answer to no request in particular: to all of the connection's
NO_REQUEST = 0


class BadRequest(DecodeError):
    """A request that does not decode; ``req_id``: its own, when that much could be read
    (else ``NO_REQUEST``)."""

    def __init__(self, reason: str, req_id: int = NO_REQUEST) -> None:
        super().__init__(reason)
        self.req_id = req_id


def _undecodable(payload: bytes, error: Exception) -> BadRequest:
    """Why ``payload`` is no request, under its ``req_id`` if it has one. Read again without
    the limits (a payload is at most a client frame: ``conn_limits``) to name the one it
    broke."""
    try:
        fields = msgpack.unpackb(payload, use_list=False, max_map_len=0)
    except Exception:
        return BadRequest(f"request is not valid msgpack: {error}")
    if type(fields) is not tuple or not fields or type(fields[0]) is not int or not (
        0 <= fields[0] < _INT64_END
    ):
        return BadRequest(f"request is not valid msgpack: {error}")
    req_id = fields[0]
    if len(fields) == 7:
        op, keys = fields[4], fields[5]
        if isinstance(op, bytes) and len(op) > MAX_OP_BYTES:
            return BadRequest(f"op of {len(op)} bytes is over the limit of {MAX_OP_BYTES} "
                              "bytes", req_id)
        if isinstance(keys, tuple) and len(keys) > MAX_KEYS_PER_COMMAND:
            return BadRequest(f"{len(keys)} keys are over the limit of {MAX_KEYS_PER_COMMAND}",
                              req_id)
        for key in keys if isinstance(keys, tuple) else ():
            if isinstance(key, str) and len(key.encode()) > MAX_KEY_BYTES:
                return BadRequest(f"a key of {len(key.encode())} bytes is over the limit of "
                                  f"{MAX_KEY_BYTES} bytes", req_id)
    return BadRequest(f"request is not valid msgpack: {error}", req_id)


def decode_request(payload: bytes) -> ClientRequest:
    """The request in ``payload``; ``BadRequest`` (a ``DecodeError``) naming what is wrong."""
    req_id, kind, command = decode_request_parts(payload)
    request: ClientRequest = _new(ClientRequest)  # checked: no __init__ to run
    _set_req_id(request, req_id)
    _set_kind(request, kind)
    _set_command(request, command)
    return request


def decode_request_parts(payload: bytes) -> tuple[int, Kind, Command]:
    """``decode_request``'s request as its three fields, without the object: the client port
    reads them once each for every request it takes (refused alike, with the same error)."""
    try:
        fields = msgpack.unpackb(payload, **_REQUEST_LIMITS)
    except Exception as exc:
        raise _undecodable(payload, exc) from None
    if type(fields) is not tuple or len(fields) != 7:
        raise BadRequest("request must be [req_id, kind, client_id, seq, op, keys, blind]")
    req_id, kind, client_id, seq, op, keys, blind = fields
    if type(req_id) is not int or not 0 <= req_id < _INT64_END:
        raise BadRequest("req_id must be a non-negative int64")
    if type(client_id) is not int or type(seq) is not int:
        raise BadRequest("client_id and seq must be integers", req_id)
    if not (0 <= client_id < _INT64_END and 0 <= seq < _INT64_END):
        raise BadRequest("client_id and seq must be non-negative int64", req_id)
    if kind not in KINDS:
        raise BadRequest(f"kind must be one of {KINDS}, got {kind!r}", req_id)
    if type(op) is not bytes:
        raise BadRequest("op must be bytes", req_id)
    if type(keys) is not tuple:
        raise BadRequest("keys must be a list of strings", req_id)
    for key in keys:
        if type(key) is not str:
            raise BadRequest("keys must be a list of strings", req_id)
    if type(blind) is not bool:
        raise BadRequest("blind must be a boolean", req_id)
    return req_id, kind, checked_command(client_id, seq, op, keys, blind)


_packer = msgpack.Packer()


def ok_response_wire(req_id: int, payload: bytes, position: int) -> bytes:
    """``ClientResponse(req_id, "ok", payload, position)`` encoded and framed: the answer to
    every read and write, built without the intermediate object."""
    return frame_to_wire(_packer.pack((req_id, "ok", payload, position)))


#: ``ok_response_wire``'s response array around the request id, for an empty payload at no
#: position (a blind write acknowledged once ready): the array header, then "ok", b"", -1
_EMPTY_OK_HEAD: Final = b"\x94"
_EMPTY_OK_TAIL: Final = _packer.pack("ok") + _packer.pack(b"") + _packer.pack(-1)
_EMPTY_OK_AROUND: Final = len(_EMPTY_OK_HEAD) + len(_EMPTY_OK_TAIL)
_pack_int: Final = _packer.pack
_frame_length: Final = struct.Struct(">I").pack  # frame_to_wire's length prefix


def empty_ok_response_wire(req_id: int) -> bytes:
    """``ok_response_wire(req_id, b"", -1)`` (the same bytes): only the request id is packed,
    once per blind write a loaded replica answers (0.42 -> 0.24 us)."""
    packed_id = _pack_int(req_id)
    return b"".join((_frame_length(len(packed_id) + _EMPTY_OK_AROUND), _EMPTY_OK_HEAD,
                     packed_id, _EMPTY_OK_TAIL))


def decode_response(payload: bytes) -> ClientResponse:
    try:
        fields = msgpack.unpackb(payload, max_array_len=4, max_map_len=0)
    except Exception as exc:
        raise DecodeError(f"response is not valid msgpack: {exc}") from None
    if not isinstance(fields, list) or len(fields) != 4:
        raise DecodeError("response must be [req_id, status, payload, position]")
    req_id, status, body, position = fields
    if not _is_int(req_id) or not _is_int(position) or status not in STATUSES:
        raise DecodeError("malformed response")
    if not isinstance(body, bytes | str):
        raise DecodeError("response payload must be bytes or str")
    return ClientResponse(req_id, status, body, position)


@dataclass(frozen=True, slots=True)
class Cut:
    """What a ``"partition"`` request asks of the replica's transport (test only): drop the
    frames that arrive from ``drop_from`` and those it would send to ``drop_to``. Both equal:
    a partition; one empty: a one-way cut (a replica that hears a peer the peer cannot hear)."""

    drop_from: frozenset[int]
    drop_to: frozenset[int]


def encode_partition(drop_from: Iterable[int], drop_to: Iterable[int]) -> bytes:
    """A ``"partition"`` request's ``op`` for a one-way (or two-way) cut."""
    packed: bytes = msgpack.packb({"from": sorted(drop_from), "to": sorted(drop_to)})
    return packed


def decode_partition(op: bytes, replicas: int) -> Cut:
    """The cut a ``"partition"`` request's ``op`` asks for: an array of peer ids (both
    directions) or a map ``{"from": ids, "to": ids}``."""
    try:
        peers = msgpack.unpackb(op, max_array_len=replicas, max_map_len=2)
    except Exception as exc:
        raise DecodeError(f"partition op is not msgpack: {exc}") from None
    if isinstance(peers, dict):
        if set(peers) != {"from", "to"}:
            raise DecodeError('partition op must be a list of ids or {"from": ids, "to": ids}')
        return Cut(_replica_ids(peers["from"], replicas), _replica_ids(peers["to"], replicas))
    both = _replica_ids(peers, replicas)
    return Cut(both, both)


def _replica_ids(peers: object, replicas: int) -> frozenset[int]:
    if not isinstance(peers, list) or not all(_is_int(p) and 0 <= p < replicas for p in peers):
        raise DecodeError(f"partition op must list replica ids in [0, {replicas})")
    return frozenset(peers)
