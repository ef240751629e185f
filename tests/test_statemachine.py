import msgpack
import pytest
from protocol.util import cmd

from consensus.messages import Command
from consensus.statemachine import (
    CANCEL_OP,
    CANCELLED,
    EXPIRED,
    SESSION_MARK,
    SESSION_WINDOW,
    KVStore,
    kv_cas,
    kv_delete,
    kv_get,
    kv_put,
)

_OK = msgpack.packb(["ok"])


def result(store: KVStore, position: int, command: Command) -> list[object]:
    decoded: list[object] = msgpack.unpackb(store.apply(position, command))
    return decoded


def test_put_get_cas_delete() -> None:
    kv = KVStore()
    assert result(kv, 0, cmd(1, 0, op=kv_get("x"))) == ["value", None]
    assert result(kv, 1, cmd(1, 1, op=kv_put("x", "a"))) == ["ok"]
    assert result(kv, 2, cmd(1, 2, op=kv_cas("x", "b", "c"))) == ["cas", False, "a"]
    assert result(kv, 3, cmd(1, 3, op=kv_cas("x", "a", "c"))) == ["cas", True, "a"]
    assert result(kv, 4, cmd(1, 4, op=kv_get("x"))) == ["value", "c"]
    assert result(kv, 5, cmd(1, 5, op=kv_cas("y", None, "n"))) == ["cas", True, None]
    assert result(kv, 6, cmd(1, 6, op=kv_delete("x"))) == ["deleted", True]
    assert result(kv, 7, cmd(1, 7, op=kv_delete("x"))) == ["deleted", False]
    assert kv.data == {"y": "n"}


def test_retry_executes_once_and_returns_first_result() -> None:
    kv = KVStore()
    first = result(kv, 0, cmd(9, 0, op=kv_cas("k", None, "v1")))
    kv.apply(1, cmd(8, 0, op=kv_put("k", "other")))
    # the same (client, seq) again, e.g. proposed again at another replica after a timeout
    again = result(kv, 2, cmd(9, 0, op=kv_cas("k", None, "v1")))
    assert first == again == ["cas", True, None]
    assert kv.data["k"] == "other"


def test_requests_older_than_the_window_are_not_reapplied() -> None:
    kv = KVStore()
    for seq in range(SESSION_WINDOW + 5):
        kv.apply(seq, cmd(3, seq, op=kv_put("k", str(seq))))
    assert kv.apply(10_000, cmd(3, 0, op=kv_put("k", "stale"))) == EXPIRED
    assert kv.data["k"] == str(SESSION_WINDOW + 4)


@pytest.mark.parametrize(
    "op",
    [b"\xc1", msgpack.packb("put"), msgpack.packb(["put", 1, "v"]), msgpack.packb(["nope", "k"]),
     msgpack.packb(["cas", "k", 5, "v"]), msgpack.packb(["put", "k"])],
)
def test_malformed_ops_return_errors_and_change_nothing(op: bytes) -> None:
    kv = KVStore()
    kv.apply(0, cmd(1, 0, op=kv_put("k", "v")))
    before = kv.data.copy()
    out = result(kv, 1, cmd(2, 0, op=op))
    assert out[0] == "error"
    assert kv.data == before


def test_snapshot_restore_is_byte_identical() -> None:
    a, b = KVStore(), KVStore()
    ops = [kv_put(f"k{i % 7}", str(i)) for i in range(600)]
    for position, op in enumerate(ops):
        a.apply(position, cmd(position % 5, position, op=op))
        b.apply(position, cmd(position % 5, position, op=op))
    assert a.snapshot() == b.snapshot()
    c = KVStore()
    c.restore(a.snapshot())
    assert c.snapshot() == a.snapshot()
    # the restored session table still deduplicates
    retry = cmd(4, 599, op=kv_put("k0", "x"))
    assert c.apply(700, retry) == a.apply(700, retry)
    assert c.data == a.data


def test_snapshot_lists_the_pairs_in_key_order_whatever_the_insertion_order() -> None:
    # the snapshot's bytes are a format: the pairs sorted as pairs, keys unique, whatever
    # order the puts came in and whatever was deleted
    keys = [f"k{(i * 7919) % 1000:04d}" for i in range(1000)]  # every key once, shuffled
    kv = KVStore()
    for position, key in enumerate(keys):
        kv.apply(position, cmd(1, position, op=kv_put(key, key[::-1])))
    kv.apply(1000, cmd(1, 1000, op=kv_delete("k0500")))
    kv.apply(1001, cmd(1, 1001, op=kv_put("a", "")))
    position, pairs, _sessions = msgpack.unpackb(kv.snapshot())
    assert pairs == sorted([key, value] for key, value in kv.data.items())
    assert [key for key, _ in pairs][:3] == ["a", "k0000", "k0001"]
    assert "k0500" not in [key for key, _ in pairs]
    assert kv.snapshot() == msgpack.packb(
        [position, sorted(kv.data.items()), kv.sessions.to_state()])


def test_query_reads_without_changing_state() -> None:
    kv = KVStore()
    kv.apply(0, cmd(1, 0, op=kv_put("k", "v")))
    before = kv.snapshot()
    assert msgpack.unpackb(kv.query(kv_get("k"))) == ["value", "v"]
    assert msgpack.unpackb(kv.query(kv_get("missing"))) == ["value", None]
    assert msgpack.unpackb(kv.query(kv_put("k", "x")))[0] == "error"
    assert kv.snapshot() == before


# ---------------------------------------------------------------------------- settling (#39)


def test_a_cancel_before_any_copy_ran_settles_it_as_never_applied() -> None:
    kv = KVStore()
    assert kv.apply(0, cmd(9, 4, op=CANCEL_OP)) == CANCELLED
    # a copy of the request ordered after the cancel (a retry proposed elsewhere, or the
    # first attempt's instance chosen late) is answered CANCELLED and changes nothing
    assert kv.apply(1, cmd(9, 4, op=kv_put("k", "v"))) == CANCELLED
    assert kv.apply_batch(2, [cmd(9, 4, op=kv_put("k", "v"))]) == [CANCELLED]
    assert kv.data == {}


def test_a_cancel_after_a_copy_ran_answers_its_first_result() -> None:
    kv = KVStore()
    first = kv.apply(0, cmd(9, 4, op=kv_cas("k", None, "v")))
    assert kv.apply(1, cmd(9, 4, op=CANCEL_OP)) == first
    assert kv.apply_batch(2, [cmd(9, 4, op=CANCEL_OP)]) == [first]
    assert kv.data == {"k": "v"}


def test_the_batch_path_settles_like_apply_one_by_one() -> None:
    commands = [cmd(9, 0, op=CANCEL_OP), cmd(9, 0, op=kv_put("a", "1")),
                cmd(9, 1, op=kv_put("b", "2")), cmd(9, 1, op=CANCEL_OP)]
    one, batch = KVStore(), KVStore()
    singles = [one.apply(i, c) for i, c in enumerate(commands)]
    assert batch.apply_batch(0, commands) == singles == [CANCELLED, CANCELLED, _OK, _OK]
    assert one.snapshot() == batch.snapshot()
    assert batch.data == {"b": "2"}


def test_a_cancelled_request_stays_cancelled_across_a_snapshot() -> None:
    kv = KVStore()
    kv.apply(0, cmd(9, 4, op=CANCEL_OP))
    restored = KVStore()
    restored.restore(kv.snapshot())
    assert restored.apply(1, cmd(9, 4, op=kv_put("k", "v"))) == CANCELLED
    assert restored.data == {}


def test_the_session_marks_are_not_msgpack_so_no_state_machine_result_looks_like_one() -> None:
    with pytest.raises(ValueError):  # 0xc1 is never the first byte of msgpack
        msgpack.unpackb(CANCELLED)
    assert CANCELLED.startswith(SESSION_MARK)
    assert not CANCEL_OP.startswith(SESSION_MARK)
