"""The store's work done off a replica's event loop (issue 38 point 4): a snapshot's state built
in another thread while the store keeps applying, then adopted whole (the same objects its
users hold); the digest query answered from what was read at the query, whatever applies
before the worker hashes it, at the store, behind the principals' check and through a
replica."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from test_client import gang, start

from cluster_state import ops
from cluster_state.authz import AuthorizedStore
from cluster_state.client import AllocationStore
from cluster_state.config import synthetic_config
from cluster_state.errors import SnapshotError
from cluster_state.store import ClusterStore
from consensus.auth import ADMIN, READER, SCHEDULER, AuthorizingMachine, Denied, Principal, seal
from consensus.messages import Command
from consensus.runtime.turns import TurnLoop
from tests.runtime.polling import wait_until

GPU: dict[str, Any] = dict(nodes=32, vcs=2, pinned=1)
#: how long a held worker waits for the test (a failing test must not hang)
HOLD_S = 10.0


def filled(groups: int, first: int = 0) -> ClusterStore:
    store = ClusterStore(synthetic_config(**GPU))
    apply(store, groups, first)
    return store


def apply(store: ClusterStore, groups: int, first: int) -> None:
    for i in range(first, first + groups):
        op = ops.submit(f"g{i}", f"vc0{i % 2}", 10, [(1, 1 + i % 4)])
        store.apply(i, Command(client_id=7, seq=i, op=op))


def test_a_state_built_beside_the_store_is_adopted_whole() -> None:
    source = filled(20)
    data = source.snapshot()
    store, twin = filled(5), filled(5)  # the twin applies what the store does, no restore
    sessions, events = store.sessions, store.events
    built: list[Any] = []
    worker = threading.Thread(target=lambda: built.append(store.prepare_restore(data)))
    worker.start()
    for i in range(100, 160):  # applied while the worker builds, to the live state only
        for target in (store, twin):
            apply(target, 1, i)
    worker.join(HOLD_S)
    assert store.snapshot() == twin.snapshot()  # the build changed nothing of the store
    built.pop()()
    assert store.snapshot() == data
    assert store.sessions is sessions and store.events is events  # what its users hold


def test_a_snapshot_that_does_not_load_is_refused_before_anything_changes() -> None:
    store = filled(5)
    before = store.snapshot()
    for bad in (b"", msgpack.packb([3, b"x"]), filled(3).snapshot()[:-40]):
        with pytest.raises(SnapshotError):
            store.prepare_restore(bad)
        assert store.snapshot() == before


def digest_of(store: ClusterStore) -> dict[str, Any]:
    kind, revision, info = msgpack.unpackb(store.query(ops.get_digest()))
    assert kind == "digest" and info["revision"] == revision
    return dict(info)


def test_the_digest_is_the_state_of_its_query_whatever_applies_before_it_is_made() -> None:
    store = filled(10)
    expected = digest_of(store)
    assert expected["sha256"] == hashlib.sha256(store.snapshot()).hexdigest()
    later = store.defer_query(ops.get_digest())
    assert later is not None
    apply(store, 10, 50)
    assert msgpack.unpackb(later()) == ["digest", expected["revision"], expected]
    assert digest_of(store) != expected
    assert store.defer_query(ops.get_summary()) is None  # answered at once


def test_a_deferred_read_is_judged_at_once_and_answered_as_a_read_now_is() -> None:
    store = AuthorizedStore(synthetic_config(**GPU))
    machine = AuthorizingMachine(store)
    reader, scheduler = Principal("ro", READER), Principal("s", SCHEDULER, ("vc00",))
    for who in (reader, Principal("root", ADMIN)):
        op = seal(who, ops.get_digest())
        later = machine.ask_later(op)
        assert callable(later)
        assert machine.filtered(op, later()) == machine.ask(op)
    refused = machine.ask_later(seal(scheduler, ops.get_digest()))
    assert isinstance(refused, Denied) and refused.reason.startswith("permission denied")
    assert machine.ask_later(seal(reader, ops.get_summary())) is None


async def test_a_replica_answers_the_digest_of_its_read_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    deferred: list[bytes] = []
    defer = ClusterStore.defer_query

    def counted(store: ClusterStore, op: bytes) -> Callable[[], bytes] | None:
        later = defer(store, op)
        if later is not None:
            deferred.append(op)
        return later

    monkeypatch.setattr(ClusterStore, "defer_query", counted)
    # (no log-time commands: one between the two digests would move the revision on)
    monkeypatch.setattr(TurnLoop, "_propose_log_time", lambda turns, now: None)
    nodes = await start(tmp_path)
    released = threading.Event()
    try:
        client = AllocationStore.embedded(nodes[0])
        await client.submit(gang("a", "vc00"))
        expected = await client.digest()
        nodes[0].snapshots.writer.submit(lambda: released.wait(HOLD_S))  # the worker busy
        asking = asyncio.ensure_future(client.digest())
        await wait_until(lambda: len(deferred) == 2, "the read was not ordered")
        await client.submit(gang("b", "vc01"))  # served meanwhile, after the read
        assert not asking.done()
        released.set()
        assert await asking == expected
        assert (await client.digest())["revision"] > expected["revision"]
    finally:
        released.set()
        for node in nodes:
            await node.stop()
