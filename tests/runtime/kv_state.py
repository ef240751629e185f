"""What clients' requests made of a replica's key-value store, apart from the log time.

A replica proposes a log-time command every ``SessionLimits.time_step_s`` while a session is
active (``consensus.sessions``): applied during a test, it moves the store's applied position
and the session table's log time, and nothing a client sent. A test that asserts "nothing
changed" compares this instead of the whole snapshot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from consensus.runtime.node import ReplicaNode
from consensus.statemachine import StateMachine
from tests.runtime.polling import wait_until


def requests_state(machine: StateMachine) -> tuple[Any, ...]:
    """The store's items and its session table (sessions, their results, tombstones), without
    the applied position and the log time."""
    _applied_position, items, sessions = msgpack.unpackb(machine.snapshot())
    _format, _log_time, *tables = sessions
    return items, tables


async def applied_alike(nodes: Sequence[ReplicaNode]) -> list[tuple[Any, ...]]:
    """Wait until every replica's store holds the same requests (what one replica answered,
    the others may still be applying), and return them."""
    await wait_until(lambda: len({repr(requests_state(n.state_machine)) for n in nodes}) == 1,
                     "every replica applied the same requests")
    return [requests_state(node.state_machine) for node in nodes]
