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

from consensus.sim.history import HistoryFormatError, Operation, load_jsonl

__all__ = [
    "CheckResult",
    "Verdict",
    "add_arguments",
    "brute_force_check",
    "check_history",
    "run",
]

INFINITY = float("inf")
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

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK


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


def _check_key(ops: list[Operation], deadline: float) -> tuple[Verdict, list[Operation]]:
    ops = [op for op in ops if not (op.ret is None and op.op == "read")]
    ops.sort(key=lambda op: op.call)
    n = len(ops)
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
            return Verdict.OK, []
        if depth > best_depth:
            best, best_depth = path, depth
        steps += 1
        if steps % _CHECK_CLOCK_EVERY == 0 and time.monotonic() > deadline:
            return Verdict.UNKNOWN, _unwind(ops, best)
        # The earliest return among unlinearized operations bounds who may go next. Ops are
        # sorted by call, so only a window from the first unlinearized one can matter: an op
        # called after that return can neither go next nor return earlier.
        lo = (~mask & (mask + 1)).bit_length() - 1
        min_ret = INFINITY
        hi = lo
        while hi < n and calls[hi] <= min_ret:
            if not mask >> hi & 1 and rets[hi] < min_ret:
                min_ret = rets[hi]
            hi += 1
        # try the operation that returned first first (pushed last): in real histories it
        # usually took effect first, which keeps the search on a good path
        window = [i for i in range(lo, hi) if not mask >> i & 1 and calls[i] <= min_ret]
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
    return Verdict.ILLEGAL, _unwind(ops, best)


def _unwind(ops: list[Operation], path: _Path) -> list[Operation]:
    order: list[Operation] = []
    while path is not None:
        index, path = path
        order.append(ops[index])
    order.reverse()
    return order


def check_history(ops: Sequence[Operation], *, timeout_s: float = 10.0) -> CheckResult:
    """Is the whole history linearizable? ``UNKNOWN`` if a key's search outlasts the budget."""
    deadline = time.monotonic() + timeout_s
    by_key: dict[str, list[Operation]] = {}
    for op in ops:
        by_key.setdefault(op.key, []).append(op)
    unknown_key = None
    for key in sorted(by_key):
        verdict, partial = _check_key(by_key[key], deadline)
        if verdict is Verdict.ILLEGAL:
            return CheckResult(
                Verdict.ILLEGAL,
                key,
                f"no linearization of the {len(by_key[key])} operations on key {key!r}",
                partial,
            )
        if verdict is Verdict.UNKNOWN:
            unknown_key = key
            break
    if unknown_key is not None:
        return CheckResult(Verdict.UNKNOWN, unknown_key, f"time budget of {timeout_s} s spent")
    return CheckResult(Verdict.OK, None, f"{len(ops)} operations on {len(by_key)} keys")


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
    if args.json:
        print(
            json.dumps(
                {
                    "verdict": result.verdict.name.lower(),
                    "key": result.key,
                    "detail": result.detail,
                    "operations": len(ops),
                }
            )
        )
    else:
        print(f"{result.verdict.value}: {result.detail}")
    return {Verdict.OK: 0, Verdict.ILLEGAL: 1, Verdict.UNKNOWN: 2}[result.verdict]
