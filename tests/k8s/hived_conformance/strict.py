"""Decoding the extender's answers as HiveD's Go types would, from the types' schemas in
``fixtures.json`` (``checker/sdpaxos_conformance_test.go`` writes them by reflection).

``json_errors(value, root)`` is ``encoding/json`` with ``DisallowUnknownFields``: an object
key must name a field (Go matches case-insensitively after an exact match), every value must
fit its field's type (integers whole and in range, strings, booleans, ``null`` allowed where
Go allows it: for pointers, slices, maps and as a no-op elsewhere; ``meta.Time`` an RFC 3339
string or null). ``yaml_errors(value, root)`` is yaml.v2's ``UnmarshalStrict`` on an already
parsed document (keys matched exactly, unknown keys refused). ``filled(value, root)`` is the
set of field paths whose decoded value is not Go's zero value (``items[].status.vc``), to
hold an answer's filled fields against HiveD's own answer of the same kind.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["FIXTURES", "filled", "fixtures", "json_errors", "yaml_errors"]

FIXTURES = Path(__file__).with_name("fixtures.json")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


@cache
def fixtures() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(FIXTURES.read_text())
    return doc


class _Decoder:
    def __init__(self, flavour: str) -> None:
        schemas = fixtures()["schemas"][flavour]
        self.roots: dict[str, Any] = schemas["roots"]
        self.defs: dict[str, Any] = schemas["defs"]
        self.case_insensitive = flavour == "json"
        self.errors: list[str] = []
        self.paths: set[str] = set()

    def run(self, value: Any, root: str) -> None:
        self.decode(value, self.roots[root], "")

    def _fail(self, path: str, message: str) -> None:
        self.errors.append(f"{path or '.'}: {message}")

    def decode(self, value: Any, kind: dict[str, Any], path: str) -> bool:
        """Check ``value`` against ``kind``; whether it decodes to a non-zero value."""
        k = kind["kind"]
        if k == "ref":
            kind = self.defs[kind["name"]]
            k = kind["kind"]
        if value is None:  # null: a nil pointer, slice or map; a no-op for the rest
            return False
        if k == "ptr":
            self.decode(value, kind["elem"], path)
            return True
        if k in ("opaque", "any"):
            return True
        if k == "struct":
            return self._struct(value, kind, path)
        if k == "slice":
            if not isinstance(value, list):
                self._fail(path, f"cannot unmarshal {_json_kind(value)} into a slice")
                return False
            for item in value:
                if self.decode(item, kind["elem"], path + "[]"):
                    self.paths.add(path + "[]")
            return True  # an empty slice is not nil
        if k == "map":
            if not isinstance(value, dict):
                self._fail(path, f"cannot unmarshal {_json_kind(value)} into a map")
                return False
            for item in value.values():
                if self.decode(item, kind["elem"], path + ".*"):
                    self.paths.add(path + ".*")
            return True
        if k == "string":
            if not isinstance(value, str):
                self._fail(path, f"cannot unmarshal {_json_kind(value)} into a string")
            return bool(value)
        if k == "bool":
            if not isinstance(value, bool):
                self._fail(path, f"cannot unmarshal {_json_kind(value)} into a bool")
            return bool(value)
        if k in ("int", "uint"):
            bits = int(kind["bits"])
            low, high = (0, 2**bits - 1) if k == "uint" else (-(2**(bits - 1)),
                                                               2**(bits - 1) - 1)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                self._fail(path, f"cannot unmarshal {value!r} into an int{bits}")
                return False
            return value != 0
        if k == "float":
            if isinstance(value, bool) or not isinstance(value, int | float):
                self._fail(path, f"cannot unmarshal {_json_kind(value)} into a float")
            return bool(value)
        if k == "time":
            if not isinstance(value, str) or not _RFC3339.match(value):
                self._fail(path, f"{value!r} is not an RFC 3339 time")
            return True
        raise AssertionError(f"unknown schema kind {k}")

    def _struct(self, value: Any, kind: dict[str, Any], path: str) -> bool:
        if not isinstance(value, dict):
            self._fail(path, f"cannot unmarshal {_json_kind(value)} into a struct")
            return False
        fields = kind["fields"]
        any_set = False
        for key, item in value.items():
            match = next((f for f in fields if f["name"] == key), None)
            if match is None and self.case_insensitive:
                match = next((f for f in fields if f["name"].lower() == str(key).lower()), None)
            if match is None:
                self._fail(path, f"unknown field {key!r}")
                continue
            child = f"{path}.{match['name']}" if path else match["name"]
            if self.decode(item, match["type"], child):
                self.paths.add(child)
                any_set = True
        return any_set


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    return "number"


def json_errors(value: Any, root: str) -> list[str]:
    decoder = _Decoder("json")
    decoder.run(value, root)
    return decoder.errors


def yaml_errors(value: Any, root: str) -> list[str]:
    decoder = _Decoder("yaml")
    decoder.run(value, root)
    return decoder.errors


def filled(value: Any, root: str, flavour: str = "json") -> set[str]:
    decoder = _Decoder(flavour)
    decoder.run(value, root)
    return decoder.paths
