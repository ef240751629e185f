from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.sim.history import HistoryFormatError, Operation, dump_jsonl, load_jsonl
from consensus.sim.lincheck import Verdict, brute_force_check, check_history, check_keys, run


def w(client: int, value: str, call: int, ret: int | None, key: str = "x") -> Operation:
    return Operation(client=client, key=key, op="write", input=value, output=None, call=call,
                     ret=ret)


def r(client: int, value: str | None, call: int, ret: int | None, key: str = "x") -> Operation:
    return Operation(client=client, key=key, op="read", input=None, output=value, call=call,
                     ret=ret)


def cas(client: int, expected: str | None, new: str, swapped: bool | None, call: int,
        ret: int | None, key: str = "x") -> Operation:
    return Operation(client=client, key=key, op="cas", input=(expected, new), output=swapped,
                     call=call, ret=ret)


def verdict(ops: list[Operation]) -> Verdict:
    return check_history(ops, timeout_s=5).verdict


# ---------------------------------------------------------------- anomalies are rejected


def test_stale_read_is_rejected() -> None:
    assert verdict([w(1, "a", 0, 10), w(1, "b", 20, 30), r(2, "a", 40, 50)]) is Verdict.ILLEGAL


def test_lost_write_is_rejected() -> None:
    # the write was acknowledged, then a read that starts later sees the old state
    assert verdict([w(1, "a", 0, 10), r(2, None, 20, 30)]) is Verdict.ILLEGAL


def test_duplicated_effect_is_rejected() -> None:
    # "a" is overwritten by "b", then shows up again although it was written once
    history = [w(1, "a", 0, 10), w(2, "b", 20, 30), r(3, "a", 40, 50)]
    assert verdict(history) is Verdict.ILLEGAL
    # two CAS from the same expected value cannot both succeed
    double = [w(1, "a", 0, 10), cas(2, "a", "b", True, 20, 30), cas(3, "a", "c", True, 40, 50)]
    assert verdict(double) is Verdict.ILLEGAL


def test_cas_anomaly_is_rejected() -> None:
    assert verdict([w(1, "a", 0, 10), cas(2, "z", "b", True, 20, 30)]) is Verdict.ILLEGAL
    assert verdict([w(1, "a", 0, 10), cas(2, "a", "b", False, 20, 30)]) is Verdict.ILLEGAL


# ---------------------------------------------------------------- valid histories pass


def test_concurrent_histories_are_accepted() -> None:
    # overlapping write and reads: either order is fine
    assert verdict([w(1, "a", 0, 100), r(2, None, 10, 20), r(3, "a", 30, 40)]) is Verdict.OK
    # a pending write whose effect is seen, and one never seen
    assert verdict([w(1, "a", 0, None), r(2, "a", 50, 60)]) is Verdict.OK
    assert verdict([w(1, "a", 0, None), r(2, None, 50, 60)]) is Verdict.OK
    # cas with an unknown outcome may or may not have swapped
    assert verdict([w(1, "a", 0, 5), cas(2, "a", "b", None, 10, None), r(3, "b", 20, 30)]) \
        is Verdict.OK
    # keys are independent
    assert verdict([w(1, "a", 0, 10, "x"), r(2, None, 20, 30, "y")]) is Verdict.OK


def test_porcupine_register_examples() -> None:
    # from porcupine's README: linearizable ...
    good = [w(0, "100", 0, 100), r(1, "100", 25, 75), r(2, None, 30, 60)]
    assert verdict(good) is Verdict.OK
    # ... and not: a read after a read that saw the new value sees the old one
    bad = [w(0, "200", 0, 100), r(1, "200", 10, 30), r(2, None, 40, 90)]
    assert verdict(bad) is Verdict.ILLEGAL


def test_illegal_result_names_the_key_and_a_partial_order() -> None:
    result = check_history([w(1, "a", 0, 10, "k"), r(2, None, 20, 30, "k")], timeout_s=5)
    assert result.key == "k"
    assert [op.op for op in result.partial] == ["write"]


def test_illegal_result_says_where_the_search_got_stuck() -> None:
    # "b" is acknowledged at 30; a read from 40 to 50 sees "a" again. The deepest legal
    # prefix is write a, write b, the overlapping read of "b"; there the register holds "b"
    # and the stale read, the only operation that may go next, cannot.
    history = [w(1, "a", 0, 10), w(2, "b", 20, 30), r(3, "a", 40, 50), r(4, "b", 45, 55),
               r(5, "b", 60, 70), w(6, "c", 80, 90), r(7, "y", 0, 5, key="y")]
    result = check_history(history, timeout_s=5)
    assert result.verdict is Verdict.ILLEGAL and result.key == "x"
    assert result.partial == [*history[:2], history[3]] and result.state == "b"
    assert result.stuck == [history[2]]
    where = result.where_stuck(context=1)
    assert where == {"key": "x", "linearized": 3, "last_linearized": [history[3].to_json()],
                     "state": "b", "stuck": [history[2].to_json()]}
    text = "\n".join(result.describe_stuck())
    assert "key 'x': 3 operations linearized" in text and "holds 'b'" in text
    assert "client 3 read -> 'a' [call 40, return 50]" in text
    # stuck at once: the operations overlapping the first one are the window
    first = check_history([r(1, "z", 0, 10), r(2, "q", 5, 20), w(3, "z", 30, 40)], timeout_s=5)
    assert first.verdict is Verdict.ILLEGAL and first.partial == [] and first.state is None
    assert [op.client for op in first.stuck] == [1, 2]


def test_every_key_is_checked_and_an_undecided_key_hides_no_violation() -> None:
    # key "a" is small and cannot be decided at once; key "b" is larger, checked after it,
    # and has a lost write (the old checker stopped at the first undecided key)
    hard = [w(i, f"v{i}", 0, None, key="a") for i in range(20)] + [r(99, "no", 99, 100, "a")]
    lost = [w(1, f"u{i}", 10 * i, 10 * i + 5, key="b") for i in range(40)]
    lost.append(r(2, "u0", 1000, 1010, key="b"))
    results = check_keys(hard + lost, timeout_s=0.0)
    assert [(r.key, r.verdict) for r in results] == [("a", Verdict.UNKNOWN),
                                                     ("b", Verdict.ILLEGAL)]
    assert check_history(hard + lost, timeout_s=0.0).key == "b"
    assert check_history(hard, timeout_s=0.0).verdict is Verdict.UNKNOWN


# ---------------------------------------------------------------- agreement with brute force

values = st.sampled_from(["a", "b", "c"])


@st.composite
def small_histories(draw: st.DrawFn) -> list[Operation]:
    ops = []
    for client in range(draw(st.integers(1, 7))):
        call = draw(st.integers(0, 20))
        ret = draw(st.one_of(st.none(), st.integers(call, call + 15)))
        key = draw(st.sampled_from(["x", "y"]))
        kind = draw(st.sampled_from(["read", "write", "cas"]))
        if kind == "read":
            ops.append(r(client, draw(st.one_of(st.none(), values)), call, ret, key))
        elif kind == "write":
            ops.append(w(client, draw(values), call, ret, key))
        else:
            ops.append(cas(client, draw(st.one_of(st.none(), values)), draw(values),
                           draw(st.booleans()), call, ret, key))
    return ops


@settings(max_examples=400, deadline=None)
@given(small_histories())
def test_agrees_with_brute_force(ops: list[Operation]) -> None:
    assert (check_history(ops, timeout_s=5).verdict is Verdict.OK) == brute_force_check(ops)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_real_sequential_executions_with_concurrency_windows_pass(data: st.DataObject) -> None:
    state: dict[str, str | None] = {}
    ops = []
    now = 0
    for client in range(data.draw(st.integers(1, 25))):
        key = data.draw(st.sampled_from(["x", "y", "z"]))
        current = state.get(key)
        kind = data.draw(st.sampled_from(["read", "write", "cas"]))
        at = now
        now += 10
        # the operation takes effect at `at`; its interval is widened at random on both sides
        call = at - data.draw(st.integers(0, 25))
        ret = at + data.draw(st.integers(0, 25))
        if kind == "read":
            ops.append(r(client, current, call, ret, key))
        elif kind == "write":
            state[key] = f"v{client}"
            ops.append(w(client, f"v{client}", call, ret, key))
        else:
            expected = data.draw(st.sampled_from([current, "nope"]))
            swapped = expected == current
            if swapped:
                state[key] = f"v{client}"
            ops.append(cas(client, expected, f"v{client}", swapped, call, ret, key))
    assert check_history(ops, timeout_s=5).verdict is Verdict.OK


def test_a_hard_history_times_out_as_unknown() -> None:
    # many concurrent pending writes and no way to satisfy the final read: exhaustive search
    ops = [w(i, f"v{i}", 0, None) for i in range(40)] + [r(99, "nope", 1000, 1001)]
    started = time.monotonic()
    result = check_history(ops, timeout_s=0.2)
    assert result.verdict is Verdict.UNKNOWN
    assert time.monotonic() - started < 5


def test_checks_a_large_sequential_history_quickly() -> None:
    ops = []
    for i in range(3000):
        ops.append(w(i % 30, f"v{i}", i * 10, i * 10 + 15, f"k{i % 10}"))
    started = time.monotonic()
    assert check_history(ops, timeout_s=10).verdict is Verdict.OK
    assert time.monotonic() - started < 5


# ---------------------------------------------------------------- file format and CLI


def test_jsonl_round_trip_and_errors(tmp_path: Path) -> None:
    ops = [w(1, "a", 0, 10), cas(2, None, "b", None, 5, None), r(3, "a", 12, 20)]
    buffer = io.StringIO()
    dump_jsonl(ops, buffer)
    assert load_jsonl(buffer.getvalue().splitlines()) == ops
    bad_lines: list[tuple[dict[str, Any] | str, str]] = [
        ("not json", "line 1: not JSON"),
        ({"client": 1, "key": "x", "op": "delete", "call": 0}, "line 1: op"),
        ({"client": 1, "key": "x", "op": "write", "input": 3, "call": 0}, "line 1: input"),
        ({"client": 1, "key": "x", "op": "read", "call": 5, "return": 2}, "line 1: return"),
        ({"client": "1", "key": "x", "op": "read", "call": 5}, "line 1: client"),
    ]
    for line, message in bad_lines:
        text = line if isinstance(line, str) else json.dumps(line)
        with pytest.raises(HistoryFormatError, match=message):
            load_jsonl([text])


@pytest.mark.parametrize(
    ("ops", "code"),
    [([w(1, "a", 0, 10), r(2, "a", 20, 30)], 0), ([w(1, "a", 0, 10), r(2, None, 20, 30)], 1)],
)
def test_cli_exit_codes(tmp_path: Path, ops: list[Operation], code: int,
                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "history.jsonl"
    with path.open("w") as out:
        dump_jsonl(ops, out)
    assert run(argparse.Namespace(history=str(path), timeout=5.0, json=True)) == code
    answer = json.loads(capsys.readouterr().out)
    assert answer["operations"] == len(ops)
    assert ("where" in answer) == (code == 1)
    assert run(argparse.Namespace(history=str(path), timeout=5.0, json=False)) == code
    assert ("none of these can go next" in capsys.readouterr().out) == (code == 1)


def test_cli_unknown_and_malformed(tmp_path: Path) -> None:
    hard = tmp_path / "hard.jsonl"
    with hard.open("w") as out:
        dump_jsonl([w(i, f"v{i}", 0, None) for i in range(40)] + [r(99, "x", 1000, 1001)], out)
    assert run(argparse.Namespace(history=str(hard), timeout=0.1, json=False)) == 2
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{}\n")
    assert run(argparse.Namespace(history=str(broken), timeout=1.0, json=False)) == 2
