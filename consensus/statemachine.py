"""The replicated state machine interface and the reference key-value store.

A state machine is deterministic: the same commands in the same order give the same results and
the same snapshot bytes on every replica. ``SessionTable`` (``consensus.sessions``) gives any
state machine exactly-once effects for retried requests: a command identified by
``(client_id, seq)`` is applied the first time it appears in the global log; a later copy (a
client retry that was proposed again, possibly at another replica) returns the first result
without applying; a request of a session the table evicted is not applied
(``SESSION_EXPIRED``). A state machine with a session table keeps it as ``sessions``, and
applies the log-time commands the replicas propose (``SessionTable.admit`` answers them).

Settling a request: a client that lost track of one of its requests (timeouts, a lost
connection, a replica that restarted) may have copies of it in several replicas' instances,
any of which may still be chosen and executed. It sends ``CANCEL_OP`` under the same
``(client_id, seq)``: the cancel is a copy like any other, so whichever of the copies comes
first in the log decides. If the request executed before, the cancel answers its first
result; if not, the session records ``CANCELLED`` as the request's result, so every later
copy is answered ``CANCELLED`` and never applied: the request never took effect and never
will (``consensus.attempts`` has the client's side of it). A request refused by the
authorization check as it applied is remembered the same way (``denied_result``), so a later
copy is refused too rather than applied under a rule that changed meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Final, Protocol, runtime_checkable

import msgpack

from consensus.messages import MAX_KEY_BYTES, Command
from consensus.sessions import (
    CANCEL_OP,
    CANCELLED,
    EXPIRED,
    SESSION_EXPIRED,
    SESSION_MARK,
    SESSION_WINDOW,
    SessionTable,
    denied_reason,
    denied_result,
)

__all__ = [
    "CANCELLED",
    "CANCEL_OP",
    "EXPIRED",
    "SESSION_EXPIRED",
    "SESSION_MARK",
    "SESSION_WINDOW",
    "BatchApplier",
    "DefersQueries",
    "KVStore",
    "SessionTable",
    "StateMachine",
    "batch_applier",
    "denied_reason",
    "denied_result",
    "kv_cas",
    "kv_delete",
    "kv_get",
    "kv_key_problem",
    "kv_put",
]


class StateMachine(Protocol):
    """What a protocol driver applies committed commands to.

    It may also have ``apply_batch(position, commands) -> list[bytes]`` (optional, see
    ``batch_applier``): a run of one slot's commands at once, with ``apply``'s results."""

    def apply(self, position: int, command: Command) -> bytes:
        """Apply ``command`` at global-log ``position`` (``Execution.position``: grows along
        the log, equal on every replica); return its result."""
        ...

    def query(self, op: bytes) -> bytes:
        """Answer a read-only ``op`` from the current state (changes nothing)."""
        ...

    def snapshot(self) -> bytes:
        """Everything needed to rebuild the current state, deterministically encoded."""
        ...

    def restore(self, data: bytes) -> None:
        """Replace the current state with a snapshot taken by ``snapshot``."""
        ...


@runtime_checkable
class DefersQueries(Protocol):
    """A state machine with read-only ops too costly for the replica's event loop (a digest
    of the whole state, say): they are answered off the loop, from what is read at once."""

    def defer_query(self, op: bytes) -> Callable[[], bytes] | None:
        """For such an ``op``: read now what its answer needs of the current state and
        return the function that makes the answer ``query(op)`` would have made now, later
        and in any thread (it must read nothing that applying later commands changes, as
        ``snapshot_writer.CapturesSnapshots`` does). None: answer it with ``query`` now."""
        ...


#: ``apply_batch(position, commands)``: apply ``commands`` at ``position``, ``position + 1``, ...
#: (consecutive places of one global slot); their results, in order
BatchApplier = Callable[[int, Sequence[Command]], list[bytes]]


def batch_applier(machine: StateMachine) -> BatchApplier:
    """How to apply a run of commands to ``machine``: its own ``apply_batch`` if it has one
    (an optional method: the same results as ``apply`` one command at a time, for less per
    command), else ``apply`` in a loop."""
    own: BatchApplier | None = getattr(machine, "apply_batch", None)
    if own is not None:
        return own
    apply = machine.apply

    def one_by_one(position: int, commands: Sequence[Command]) -> list[bytes]:
        return [apply(position + offset, command) for offset, command in enumerate(commands)]

    return one_by_one


_packer = msgpack.Packer()


#: a pair's key (sorting a dict's items by it gives the order of the pairs themselves)
_by_key: Final = itemgetter(0)


def _pack(value: object) -> bytes:
    packed: bytes = _packer.pack(value)  # one reusable packer: packb builds one per call
    return packed


_OK = _pack(["ok"])


def _error(reason: str) -> bytes:
    return _pack(["error", reason])


def kv_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a key of the store (None: it can): 1..``MAX_KEY_BYTES`` bytes of
    UTF-8, the most a command's keys may hold. The ``kv_*`` builders refuse such keys
    (``ValueError``) before anything is proposed; the store itself, applying a command,
    keeps taking what it took before, so an older log executes the same."""
    size = len(key.encode(errors="surrogatepass"))
    if not 1 <= size <= MAX_KEY_BYTES:
        return f"a key must be 1..{MAX_KEY_BYTES} bytes of UTF-8, not {size}"
    return None


def _key(key: str) -> str:
    problem = kv_key_problem(key)
    if problem is not None:
        raise ValueError(problem)
    return key


def kv_put(key: str, value: str) -> bytes:
    return _pack(["put", _key(key), value])


def kv_get(key: str) -> bytes:
    return _pack(["get", _key(key)])


def kv_cas(key: str, expected: str | None, new: str) -> bytes:
    return _pack(["cas", _key(key), expected, new])


def kv_delete(key: str) -> bytes:
    return _pack(["delete", _key(key)])


class KVStore:
    """A string key-value store: put, get, compare-and-set, delete.

    Operations (``Command.op``, built with ``kv_put`` & co) and results are msgpack arrays:

    =============================  ====================================================
    op                             result
    =============================  ====================================================
    ``["put", key, value]``        ``["ok"]``
    ``["get", key]``               ``["value", value_or_nil]``
    ``["cas", key, exp, new]``     ``["cas", swapped, value_before_or_nil]``
    ``["delete", key]``            ``["deleted", existed]``
    anything else                  ``["error", reason]`` (state unchanged)
    =============================  ====================================================
    """

    __slots__ = ("applied_position", "data", "sessions")

    def __init__(self, sessions: SessionTable | None = None) -> None:
        self.data: dict[str, str] = {}
        self.sessions = sessions if sessions is not None else SessionTable()
        self.applied_position = -1

    def apply(self, position: int, command: Command) -> bytes:
        self.applied_position = position
        previous = self.sessions.admit(command)
        if previous is not None:
            return previous
        result = self._execute(command.op)
        self.sessions.record(command.client_id, command.seq, result)
        return result

    def apply_batch(self, position: int, commands: Sequence[Command]) -> list[bytes]:
        """``apply`` of each command in turn, at ``position``, ``position + 1``, ... (see
        ``batch_applier``), each session looked up once (``SessionTable.run``)."""
        if not commands:
            return []
        results = self.sessions.run(commands, self._execute)
        self.applied_position = position + len(commands) - 1
        return results

    def query(self, op: bytes) -> bytes:
        """Serve a read (``kv_get``) without touching the log or the session table."""
        try:
            decoded = msgpack.unpackb(op)
        except Exception:
            return _error("op is not msgpack")
        if (
            isinstance(decoded, list)
            and len(decoded) == 2
            and decoded[0] == "get"
            and isinstance(decoded[1], str)
        ):
            return _pack(["value", self.data.get(decoded[1])])
        return _error("only get is a read-only op")

    def _execute(self, op_bytes: bytes) -> bytes:
        try:
            op = msgpack.unpackb(op_bytes)
        except Exception:
            return _error("op is not msgpack")
        if not isinstance(op, list) or len(op) < 2 or not isinstance(op[1], str):
            return _error("op must be [name, key, ...]")
        name, key = op[0], op[1]
        if name == "put" and len(op) == 3 and isinstance(op[2], str):
            self.data[key] = op[2]
            return _OK
        if name == "get" and len(op) == 2:
            return _pack(["value", self.data.get(key)])
        if name == "cas" and len(op) == 4 and isinstance(op[3], str):
            expected = op[2]
            if expected is not None and not isinstance(expected, str):
                return _error("cas expects a string or nil")
            current = self.data.get(key)
            if current == expected:
                self.data[key] = op[3]
                return _pack(["cas", True, current])
            return _pack(["cas", False, current])
        if name == "delete" and len(op) == 2:
            return _pack(["deleted", self.data.pop(key, None) is not None])
        return _error(f"unknown or malformed op {name!r}")

    def snapshot(self) -> bytes:
        # sorted by key alone: the keys are a dict's, all different, so the order is the
        # pairs' own, found without comparing a tuple per step (100k keys: 64 -> 41 ms)
        return _pack([self.applied_position, sorted(self.data.items(), key=_by_key),
                      self.sessions.to_state()])

    def restore(self, data: bytes) -> None:
        self.prepare_restore(data)()

    def prepare_restore(self, data: bytes) -> Callable[[], object]:
        """``restore(data)`` in two parts (``consensus.runtime.snapshot_writer.
        RestoresOffLoop``): the state built here, in any thread, beside the store's; made
        the store's by the function returned (which returns what it replaced)."""
        applied_position, items, sessions = msgpack.unpackb(data)
        loaded = dict(items)
        # under this table's caps: whether the loaded table is over one (its excess evicted
        # at the next log-time command) is worked out from them, and must come out as on the
        # replicas that never restarted
        table = SessionTable(self.sessions.limits)
        table.load_state(sessions)

        def adopt() -> object:
            replaced = [self.data, self.sessions.take(table)]
            self.applied_position = applied_position
            self.data = loaded
            return replaced

        return adopt
