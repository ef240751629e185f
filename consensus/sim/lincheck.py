"""Linearizability checking of key-value register histories (Wing & Gong, Lowe).

Each key is checked on its own (a register history is linearizable iff each key's is: P-
compositionality). For one key, a depth-first search builds a linearization: the next
operation may be any not-yet-linearized one that no other unlinearized operation precedes in
real time (``other.ret < op.call``); it must be legal in the register's current state. A
memo of (set of linearized operations, register value) prunes states already explored, so the
search is exponential only in the *concurrency* of the history, not its length.

Operations with an unknown outcome (``ret is None``) may take effect at any time after their
call or never: the search may linearize them (any output allowed) and succeeds once every
*completed* operation is linearized. Reads with an unknown outcome have no effect and are
dropped up front.

A time budget turns a search that runs too long into ``Verdict.UNKNOWN`` instead of hanging.
Every key is checked (``check_keys``), smallest first, each with an equal share of what is left
of the budget: a key that cannot be decided in time neither hides a violation on another key
nor takes the whole budget from the others.

For a key that is not linearizable the result says where the search got stuck: the longest
legal prefix of a linearization it found (``partial``), the register's value after it, and the
operations that could go next there (``stuck``: those not preceded in real time by another
unlinearized one), none of which leads to a linearization.
"""

from __future__ import annotations

import argparse
import enum
import itertools
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from consensus.sim.history import HistoryFormatError, Operation, load_jsonl

__all__ = [
    "CheckResult",
    "Verdict",
    "add_arguments",
    "brute_force_check",
    "check_history",
    "check_keys",
    "describe_op",
    "run",
]

INFINITY = float("inf")
#: how many linearized operations before the point where the search got stuck a report shows
CONTEXT_OPS = 3
_CHECK_CLOCK_EVERY = 2048


class Verdict(enum.Enum):
    OK = "linearizable"
    ILLEGAL = "not linearizable"
    UNKNOWN = "unknown (time budget exhausted)"


@dataclass
class CheckResult:
    verdict: Verdict
    key: str | None = None
    detail: str = ""
    #: for an illegal key: the longest legal prefix of a linearization that was found
    partial: list[Operation] = field(default_factory=list)
    #: for an illegal key: the operations that could go next after ``partial`` (none of them
    #: leads to a linearization), and the register's value there
    stuck: list[Operation] = field(default_factory=list)
    state: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK

    def where_stuck(self, context: int = CONTEXT_OPS) -> dict[str, Any]:
        """An illegal key's minimal window, as JSON: the key, how many operations were
        linearized, the last ``context`` of them, the register's value there and the
        operations none of which could go next."""
        return {
            "key": self.key,
            "linearized": len(self.partial),
            "last_linearized": [op.to_json() for op in self.partial[-context:]],
            "state": self.state,
            "stuck": [op.to_json() for op in self.stuck],
        }

    def describe_stuck(self, context: int = CONTEXT_OPS) -> list[str]:
        """``where_stuck`` as text lines."""
        lines = [f"key {self.key!r}: {len(self.partial)} operations linearized, the last "
                 f"{min(context, len(self.partial))} of them:"]
        lines += [f"  {describe_op(op)}" for op in self.partial[-context:]]
        lines.append(f"the register then holds {self.state!r}; none of these can go next:")
        lines += [f"  {describe_op(op)}" for op in self.stuck]
        return lines


def describe_op(op: Operation) -> str:
    """One operation as a line: client, what it did, what it was told, when."""
    if op.op == "read":
        what = "read" + ("" if op.ret is None else f" -> {op.output!r}")
    elif op.op == "write":
        what = f"write {op.input!r}"
    else:
        expected, new = op.input
        what = f"cas {expected!r} -> {new!r}" + ("" if op.ret is None else f": {op.output}")
    ret = "open" if op.ret is None else op.ret
    return f"client {op.client} {what} [call {op.call}, return {ret}]"


_MISSING = object()

#: a linearization prefix as a linked list: (index of the last operation, the rest)
_Path = tuple[int, "_Path"] | None


def _step(op: Operation, state: str | None) -> object:
    """The register's value after ``op``, or ``_MISSING`` if ``op`` is illegal in ``state``."""
    unknown = op.ret is None
    if op.op == "read":
        return state if unknown or op.output == state else _MISSING
    if op.op == "write":
        return op.input
    expected, new = op.input
    swapped = state == expected
    if not unknown and op.output != swapped:
        return _MISSING
    return new if swapped else state


def _eligible(calls: list[int], rets: list[float], mask: int) -> list[int]:
    """The operations not in ``mask`` that may be linearized next: no other operation outside
    ``mask`` returned before they were called. Ops are sorted by call, so only a window from
    the first one outside ``mask`` can matter: an op called after the earliest return among
    them can neither go next nor return earlier."""
    n = len(calls)
    lo = (~mask & (mask + 1)).bit_length() - 1
    min_ret = INFINITY
    hi = lo
    while hi < n and calls[hi] <= min_ret:
        if not mask >> hi & 1 and rets[hi] < min_ret:
            min_ret = rets[hi]
        hi += 1
    return [i for i in range(lo, hi) if not mask >> i & 1 and calls[i] <= min_ret]


def _check_key(ops: list[Operation], deadline: float) -> CheckResult:
    ops = [op for op in ops if not (op.ret is None and op.op == "read")]
    ops.sort(key=lambda op: op.call)
    calls = [op.call for op in ops]
    rets = [INFINITY if op.ret is None else op.ret for op in ops]
    completed_mask = sum(1 << i for i, op in enumerate(ops) if op.ret is not None)
    seen: set[tuple[int, object]] = set()
    # DFS; a path is a linked list (index, parent) so every stacked state knows its prefix
    stack: list[tuple[int, object, _Path, int]] = [(0, None, None, 0)]
    best: _Path = None
    best_depth = 0
    steps = 0
    while stack:
        mask, state, path, depth = stack.pop()
        if mask & completed_mask == completed_mask:
            return CheckResult(Verdict.OK)
        if depth > best_depth:
            best, best_depth = path, depth
        steps += 1
        if steps % _CHECK_CLOCK_EVERY == 0 and time.monotonic() > deadline:
            return CheckResult(Verdict.UNKNOWN, partial=_unwind(ops, best))
        # try the operation that returned first first (pushed last): in real histories it
        # usually took effect first, which keeps the search on a good path
        window = _eligible(calls, rets, mask)
        window.sort(key=rets.__getitem__, reverse=True)
        for i in window:
            after = _step(ops[i], state)  # type: ignore[arg-type]
            if after is _MISSING:
                continue
            memo = (mask | 1 << i, after)
            if memo in seen:
                continue
            seen.add(memo)
            stack.append((memo[0], after, (i, path), depth + 1))
    partial = _unwind(ops, best)
    linearized = sum(1 << i for i in _indices(best))
    stuck = [ops[i] for i in _eligible(calls, rets, linearized)]
    return CheckResult(Verdict.ILLEGAL, partial=partial, stuck=stuck, state=_value_after(partial))


def _value_after(order: Sequence[Operation]) -> str | None:
    """The register's value after ``order`` (a legal sequence)."""
    value: str | None = None
    for op in order:
        value = _step(op, value)  # type: ignore[assignment]
    return value


def _indices(path: _Path) -> list[int]:
    order: list[int] = []
    while path is not None:
        index, path = path
        order.append(index)
    order.reverse()
    return order


def _unwind(ops: list[Operation], path: _Path) -> list[Operation]:
    return [ops[i] for i in _indices(path)]


def check_keys(ops: Sequence[Operation], *, timeout_s: float = 10.0) -> list[CheckResult]:
    """Every key's verdict (in key order), each key checked on its own. Keys are taken
    smallest first, each with an equal share of the time left, so small keys are decided
    and leave their unused time to the larger ones."""
    by_key: dict[str, list[Operation]] = {}
    for op in ops:
        by_key.setdefault(op.key, []).append(op)
    deadline = time.monotonic() + timeout_s
    results: dict[str, CheckResult] = {}
    for left, key in enumerate(sorted(by_key, key=lambda k: (len(by_key[k]), k))):
        share = (deadline - time.monotonic()) / (len(by_key) - left)
        result = _check_key(by_key[key], time.monotonic() + share)
        result.key = key
        if result.verdict is Verdict.ILLEGAL:
            result.detail = f"no linearization of the {len(by_key[key])} operations on key {key!r}"
        elif result.verdict is Verdict.UNKNOWN:
            result.detail = f"time budget of {timeout_s} s spent"
        else:
            result.detail = f"{len(by_key[key])} operations on key {key!r}"
        results[key] = result
    return [results[key] for key in sorted(results)]


def check_history(ops: Sequence[Operation], *, timeout_s: float = 10.0) -> CheckResult:
    """Is the whole history linearizable? ``ILLEGAL`` (the first such key) if any key is not;
    else ``UNKNOWN`` if a key's search outlasted its share of the budget."""
    results = check_keys(ops, timeout_s=timeout_s)
    for verdict in (Verdict.ILLEGAL, Verdict.UNKNOWN):
        for result in results:
            if result.verdict is verdict:
                return result
    return CheckResult(Verdict.OK, None, f"{len(ops)} operations on {len(results)} keys")


def brute_force_check(ops: Sequence[Operation]) -> bool:
    """Reference checker for tiny histories: try every order of every subset that contains all
    completed operations and respects real time."""
    by_key: dict[str, list[Operation]] = {}
    for op in ops:
        by_key.setdefault(op.key, []).append(op)
    return all(_brute_key(key_ops) for key_ops in by_key.values())


def _brute_key(ops: list[Operation]) -> bool:
    completed = [op for op in ops if op.ret is not None]
    pending = [op for op in ops if op.ret is None]
    for r in range(len(pending) + 1):
        for chosen in itertools.combinations(pending, r):
            for order in itertools.permutations(completed + list(chosen)):
                if _respects_real_time(order) and _legal(order):
                    return True
    return False


def _respects_real_time(order: Sequence[Operation]) -> bool:
    for i, earlier in enumerate(order):
        for later in order[i + 1 :]:
            if later.ret is not None and later.ret < earlier.call:
                return False
    return True


def _legal(order: Sequence[Operation]) -> bool:
    state: str | None = None
    for op in order:
        after = _step(op, state)
        if after is _MISSING:
            return False
        state = after  # type: ignore[assignment]
    return True


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check a JSON-lines history (format: see consensus/sim/history.py). Exit status: "
        "0 linearizable, 1 not linearizable, 2 unknown within --timeout or a malformed file."
    )
    parser.add_argument("history", help="JSON-lines file, one operation per line")
    parser.add_argument("--timeout", type=float, default=60.0, help="time budget, seconds")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        ops = load_jsonl(args.history)
    except (OSError, HistoryFormatError) as exc:
        print(f"sdpaxos lincheck: {exc}", file=sys.stderr)
        return 2
    result = check_history(ops, timeout_s=args.timeout)
    illegal = result.verdict is Verdict.ILLEGAL
    if args.json:
        print(
            json.dumps(
                {
                    "verdict": result.verdict.name.lower(),
                    "key": result.key,
                    "detail": result.detail,
                    "operations": len(ops),
                    **({"where": result.where_stuck()} if illegal else {}),
                }
            )
        )
    else:
        print(f"{result.verdict.value}: {result.detail}")
        if illegal:
            print("\n".join(result.describe_stuck()))
    return {Verdict.OK: 0, Verdict.ILLEGAL: 1, Verdict.UNKNOWN: 2}[result.verdict]
