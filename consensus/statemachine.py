"""The replicated state machine interface, client sessions, and the reference key-value store.

A state machine is deterministic: the same commands in the same order give the same results and
the same snapshot bytes on every replica. ``SessionTable`` gives any state machine
exactly-once effects for retried requests: a command identified by ``(client_id, seq)`` is
applied the first time it appears in the global log; a later copy (a client retry that was
proposed again, possibly at another replica) returns the first result without applying.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgpack

from consensus.messages import Command

__all__ = [
    "KVStore",
    "SessionTable",
    "StateMachine",
    "kv_cas",
    "kv_delete",
    "kv_get",
    "kv_put",
]


class StateMachine(Protocol):
    """What a protocol driver applies committed commands to."""

    def apply(self, position: int, command: Command) -> bytes:
        """Apply ``command`` at global-log ``position`` (``Execution.position``: grows along
        the log, equal on every replica); return its result."""
        ...

    def snapshot(self) -> bytes:
        """Everything needed to rebuild the current state, deterministically encoded."""
        ...

    def restore(self, data: bytes) -> None:
        """Replace the current state with a snapshot taken by ``snapshot``."""
        ...


#: How many recent results a session keeps per client. A pipelining client must not have more
#: outstanding requests than this.
SESSION_WINDOW = 256

#: The result of a request older than everything its session still remembers: it was applied
#: (the client has moved past it), but its result is gone.
EXPIRED = msgpack.packb(["expired"])


class SessionTable:
    """Per-client memory of recent results, so a retried request takes effect once."""

    __slots__ = ("_sessions",)

    def __init__(self) -> None:
        # client id -> {seq: result}; insertion order is seq order for a well-behaved client
        self._sessions: dict[int, dict[int, bytes]] = {}

    def lookup(self, client_id: int, seq: int) -> bytes | None:
        """The first result of ``(client_id, seq)`` if it already executed, else None."""
        results = self._sessions.get(client_id)
        if results is None:
            return None
        hit = results.get(seq)
        if hit is not None:
            return hit
        if len(results) >= SESSION_WINDOW and seq < min(results):
            return EXPIRED
        return None

    def record(self, client_id: int, seq: int, result: bytes) -> None:
        results = self._sessions.setdefault(client_id, {})
        results[seq] = result
        if len(results) > SESSION_WINDOW:
            del results[min(results)]

    def to_state(self) -> list[list[Any]]:
        return [
            [client, sorted(results.items())] for client, results in sorted(self._sessions.items())
        ]

    def load_state(self, state: list[list[Any]]) -> None:
        self._sessions = {int(c): {int(s): bytes(r) for s, r in items} for c, items in state}


def kv_put(key: str, value: str) -> bytes:
    return msgpack.packb(["put", key, value])


def kv_get(key: str) -> bytes:
    return msgpack.packb(["get", key])


def kv_cas(key: str, expected: str | None, new: str) -> bytes:
    return msgpack.packb(["cas", key, expected, new])


def kv_delete(key: str) -> bytes:
    return msgpack.packb(["delete", key])


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

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.sessions = SessionTable()
        self.applied_position = -1

    def apply(self, position: int, command: Command) -> bytes:
        self.applied_position = position
        previous = self.sessions.lookup(command.client_id, command.seq)
        if previous is not None:
            return previous
        result = self._execute(command.op)
        self.sessions.record(command.client_id, command.seq, result)
        return result

    def _execute(self, op_bytes: bytes) -> bytes:
        try:
            op = msgpack.unpackb(op_bytes)
        except Exception:
            return msgpack.packb(["error", "op is not msgpack"])
        if not isinstance(op, list) or not op or not all(isinstance(x, str) for x in op[:2]):
            return msgpack.packb(["error", "op must be [name, key, ...]"])
        match op:
            case ["put", str(key), str(value)]:
                self.data[key] = value
                return msgpack.packb(["ok"])
            case ["get", str(key)]:
                return msgpack.packb(["value", self.data.get(key)])
            case ["cas", str(key), (str() | None) as expected, str(new)]:
                current = self.data.get(key)
                if current == expected:
                    self.data[key] = new
                    return msgpack.packb(["cas", True, current])
                return msgpack.packb(["cas", False, current])
            case ["delete", str(key)]:
                existed = self.data.pop(key, None) is not None
                return msgpack.packb(["deleted", existed])
        return msgpack.packb(["error", f"unknown or malformed op {op[0]!r}"])

    def snapshot(self) -> bytes:
        return msgpack.packb(
            [self.applied_position, sorted(self.data.items()), self.sessions.to_state()]
        )

    def restore(self, data: bytes) -> None:
        applied_position, items, sessions = msgpack.unpackb(data)
        self.applied_position = applied_position
        self.data = dict(items)
        self.sessions.load_state(sessions)
