"""Client histories of a key-value register store, and their JSON-lines file format.

One operation per line, a JSON object::

    {"client": 3, "key": "x", "op": "write", "input": "v7", "output": null,
     "call": 1000, "return": 1850}
    {"client": 4, "key": "x", "op": "read", "input": null, "output": "v7",
     "call": 1200, "return": 1900}
    {"client": 5, "key": "x", "op": "cas", "input": ["v7", "v8"], "output": true,
     "call": 2000, "return": null}

* ``client``: int, the client that issued it (a client has one operation open at a time);
* ``key``: str; operations on different keys are independent;
* ``op``: ``"read"`` (input null, output the value read or null for absent), ``"write"``
  (input the value, output null) or ``"cas"`` (input ``[expected or null, new]``, output
  true if it swapped);
* ``call`` / ``return``: integer times on one clock (any unit); ``[call, return]`` is a closed
  interval. ``"return": null`` means the outcome is unknown (the client timed out, crashed, or
  got an indefinite failure): the operation may have taken effect at any time after its call,
  or never; its output is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

__all__ = ["HistoryFormatError", "Operation", "dump_jsonl", "load_jsonl"]

OpName = Literal["read", "write", "cas"]


class HistoryFormatError(ValueError):
    """A history file line is not a valid operation; the message names the line and field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Operation:
    client: int
    key: str
    op: OpName
    input: Any
    output: Any
    call: int
    ret: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "key": self.key,
            "op": self.op,
            "input": list(self.input) if isinstance(self.input, tuple) else self.input,
            "output": self.output,
            "call": self.call,
            "return": self.ret,
        }


def _parse(line_no: int, raw: Any) -> Operation:
    def bad(field: str, why: str) -> HistoryFormatError:
        return HistoryFormatError(f"line {line_no}: {field}: {why}")

    if not isinstance(raw, dict):
        raise bad("line", "expected a JSON object")
    for field in ("client", "key", "op", "call"):
        if field not in raw:
            raise bad(field, "missing")
    client, key, op, call = raw["client"], raw["key"], raw["op"], raw["call"]
    ret = raw.get("return")
    if not isinstance(client, int) or isinstance(client, bool):
        raise bad("client", "expected an integer")
    if not isinstance(key, str):
        raise bad("key", "expected a string")
    if op not in ("read", "write", "cas"):
        raise bad("op", f"expected read, write or cas, got {op!r}")
    for name, value in (("call", call), ("return", ret)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise bad(name, "expected an integer time")
    if call is None:
        raise bad("call", "expected an integer time")
    if ret is not None and ret < call:
        raise bad("return", f"returns ({ret}) before its call ({call})")
    value, output = raw.get("input"), raw.get("output")
    if op == "write" and not isinstance(value, str):
        raise bad("input", "a write's input must be a string")
    if op == "read" and ret is not None and output is not None and not isinstance(output, str):
        raise bad("output", "a read's output must be a string or null")
    if op == "cas":
        if not (
            isinstance(value, list)
            and len(value) == 2
            and (value[0] is None or isinstance(value[0], str))
            and isinstance(value[1], str)
        ):
            raise bad("input", "a cas input must be [expected or null, new]")
        value = (value[0], value[1])
        if ret is not None and not isinstance(output, bool):
            raise bad("output", "a completed cas must output true or false")
    return Operation(
        client=client, key=key, op=op, input=value, output=output, call=call, ret=ret
    )


def load_jsonl(source: str | Path | Iterable[str]) -> list[Operation]:
    """Read a history; ``source`` is a path or an iterable of lines."""
    lines = Path(source).read_text().splitlines() if isinstance(source, str | Path) else source
    ops = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HistoryFormatError(f"line {line_no}: not JSON: {exc.msg}") from None
        ops.append(_parse(line_no, raw))
    return ops


def dump_jsonl(ops: Iterable[Operation], out: IO[str]) -> None:
    for op in ops:
        out.write(json.dumps(op.to_json()) + "\n")
