"""The replicated session table (``consensus.sessions``): exactly once, bounded, deterministic.

The rules one by one on the key-value store, then a property: whatever copies of requests
reach the log, in whatever order, between log-time commands and restores from snapshots, no
request runs twice, and a request answered ``SESSION_EXPIRED`` never runs. The broken variant
(``sessions_forget_evicted``) fails the same property on a short script."""

from __future__ import annotations

import itertools

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.auth import ADMIN, SCHEDULER, AuthorizingMachine, Principal, seal
from consensus.messages import Command
from consensus.sessions import (
    EXPIRED,
    FORGET_EVICTED,
    LAST,
    SESSION_EXPIRED,
    SessionLimits,
    SessionNumbers,
    SessionTable,
    log_time_command,
    one_shot_seq,
    open_by_of,
    session_seq,
)
from consensus.statemachine import CANCEL_OP, KVStore, kv_put

T0 = 1_000_000  # a log time (Unix seconds) to start from
LIMITS = SessionLimits(max_sessions=3, max_per_principal=2, idle_ttl_s=100, time_step_s=10,
                       max_step_s=1_000)


class Counting(KVStore):
    """The key-value store, counting how often each request really ran."""

    def __init__(self, unsafe: frozenset[str] = frozenset()) -> None:
        super().__init__(SessionTable(LIMITS, unsafe=unsafe))
        self.ran: dict[tuple[int, int], int] = {}
        self._current: tuple[int, int] = (0, 0)

    def apply(self, position: int, command: Command) -> bytes:
        self._current = (command.client_id, command.seq)
        return super().apply(position, command)

    def _execute(self, op_bytes: bytes) -> bytes:
        self.ran[self._current] = self.ran.get(self._current, 0) + 1
        return super()._execute(op_bytes)


class Log:
    """A store and the next log position."""

    def __init__(self, store: KVStore | None = None) -> None:
        self.store = store if store is not None else Counting()
        self.position = 0

    def put(self, client: int, seq: int, value: str = "v") -> bytes:
        return self.apply(Command(client_id=client, seq=seq, op=kv_put("k", value), keys=("k",)))

    def time(self, seconds: int) -> bytes:
        return self.apply(log_time_command(seconds))

    def apply(self, command: Command) -> bytes:
        self.position += 1
        return self.store.apply(self.position, command)


def seq(open_by: int, counter: int, *, last: bool = False) -> int:
    return session_seq(open_by, counter, last=last)


def test_a_sequence_number_carries_the_open_by_time_and_the_last_flag() -> None:
    number = seq(T0 + 60, 5, last=True)
    assert open_by_of(number) == T0 + 60 and number & LAST and number & 0xFFFF == 5
    assert open_by_of(7) == 0  # a small number: a pinned session
    with pytest.raises(ValueError):
        session_seq(T0, LAST)  # past the counter
    assert open_by_of(one_shot_seq()) > 0 and one_shot_seq() & LAST


def test_a_retry_answers_the_first_result_and_runs_once() -> None:
    log = Log()
    log.time(T0)
    first = log.put(1, seq(T0 + 60, 0), "a")
    assert log.put(1, seq(T0 + 60, 0), "b") == first  # a copy: the first result
    assert log.store.data["k"] == "a" and log.store.ran == {(1, seq(T0 + 60, 0)): 1}


def test_a_session_opens_only_before_its_open_by_time() -> None:
    log = Log()
    log.time(T0)
    assert log.put(1, seq(T0, 0)) is SESSION_EXPIRED  # the log time reached it already
    assert log.put(1, seq(T0 + 1, 0)) != SESSION_EXPIRED
    assert log.store.ran == {(1, seq(T0 + 1, 0)): 1}


def test_an_idle_session_is_evicted_and_a_late_copy_of_its_request_does_not_run() -> None:
    log = Log()
    log.time(T0)
    open_by = T0 + 500  # far ahead: a tombstone keeps the session from opening again
    log.put(1, seq(open_by, 0))
    log.time(T0 + 99)
    assert len(log.store.sessions) == 1  # idle 99 s: kept
    log.time(T0 + 100)
    assert len(log.store.sessions) == 0
    assert log.store.sessions.counts()["tombstones"] == 1
    assert log.put(1, seq(open_by, 0)) is SESSION_EXPIRED  # the late copy
    assert log.put(1, seq(open_by, 1)) is SESSION_EXPIRED  # and anything new in it
    log.time(T0 + 600)  # past its open-by time: the tombstone goes, the open-by rule stays
    assert log.store.sessions.counts()["tombstones"] == 0
    assert log.put(1, seq(open_by, 0)) is SESSION_EXPIRED
    assert log.store.ran == {(1, seq(open_by, 0)): 1}
    # the same client id in a new session runs
    assert log.put(1, seq(T0 + 700, 0)) not in (SESSION_EXPIRED, EXPIRED)


def test_a_one_shot_session_leaves_nothing_once_its_open_by_time_passed() -> None:
    log = Log()
    log.time(T0)
    one_shot = seq(T0 + 60, 0, last=True)
    first = log.put(7, one_shot)
    assert log.put(7, one_shot) == first  # a retry of it still gets its answer
    assert log.put(7, seq(T0 + 60, 1)) is SESSION_EXPIRED  # closed: nothing after it
    assert log.store.sessions.counts() == {"open": 0, "closed": 1, "pinned": 0, "tombstones": 0}
    log.time(T0 + 60)
    assert len(log.store.sessions) == 0 and log.store.sessions.counts()["tombstones"] == 0
    assert log.put(7, one_shot) is SESSION_EXPIRED  # a copy long after: refused, not run
    assert log.store.ran == {(7, one_shot): 1}


def test_the_caps_evict_the_least_recently_used_at_the_next_log_time_command() -> None:
    log = Log()
    log.time(T0)
    open_by = T0 + 500
    for client in (1, 2, 3):
        log.put(client, seq(open_by, 0))
    log.time(T0 + 1)
    log.put(1, seq(open_by, 1))  # 1 used again: 2 is now the least recently used
    log.put(4, seq(open_by, 0))  # a fourth, over the cap of three
    assert len(log.store.sessions) == 4 and log.store.sessions.time_due(0)  # due at once
    log.time(T0 + 1)  # the log time needs not move
    assert len(log.store.sessions) == 3
    assert log.put(2, seq(open_by, 0)) is SESSION_EXPIRED  # 2 went
    assert log.put(3, seq(open_by, 0)) not in (SESSION_EXPIRED, None)  # 3 is there


def test_eviction_among_sessions_of_one_log_time_goes_by_key_whatever_the_order() -> None:
    # A partial-order core runs independent commands of one interval in different orders on
    # different replicas: the same sessions are evicted on each.
    snapshots = []
    for order in ((5, 3, 9, 1), (1, 9, 3, 5)):
        log = Log()
        log.time(T0)
        for client in order:
            log.put(client, seq(T0 + 500, 0))
        log.time(T0 + 1)
        snapshots.append(log.store.snapshot())
        assert log.put(1, seq(T0 + 500, 0)) is SESSION_EXPIRED  # the smallest key went
    assert snapshots[0] == snapshots[1]


class Permissive(KVStore):
    """The key-value store, letting every principal write (``consensus.auth.Authorizer``)."""

    def authorize(self, principal: Principal, op: bytes, *, read: bool) -> str | None:
        return None


def test_a_principal_over_its_cap_loses_its_own_sessions_first() -> None:
    inner = Permissive(SessionTable(LIMITS))
    machine = AuthorizingMachine(inner)
    alice, bob = Principal("alice", SCHEDULER, ("vc",)), Principal("bob", ADMIN)
    position = 0

    def put(principal: Principal, client: int) -> bytes | object:
        nonlocal position
        position += 1
        op = kv_put("k", "v")
        if principal.role != ADMIN:  # as the node seals it
            op = seal(principal, op)
        return machine.run(position, Command(client_id=client, seq=seq(T0 + 500, 0), op=op))

    machine.apply(0, log_time_command(T0))
    put(bob, 1)
    for client in (2, 3, 4):
        put(alice, client)
    machine.apply(100, log_time_command(T0 + 1))
    assert inner.sessions.counts()["open"] == 3  # alice's oldest went, bob's stayed
    assert put(bob, 1) != SESSION_EXPIRED
    assert put(alice, 2) is SESSION_EXPIRED


def test_pinned_sessions_keep_the_old_rules_and_are_never_evicted() -> None:
    log = Log()
    log.put(1, 0)
    log.time(T0)
    log.time(T0 + 10_000)
    assert log.put(1, 0) == msgpack.packb(["ok"]) and log.store.ran == {(1, 0): 1}
    assert log.store.sessions.counts()["pinned"] == 1 and not log.store.sessions.time_due(
        T0 + 10**6)  # nothing of it is ever due


def test_the_log_time_moves_only_forward_and_by_bounded_steps() -> None:
    table = SessionTable(LIMITS)
    log = Log(KVStore(table))
    assert table.now == 0
    log.time(T0)  # the first sets it
    log.time(T0 - 50)
    assert table.now == T0
    log.time(T0 + 10**9)  # a clock far ahead moves it by max_step_s
    assert table.now == T0 + LIMITS.max_step_s
    log.apply(Command(client_id=0, seq=0, op=log_time_command(T0).op[:-1]))  # malformed
    assert table.now == T0 + LIMITS.max_step_s


def test_sessions_opened_before_the_first_log_time_count_as_active_then() -> None:
    log = Log()
    log.put(1, seq(T0 + 500, 0))
    log.time(T0)
    assert len(log.store.sessions) == 1  # not idle since 1970


def test_a_log_time_command_is_due_only_when_it_would_do_something() -> None:
    table = SessionTable(LIMITS)
    log = Log(KVStore(table))
    assert not table.time_due(T0)  # empty: never
    log.time(T0)
    log.put(1, seq(T0 + 500, 0))
    assert not table.time_due(T0 + 9) and table.time_due(T0 + 10)  # active: every step
    log.time(T0 + 10)
    assert not table.time_due(T0 + 50)  # idle: only once its eviction is due
    assert table.time_due(T0 + 110)


def test_a_snapshot_restores_the_same_table_and_an_earlier_builds_loads_as_pinned() -> None:
    log = Log()
    log.time(T0)
    log.put(1, seq(T0 + 500, 0))
    log.put(2, seq(T0 + 60, 0, last=True))
    log.put(3, 4)
    for client in (4, 5, 6):
        log.put(client, seq(T0 + 500, 0))
    log.time(T0 + 1)  # a tombstone
    data = log.store.snapshot()
    restored = Log(Counting())
    restored.store.restore(data)
    assert restored.store.snapshot() == data
    for copy in (log, restored):
        copy.position = 50
        copy.time(T0 + 200)
    assert restored.store.snapshot() == log.store.snapshot()
    old = msgpack.packb([7, [["k", "v"]], [[3, -1, [[4, msgpack.packb(["ok"])]]]]])
    store = KVStore()
    store.restore(old)  # an earlier build's snapshot: its sessions are pinned
    assert store.sessions.counts()["pinned"] == 1
    assert store.apply(8, Command(client_id=3, seq=4, op=kv_put("k", "x"))) == msgpack.packb(
        ["ok"]) and store.data["k"] == "v"
    with pytest.raises(ValueError, match="session table format 9"):
        store.sessions.load_state([9, 0, [], [], []])


def test_a_client_renews_its_session_from_the_log_time_it_is_told() -> None:
    numbers = SessionNumbers(window_s=60)
    first = numbers.open_by
    assert open_by_of(numbers.next()) == first and numbers.next() & 0xFFFF == 1
    numbers.renew(log_time=first + 10**6)  # this machine's clock is far behind the cluster's
    assert numbers.open_by == first + 10**6 + 60
    assert numbers.next() == seq(numbers.open_by, 0)


# ---------------------------------------------------------------- the property

#: a script step: ("req", client, session, counter) a new request or a copy of one sent
#: before (the same triple again), ("time", seconds forward), ("restore",) a replica
#: restarted from a snapshot of this point
Step = tuple[str, int, int, int]

steps = st.lists(st.one_of(
    st.tuples(st.just("req"), st.integers(1, 4), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("time"), st.just(0), st.just(0), st.integers(0, 150)),
    st.tuples(st.just("restore"), st.just(0), st.just(0), st.just(0)),
), max_size=80)


def play(script: list[Step], unsafe: frozenset[str] = frozenset()) -> None:
    """Run ``script``; fail if a request runs twice, or runs after it was answered
    ``SESSION_EXPIRED``, or if a store restarted from a snapshot goes on otherwise than one
    that never stopped (a replica that restarted and one that did not must keep applying the
    log alike: same answers, same state)."""
    log = Log(Counting(unsafe))
    twin = Log(Counting(unsafe))  # never restarts
    twin.time(T0)
    earlier: dict[tuple[int, int], int] = {}  # runs counted by the stores before a restore
    refused: dict[tuple[int, int], int] = {}  # request -> its runs when it was refused
    now = T0
    log.time(now)

    def runs(request: tuple[int, int]) -> int:
        return earlier.get(request, 0) + log.store.ran.get(request, 0)

    for kind, client, session, counter in script:
        if kind == "req":
            number = seq(T0 + 50 + 100 * session, counter, last=counter == 3)
            request = (client, number)
            answer = log.put(client, number, f"{client}.{session}.{counter}")
            assert answer == twin.put(client, number, f"{client}.{session}.{counter}")
            if answer is SESSION_EXPIRED:
                refused.setdefault(request, runs(request))
        elif kind == "time":
            now += counter
            assert log.time(now) == twin.time(now)
        else:  # a replica restarted from a snapshot of this point goes on instead
            for request, count in log.store.ran.items():
                earlier[request] = earlier.get(request, 0) + count
            store = Counting(unsafe)
            store.restore(log.store.snapshot())
            position = log.position
            log = Log(store)
            log.position = position
        assert log.store.snapshot() == twin.store.snapshot(), "the restarted store went astray"
        twice = {r: runs(r) for r in {*earlier, *log.store.ran} if runs(r) > 1}
        assert not twice, f"ran twice: {twice}"
        late = {r for r, count in refused.items() if runs(r) > count}
        assert not late, f"ran after SESSION_EXPIRED: {late}"


@settings(max_examples=400, deadline=None)
@given(steps)
def test_no_request_runs_twice_whatever_reaches_the_log(script: list[Step]) -> None:
    play(script)


def test_the_property_catches_a_table_that_forgets_evicted_sessions() -> None:
    # client 1's request runs; over the cap its session goes; a late copy runs again
    script: list[Step] = [("req", 1, 0, 0), ("req", 2, 0, 0), ("req", 3, 0, 0),
                          ("req", 4, 0, 0), ("time", 0, 0, 1), ("req", 1, 0, 0)]
    play(script)  # the table refuses the copy
    with pytest.raises(AssertionError, match="ran twice"):
        play(script, frozenset({FORGET_EVICTED}))


def test_a_table_restored_over_its_cap_evicts_at_the_next_log_time_as_it_would_have() -> None:
    # Four sessions against a cap of three: the excess waits for the next log-time command.
    # A store restored from a snapshot of that point must evict the same session then: a
    # restore that weighed the restored table against the default caps (the key-value store's
    # ``prepare_restore`` did, from 32839c5 on) let the restarted replica keep it, and answer
    # its next request where the others refused it (``sdpaxos sim --sessions
    # --snapshot-every 10 --network lan`` seed 7011 at three replicas: a write applied at one
    # replica only).
    script: list[Step] = [("req", 1, 0, 0), ("req", 2, 0, 0), ("req", 3, 0, 0),
                          ("req", 4, 0, 0), ("restore", 0, 0, 0), ("time", 0, 0, 1),
                          ("req", 1, 0, 1)]
    play(script)
    log = Log()
    log.time(T0)
    for client in (1, 2, 3, 4):
        log.put(client, seq(T0 + 50, 0))
    restored = KVStore(SessionTable(LIMITS))
    restored.restore(log.store.snapshot())
    assert restored.apply(log.position + 1, log_time_command(T0 + 1)) == log.time(T0 + 1)
    assert restored.sessions.counts() == log.store.sessions.counts() == {
        "open": 3, "closed": 0, "pinned": 0, "tombstones": 1}
    assert restored.snapshot() == log.store.snapshot()


def test_taking_a_loaded_table_keeps_this_tables_settings() -> None:
    # (a snapshot installed off the loop is loaded into a fresh table, then taken over: the
    # store's limits and variant must stay the store's, or its evictions would differ)
    table = SessionTable(LIMITS, unsafe=frozenset({FORGET_EVICTED}))
    loaded = SessionTable()
    loaded.load_state(SessionTable(LIMITS).to_state())
    table.take(loaded)
    assert table.limits == LIMITS and table._forget


batch_steps = st.lists(st.one_of(
    st.tuples(st.just("req"), st.integers(0, 4), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("cancel"), st.integers(1, 4), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("pinned"), st.integers(1, 4), st.just(0), st.integers(0, 3)),
    st.tuples(st.just("time"), st.just(0), st.just(0), st.integers(0, 150)),
    st.tuples(st.just("cut"), st.just(0), st.just(0), st.just(0)),
), max_size=80)


@settings(max_examples=300, deadline=None)
@given(batch_steps)
def test_run_gives_what_admit_and_record_give_one_by_one(script: list[Step]) -> None:
    # ``SessionTable.run`` (a batch, its open sessions' requests inline) against ``apply``
    # command by command: the same answers and the same table, however the log is cut
    commands = [log_time_command(T0)]
    cuts = [0]
    now = T0
    for kind, client, session, counter in script:
        if kind == "time":
            now += counter
            commands.append(log_time_command(now))
        elif kind == "cut":
            cuts.append(len(commands))
        else:
            number = (counter if kind == "pinned"
                      else seq(T0 + 50 + 100 * session, counter, last=counter == 3))
            op = CANCEL_OP if kind == "cancel" else kv_put("k", f"{client}.{number}")
            commands.append(Command(client_id=client, seq=number, op=op, keys=("k",)))
    cuts.append(len(commands))
    one_by_one = KVStore(SessionTable(LIMITS))
    batched = KVStore(SessionTable(LIMITS))
    expected = [one_by_one.apply(k, command) for k, command in enumerate(commands)]
    results = [result for start, stop in itertools.pairwise(cuts)
               for result in batched.apply_batch(start, commands[start:stop])]
    assert results == expected
    assert batched.snapshot() == one_by_one.snapshot()
