"""Who asked: the authenticated principal a TLS cluster's commands carry through the log.

A TLS cluster (``[tls]`` in the cluster file, ``consensus.runtime.tls``) knows every client by
its certificate, which names it, its role and, for a scheduler, the virtual clusters it may
touch. The replica that serves a client authenticates it and wraps each of its operations in
an *envelope* naming that principal, ``ENVELOPE_MAGIC + u16 length + header + op`` with
``header = msgpack([name, role, [vcs]])`` (big-endian length of the header), except an
admin's (below);
the envelope is the command's ``op`` in the log, so every replica checks the same principal
against the same state when it applies the command and reaches the same verdict.

``ENVELOPE_MAGIC`` begins with 0xC1, the one byte msgpack never uses, so no msgpack-encoded
operation (the built-in key-value store's, the GPU store's) is mistaken for an envelope. A
client cannot forge one: the serving replica wraps whatever a TLS client sends, so a forged
envelope ends up *inside* a real one, and an envelope whose operation is itself an envelope is
refused. Operations without an envelope come from the replica's own process (an embedded
caller), which is trusted, or from an admin: an admin may do everything, so no verdict
depends on naming one, and sealing and opening an envelope per command at every replica cost
about a quarter of a TLS cluster's throughput at 16 B (measured). An admin's session is its
own all the same (below).

Roles: ``admin`` may do everything; ``reader`` may read everything and change nothing;
``scheduler`` acts only on its virtual clusters (what that means is the state machine's to say:
``Authorizer``). A state machine that implements no ``Authorizer`` lets admins do everything,
readers read and nobody else anything.

Sessions are the principal's own: the serving replica replaces a client's id by
``session_id(principal, client_id)``, a hash of both, so one principal can neither read another's
remembered results nor take its (client id, sequence number) first. A retry by the same
principal maps to the same id at any replica; a command its session already executed answers
its first result without being judged again (the state may have changed since). The session a
sealed command opens counts toward its principal's cap (``consensus.sessions``); an admin's
(bare) ones toward the total only.

Nothing here does I/O (the simulator and the state machines import it).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

import msgpack

from consensus.errors import DecodeError, DefiniteFailure
from consensus.messages import Command
from consensus.sessions import CANCEL_OP, SessionTable, denied_result
from consensus.statemachine import DefersQueries, StateMachine, batch_applier

__all__ = [
    "ADMIN",
    "ENVELOPE_MAGIC",
    "READER",
    "ROLES",
    "SCHEDULER",
    "AnswerFilter",
    "Authorizer",
    "AuthorizingMachine",
    "Denied",
    "PermissionDenied",
    "Principal",
    "open_envelope",
    "seal",
    "sealer",
    "session_id",
]

ADMIN: Final = "admin"
SCHEDULER: Final = "scheduler"
READER: Final = "reader"
ROLES: Final = (ADMIN, SCHEDULER, READER)

#: 0xC1 is never produced by msgpack: no msgpack operation starts like an envelope
ENVELOPE_MAGIC: Final = b"\xc1sdpaxos-principal\x00"
#: bounds on what a certificate may name (a principal travels with every command)
MAX_NAME_BYTES: Final = 128
MAX_VCS: Final = 64
MAX_VC_BYTES: Final = 128
#: the length of an envelope's principal header, in front of it
_HEADER_LENGTH = struct.Struct(">H")
#: the longest principal header (msgpack headers, name, role, VCs)
MAX_HEADER_BYTES: Final = 16 + MAX_NAME_BYTES + 16 + MAX_VCS * (MAX_VC_BYTES + 2)
#: the most an envelope adds to an operation
ENVELOPE_OVERHEAD: Final = len(ENVELOPE_MAGIC) + _HEADER_LENGTH.size + MAX_HEADER_BYTES
#: principal headers decoded lately, by their bytes: a command's principal costs a dict
#: lookup, not a decode and a validation (a replica applies tens of thousands a second)
_HEADER_CACHE_SIZE: Final = 1024


class PermissionDenied(DefiniteFailure):
    """The principal may not do this; nothing was changed."""


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated client: its name, role and (scheduler) virtual clusters."""

    name: str
    role: str
    vcs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problem = principal_problem(self.name, self.role, self.vcs)
        if problem is not None:
            raise ValueError(problem)

    def describe(self) -> str:
        vcs = f" on {','.join(self.vcs)}" if self.role == SCHEDULER else ""
        return f"{self.role} {self.name!r}{vcs}"


def principal_problem(name: str, role: str, vcs: tuple[str, ...]) -> str | None:
    """Why these cannot be a principal (None: they can)."""
    if not name or len(name.encode()) > MAX_NAME_BYTES:
        return f"a principal's name must be 1..{MAX_NAME_BYTES} bytes"
    if role not in ROLES:
        return f"role must be one of {', '.join(ROLES)}, got {role!r}"
    if role == SCHEDULER and not vcs:
        return "a scheduler needs at least one virtual cluster"
    if role != SCHEDULER and vcs:
        return f"only a scheduler is restricted to virtual clusters, not a {role}"
    if len(vcs) > MAX_VCS or any(not vc or len(vc.encode()) > MAX_VC_BYTES for vc in vcs):
        return f"at most {MAX_VCS} virtual clusters of 1..{MAX_VC_BYTES} bytes each"
    if list(vcs) != sorted(set(vcs)):
        return "virtual clusters must be sorted and distinct"
    return None


@dataclass(frozen=True, slots=True)
class Denied:
    """An operation refused by authorization (nothing was changed)."""

    reason: str


def sealer(principal: Principal) -> bytes:
    """What ``seal`` puts in front of every operation of ``principal`` (compute it once per
    connection: sealing is then one concatenation)."""
    header: bytes = msgpack.packb([principal.name, principal.role, list(principal.vcs)])
    return ENVELOPE_MAGIC + _HEADER_LENGTH.pack(len(header)) + header


#: session ids are non-negative int64 (what the codec accepts)
_SESSION_MASK: Final = (1 << 63) - 1
_session_ids: dict[tuple[bytes, int], int] = {}


def session_id(prefix: bytes, client_id: int) -> int:
    """The client id a command of ``client_id`` carries on behalf of the principal whose
    ``sealer`` is ``prefix``: its session, no other principal's."""
    key = (prefix, client_id)
    known = _session_ids.get(key)
    if known is None:
        digest = hashlib.blake2b(prefix + client_id.to_bytes(8, "big"), digest_size=8).digest()
        if len(_session_ids) >= _HEADER_CACHE_SIZE:
            _session_ids.clear()
        known = _session_ids[key] = int.from_bytes(digest, "big") & _SESSION_MASK
    return known


def seal(principal: Principal, op: bytes) -> bytes:
    """``op`` in an envelope naming ``principal``."""
    return sealer(principal) + op


_headers: dict[bytes, Principal] = {}
_MAGIC_END: Final = len(ENVELOPE_MAGIC)
_HEADER_START: Final = _MAGIC_END + _HEADER_LENGTH.size


def _principal(header: bytes) -> Principal:
    known = _headers.get(header)
    if known is not None:
        return known
    try:
        fields = msgpack.unpackb(header, max_array_len=max(MAX_VCS, 3), max_map_len=0)
    except Exception as exc:
        raise DecodeError(f"malformed principal envelope: {exc}") from None
    match fields:
        case [str(name), str(role), list(vcs)] if all(isinstance(vc, str) for vc in vcs):
            pass
        case _:
            raise DecodeError("a principal envelope's header must be [name, role, [vcs]]")
    problem = principal_problem(name, role, tuple(vcs))
    if problem is not None:
        raise DecodeError(f"bad principal in envelope: {problem}")
    if len(_headers) >= _HEADER_CACHE_SIZE:
        _headers.clear()  # bounded; the live principals come back at once
    principal = _headers[header] = Principal(name, role, tuple(vcs))
    return principal


def open_envelope(op: bytes) -> tuple[Principal | None, bytes]:
    """``(principal, inner op)`` of an envelope, ``(None, op)`` of a bare operation.
    ``DecodeError`` for a malformed envelope or one nested in another."""
    if not op.startswith(ENVELOPE_MAGIC):
        return None, op
    if len(op) < _HEADER_START:
        raise DecodeError("a principal envelope cut short")
    end = _HEADER_START + int.from_bytes(op[_MAGIC_END:_HEADER_START], "big")
    if end - _HEADER_START > MAX_HEADER_BYTES or len(op) < end:
        raise DecodeError("a principal envelope's header is cut short or too long")
    header = op[_HEADER_START:end]
    principal = _headers.get(header) or _principal(header)
    inner = op[end:]
    if inner.startswith(ENVELOPE_MAGIC):
        raise DecodeError("an envelope inside an envelope (a client sent one of its own)")
    return principal, inner


@runtime_checkable
class Authorizer(Protocol):
    """A state machine that judges its own operations by principal. ``authorize`` must be
    deterministic over the machine's state (every replica calls it as it applies), change
    nothing, and answer None (allowed) or the reason of a refusal."""

    def authorize(self, principal: Principal, op: bytes, *, read: bool) -> str | None: ...


@runtime_checkable
class AnswerFilter(Protocol):
    """A state machine that trims a read's answer to what a principal may see (a scheduler's
    watch page holds its own virtual clusters' events only). Called after ``authorize``
    allowed the read; changes nothing."""

    def filter_answer(self, principal: Principal, op: bytes, answer: bytes) -> bytes: ...


def default_authorize(principal: Principal, *, read: bool) -> str | None:
    """For machines without an ``Authorizer``: admins everything, readers reads."""
    if principal.role == ADMIN or (principal.role == READER and read):
        return None
    return f"{principal.describe()} may not {'read' if read else 'change'} this state"


class AuthorizingMachine:
    """A state machine behind the envelope check: what a TLS cluster's replicas apply to.

    ``apply``/``query`` take enveloped or bare operations. A refused or malformed envelope
    changes nothing; ``run``/``ask`` return it as ``Denied`` (the node answers the client with
    a definite error), ``apply``/``query`` as the inner machine's refusal bytes are not known
    here, so as an empty answer. The wrapper holds no state of its own: snapshots are the
    inner machine's.
    """

    def __init__(self, inner: StateMachine) -> None:
        self.inner = inner
        sessions = getattr(inner, "sessions", None)
        #: the inner machine's session table, if it keeps one (a retry answers its first
        #: result, unjudged)
        self._sessions = sessions if isinstance(sessions, SessionTable) else None
        self._authorizer = inner if isinstance(inner, Authorizer) else None
        self._filter = inner if isinstance(inner, AnswerFilter) else None
        self._inner_batch = batch_applier(inner)

    def _check(
        self, op: bytes, *, read: bool
    ) -> tuple[Principal | None, bytes, Denied | None]:
        try:
            principal, inner_op = open_envelope(op)
        except DecodeError as exc:
            return None, op, Denied(str(exc))
        if principal is None or principal.role == ADMIN:  # an admin may do everything
            return principal, inner_op, None
        if self._authorizer is not None:
            reason = self._authorizer.authorize(principal, inner_op, read=read)
        else:
            reason = default_authorize(principal, read=read)
        denied = None if reason is None else Denied(f"permission denied: {reason}")
        return principal, inner_op, denied

    def run(self, position: int, command: Command) -> bytes | Denied:
        # the hot path of every command a TLS cluster applies: kept flat
        if not command.op.startswith(ENVELOPE_MAGIC):
            return self.inner.apply(position, command)
        sessions = self._sessions
        principal = None
        if sessions is not None and sessions.lookup(command.client_id, command.seq) is not None:
            # executed before (it was allowed then): its first result, not judged again; or
            # refused before: the remembered refusal, which the node answers as one
            # (``consensus.statemachine.SESSION_MARK``)
            inner_op = command.op[len(ENVELOPE_MAGIC):]  # not read by a session hit
        else:
            principal, inner_op, denied = self._check(command.op, read=False)
            if denied is not None and inner_op != CANCEL_OP:  # anyone may settle a request
                if sessions is not None:
                    # Remembered as the request's outcome: a later copy of it (a client retry
                    # proposed elsewhere) is refused too, never applied under a rule that
                    # changed meanwhile: the caller was told it failed for good.
                    sessions.principal = principal.name if principal is not None else ""
                    try:
                        sessions.record(command.client_id, command.seq,
                                        denied_result(denied.reason))
                    finally:
                        sessions.principal = ""
                return denied
        inner = Command(client_id=command.client_id, seq=command.seq, op=inner_op,
                        keys=command.keys, blind=command.blind)
        if sessions is None or principal is None:
            return self.inner.apply(position, inner)
        sessions.principal = principal.name  # the session it opens counts as the principal's
        try:
            return self.inner.apply(position, inner)
        finally:
            sessions.principal = ""

    def run_batch(self, position: int, commands: Sequence[Command]) -> list[bytes | Denied]:
        """``run`` of each command in turn, at ``position``, ``position + 1``, ...: the runs
        of bare commands (an admin's, the replica's own) go to the inner machine at once
        (``batch_applier``), each enveloped one is judged (``run``)."""
        results: list[bytes | Denied] = []
        start = 0  # the first command of the run of bare ones not yet applied
        for index, command in enumerate(commands):
            if command.op.startswith(ENVELOPE_MAGIC):
                if index > start:
                    results += self._inner_batch(position + start, commands[start:index])
                start = index + 1
                results.append(self.run(position + index, command))
        if start < len(commands):
            results += self._inner_batch(position + start,
                                         commands[start:] if start else commands)
        return results

    def ask(self, op: bytes) -> bytes | Denied:
        _, inner_op, denied = self._check(op, read=True)
        if denied is not None:
            return denied
        return self.filtered(op, self.inner.query(inner_op))

    def ask_later(self, op: bytes) -> Callable[[], bytes] | Denied | None:
        """``ask`` for a read the inner machine answers off the loop (``DefersQueries``):
        the refusal now, or the function that makes the inner answer later (in any thread;
        pass what it makes through ``filtered``, on the loop). None: ``ask`` now."""
        if not isinstance(self.inner, DefersQueries):
            return None
        _, inner_op, denied = self._check(op, read=True)
        return denied if denied is not None else self.inner.defer_query(inner_op)

    def filtered(self, op: bytes, answer: bytes) -> bytes:
        """The inner machine's ``answer`` to ``op`` as the principal it carries may see it."""
        if self._filter is not None and op.startswith(ENVELOPE_MAGIC):  # someone's read
            principal, inner_op = open_envelope(op)
            if principal is not None:
                answer = self._filter.filter_answer(principal, inner_op, answer)
        return answer

    # the StateMachine protocol, for callers that do not tell refusals apart
    def apply(self, position: int, command: Command) -> bytes:
        result = self.run(position, command)
        return b"" if isinstance(result, Denied) else result

    def query(self, op: bytes) -> bytes:
        result = self.ask(op)
        return b"" if isinstance(result, Denied) else result

    def snapshot(self) -> bytes:
        return self.inner.snapshot()

    def restore(self, data: bytes) -> None:
        self.inner.restore(data)
