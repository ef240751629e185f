"""Tests of applying commands batch by batch (``consensus.statemachine.batch_applier``,
``KVStore.apply_batch``): the same results, state and snapshot as applying them one by one."""

from __future__ import annotations

import random

from consensus.messages import Command
from consensus.statemachine import (
    EXPIRED,
    SESSION_WINDOW,
    KVStore,
    batch_applier,
    kv_cas,
    kv_delete,
    kv_get,
    kv_put,
)


def mixed_commands(seed: int, count: int) -> list[Command]:
    """Puts, gets, compare-and-sets, deletes and garbage over a few keys, from a few clients,
    with retries (a repeated (client, seq) returns its first result)."""
    rng = random.Random(seed)
    keys = ["a", "b", "c"]
    seqs = {client: 0 for client in (1, 2, 3)}
    commands: list[Command] = []
    for _ in range(count):
        client = rng.choice((1, 2, 3))
        if commands and rng.random() < 0.15:  # a retry of an earlier command
            commands.append(rng.choice(commands))
            continue
        key = rng.choice(keys)
        op = rng.choice((
            kv_put(key, str(rng.randrange(5))),
            kv_get(key),
            kv_cas(key, rng.choice((None, "1", "2")), "x"),
            kv_delete(key),
            b"\xc1 not msgpack",
        ))
        seqs[client] += 1
        commands.append(Command(client_id=client, seq=seqs[client], op=op, keys=(key,)))
    return commands


def test_apply_batch_gives_what_apply_gives_one_by_one() -> None:
    # over SESSION_WINDOW commands per client: sessions forget, old retries come back EXPIRED
    commands = mixed_commands(seed=5, count=1500)
    one_by_one, batched = KVStore(), KVStore()
    expected = [one_by_one.apply(1000 + k, command) for k, command in enumerate(commands)]
    assert EXPIRED in expected
    results: list[bytes] = []
    start = 0
    for size in (1, 7, 0, 92, 300, 1100):  # runs of several lengths, an empty one included
        results += batched.apply_batch(1000 + start, commands[start : start + size])
        start += size
    assert start == len(commands)
    assert results == expected
    assert batched.snapshot() == one_by_one.snapshot()
    assert batched.applied_position == one_by_one.applied_position == 2499


class OneByOne:
    """A state machine with ``apply`` only: the applier loops over it."""

    def __init__(self) -> None:
        self.store = KVStore()
        self.positions: list[int] = []

    def apply(self, position: int, command: Command) -> bytes:
        self.positions.append(position)
        return self.store.apply(position, command)

    def query(self, op: bytes) -> bytes:
        return self.store.query(op)

    def snapshot(self) -> bytes:
        return self.store.snapshot()

    def restore(self, data: bytes) -> None:
        self.store.restore(data)


def test_a_machine_without_apply_batch_is_applied_in_a_loop() -> None:
    commands = mixed_commands(seed=9, count=50)
    machine = OneByOne()
    results = batch_applier(machine)(70, commands)
    reference = KVStore()
    assert results == [reference.apply(70 + k, command) for k, command in enumerate(commands)]
    assert machine.positions == list(range(70, 120))
    store = KVStore()
    assert batch_applier(store) == store.apply_batch  # its own, when it has one


def test_sessions_forget_the_oldest_result_first_also_after_a_restore() -> None:
    """Eviction order is execution order, as a plain dict's keys give it, and a restored table
    goes on from where its snapshot stood."""
    commands = mixed_commands(seed=11, count=2000)
    first, second = commands[:1200], commands[1200:]
    reference: dict[int, dict[int, bytes]] = {}  # client -> results, oldest first
    floors: dict[int, int] = {}
    store = KVStore()
    for position, command in enumerate(first):
        result = store.apply(position, command)
        results = reference.setdefault(command.client_id, {})
        if command.seq not in results and command.seq > floors.get(command.client_id, -1):
            results[command.seq] = result
            if len(results) > SESSION_WINDOW:
                oldest = next(iter(results))
                del results[oldest]
                floors[command.client_id] = max(floors.get(command.client_id, -1), oldest)
    pinned = store.sessions.to_state()[2]  # sessions without an open-by time
    assert pinned == [[c, floors.get(c, -1), list(reference[c].items())] for c in sorted(reference)]
    restored = KVStore()
    restored.restore(store.snapshot())
    assert restored.apply_batch(1200, second) == store.apply_batch(1200, second)
    assert restored.snapshot() == store.snapshot()
