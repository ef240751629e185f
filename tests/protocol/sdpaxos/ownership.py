"""Who writes which field of the SDPaxos core: a static count over the package's source.

The package's rule (``consensus/protocol/sdpaxos/__init__.py``): every field has one owner,
the class that assigns it in its own methods (the facade, ``SDPaxosReplica``, owns what its
``__init__`` assigns), and only the owner writes it; the others call the owner's methods.
``foreign_writes`` lists, per class, the fields of other owners it writes:

* through the facade (``self.r.x``, or ``r.x`` with ``r = self.r``): assigning ``x``, an item
  of it, or a field under it (``r.part.y``, ``r.part.y.z`` count as writes of ``part.y``),
  deleting an item, or calling a mutating method of a builtin container on it
  (``append``, ``add``, ``pop``, ``clear``, ...);
* through a local name bound to something reached that way (``inst = r.c[key]``,
  ``for slots in r.ordering.seq_slots.values()``, a walrus): its writes count as writes of
  the field it came from;
* a ``CInstance``'s fields belong to whoever ``CINSTANCE_FIELDS`` names (the value to the
  C-instance store, the proposer's bookkeeping to the C-phase), whichever way it was reached.

Not counted: ``r.out`` (the turn's output: every part emits into it, see ``Ready``), calls
of an owner's own methods (that is the point), and writes a class makes to ``self``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CINSTANCE_FIELDS", "FACADE", "facade_attributes", "foreign_writes"]

FACADE = "SDPaxosReplica"
#: the turn's output channel: appended to by every part by design
OUTPUT = "out"
MUTATORS = frozenset({
    "add", "append", "clear", "difference_update", "discard", "extend", "insert",
    "intersection_update", "pop", "popitem", "remove", "setdefault", "update",
})
#: the fields of a ``CInstance`` record and the class that owns each
CINSTANCE_FIELDS: dict[str, str] = {
    "ballot": "CStore", "batch": "CStore", "committed": "CStore",
    "leading": "CPhase", "acks": "CPhase", "sent_at": "CPhase", "sent_to": "CPhase",
    "overtaken_at": "CPhase",
}


def _classes(package: Path) -> Iterator[ast.ClassDef]:
    for path in sorted(package.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                yield node


def _self_fields(cls: ast.ClassDef) -> set[str]:
    fields: set[str] = set()
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for leaf in ast.walk(target):
                if (isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name)
                        and leaf.value.id == "self"):
                    fields.add(leaf.attr)
    return fields


def facade_attributes(package: Path) -> list[str]:
    """The attributes ``SDPaxosReplica.__init__`` assigns, in order."""
    for cls in _classes(package):
        if cls.name == FACADE:
            for item in cls.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    seen: list[str] = []
                    for node in ast.walk(item):
                        targets: list[ast.expr] = []
                        if isinstance(node, ast.Assign):
                            targets = list(node.targets)
                        elif isinstance(node, ast.AnnAssign):
                            targets = [node.target]
                        for target in targets:
                            if (isinstance(target, ast.Attribute)
                                    and isinstance(target.value, ast.Name)
                                    and target.value.id == "self"
                                    and target.attr not in seen):
                                seen.append(target.attr)
                    return seen
    raise AssertionError(f"no {FACADE}.__init__")


def _part_classes(package: Path) -> dict[str, str]:
    """Facade attribute -> the class of the package it holds (``self.c_phase = CPhase(self)``;
    ``rule_for(self)`` builds the readiness rule)."""
    names = {cls.name for cls in _classes(package)}
    parts: dict[str, str] = {}
    for cls in _classes(package):
        if cls.name != FACADE:
            continue
        for node in ast.walk(cls):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Attribute)
                    and isinstance(node.targets[0].value, ast.Name)
                    and node.targets[0].value.id == "self"
                    and isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Name)):
                func = node.value.func.id
                if func == "rule_for":
                    parts[node.targets[0].attr] = "ReadinessRule"
                elif func in names:
                    parts[node.targets[0].attr] = func
    return parts


class _Analyzer:
    def __init__(self, package: Path) -> None:
        self.parts = _part_classes(package)
        self.owned = {cls.name: _self_fields(cls) for cls in _classes(package)}
        self.found: dict[str, set[str]] = defaultdict(set)

    # A "root" is (owner class, field); field "" for an object an owner's method returned.
    def _root(self, expr: ast.expr, aliases: dict[str, tuple[str, str]],
              facade_names: set[str]) -> tuple[str, str] | None:
        chain: list[str] = []
        node = expr
        while True:
            if isinstance(node, ast.Attribute):
                chain.append(node.attr)
                node = node.value
            elif isinstance(node, ast.Subscript):
                chain.append("[]")
                node = node.value
            elif isinstance(node, ast.Call):
                chain.append("()")
                node = node.func
            else:
                break
        chain.reverse()
        if not isinstance(node, ast.Name):
            return None
        if node.id in aliases:
            return aliases[node.id]
        if node.id == "self" and chain[:1] == ["r"] and "self" not in facade_names:
            chain = chain[1:]
        elif node.id not in facade_names:
            return None
        if not chain or chain[0] in ("[]", "()") or chain[1:2] == ["()"]:
            return None  # the facade itself, or what one of its methods returned
        first = chain[0]
        if first not in self.parts:
            return (FACADE, first)
        owner = self.parts[first]
        rest = chain[1:]
        if not rest or rest[0] in ("[]", "()") or rest[1:2] == ["()"]:
            return (owner, "")
        return (owner, rest[0])

    def _write(self, writer: str, root: tuple[str, str] | None, leaf: str | None) -> None:
        if root is None:
            return
        owner, field = root
        if leaf in CINSTANCE_FIELDS and (owner, field) in (
            (FACADE, "c"), ("CStore", ""), ("CStore", "_instances"), ("CStore", "instances")
        ):
            owner, field = CINSTANCE_FIELDS[leaf], f"CInstance.{leaf}"
        if not field or owner == writer or (owner == FACADE and field == OUTPUT):
            return
        self.found[writer].add(f"{owner}.{field}")

    def _target(self, writer: str, target: ast.expr, aliases: dict[str, tuple[str, str]],
                facade: set[str]) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self._target(writer, elt, aliases, facade)
            return
        if isinstance(target, ast.Attribute | ast.Subscript):
            leaf = target.attr if isinstance(target, ast.Attribute) else None
            self._write(writer, self._root(target, aliases, facade), leaf)

    def visit_function(self, writer: str, func: ast.FunctionDef) -> None:
        facade = {"r"} if writer != FACADE else {"self"}
        aliases: dict[str, tuple[str, str]] = {}
        for node in ast.walk(func):
            # bindings first (ast.walk is breadth-first: good enough for straight-line code)
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                root = self._root(node.value, aliases, facade)
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and root is not None:
                        aliases[target.id] = root
            elif isinstance(node, ast.NamedExpr):
                root = self._root(node.value, aliases, facade)
                if root is not None:
                    aliases[node.target.id] = root
            elif isinstance(node, ast.For | ast.comprehension):
                root = self._root(node.iter, aliases, facade)
                if root is not None:
                    for leaf in ast.walk(node.target):
                        if isinstance(leaf, ast.Name):
                            aliases[leaf.id] = root
        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    self._target(writer, target, aliases, facade)
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                self._target(writer, node.target, aliases, facade)
            elif isinstance(node, ast.Delete):
                for target in node.targets:
                    self._target(writer, target, aliases, facade)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in MUTATORS):
                obj = node.func.value
                self._target(writer, obj, aliases, facade)


def foreign_writes(package: Path) -> dict[str, set[str]]:
    """Per class, the ``Owner.field`` names it writes that another class owns."""
    analyzer = _Analyzer(package)
    for cls in _classes(package):
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and not (
                cls.name == FACADE and item.name == "__init__"
            ):
                analyzer.visit_function(cls.name, item)
    return {k: v for k, v in analyzer.found.items() if v}
