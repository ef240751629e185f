"""``kv_state.requests_state``, the port fuzz tests' "nothing changed": it must ignore what a
log-time command moves and see what a client's request changes."""

from __future__ import annotations

from consensus.messages import Command
from consensus.sessions import SessionTable, log_time_command, session_seq
from consensus.statemachine import KVStore, kv_put
from tests.runtime.kv_state import requests_state

T0 = 1_000_000  # a log time (Unix seconds)


def put(store: KVStore, position: int, counter: int, value: str) -> bytes:
    number = session_seq(T0 + 600, counter)
    return store.apply(position, Command(client_id=7, seq=number, op=kv_put("k", value),
                                         keys=("k",)))


def test_log_time_commands_change_the_snapshot_but_not_what_requests_made() -> None:
    store = KVStore(SessionTable())
    put(store, 1, 1, "a")
    put(store, 2, 2, "b")
    before, snapshot = requests_state(store), store.snapshot()
    # The first log-time command stamps the open session's last-active time (0 until then),
    # a later one moves the log time: the snapshot changes, the requests' state does not.
    store.apply(3, log_time_command(T0))
    store.apply(4, log_time_command(T0 + 10))
    assert store.snapshot() != snapshot
    assert requests_state(store) == before
    put(store, 5, 3, "c")
    assert requests_state(store) != before
