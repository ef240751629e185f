"""What clients' requests made of a replica's key-value store, apart from the log time.

A replica proposes a log-time command every ``SessionLimits.time_step_s`` while a session is
active (``consensus.sessions``): applied during a test, it moves the store's applied position,
the session table's log time and its sessions' last-active times (the first one stamps every
session open so far), and nothing a client sent. A test that asserts "nothing
changed" compares this instead of the whole snapshot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from consensus.runtime.node import ReplicaNode
from consensus.statemachine import StateMachine
from tests.runtime.polling import wait_until


def requests_state(machine: StateMachine) -> tuple[Any, ...]:
    """The store's items and its session table (pinned sessions, sessions with their results,
    tombstones), without the applied position, the log time and when each session was last
    active (a log time, which also orders the sessions: here they go by client and open-by)."""
    _applied_position, items, sessions = msgpack.unpackb(machine.snapshot())
    _format, _log_time, pinned, timed, tombstones = sessions
    by_request = sorted([client, open_by, floor, results, principal, closed]
                        for client, open_by, floor, results, _last_active, principal, closed
                        in timed)
    return items, [pinned, by_request, tombstones]


async def applied_alike(nodes: Sequence[ReplicaNode]) -> list[tuple[Any, ...]]:
    """Wait until every replica's store holds the same requests (what one replica answered,
    the others may still be applying), and return them."""
    await wait_until(lambda: len({repr(requests_state(n.state_machine)) for n in nodes}) == 1,
                     "every replica applied the same requests")
    return [requests_state(node.state_machine) for node in nodes]
