"""HiveD's Kubernetes surface: the pod scheduling spec annotation in, the bind annotations out.

**The spec** (``hivedscheduler.microsoft.com/pod-scheduling-spec``, YAML) is read as HiveD
reads it (``pkg/internal/utils.go: ExtractPodSchedulingSpec``), so every spec HiveD accepts is
accepted here with the same meaning, and every spec it refuses is refused with its message:

* the legacy keys are rewritten first, as HiveD does, by replacing the substrings
  ``gpuType``, ``gpuNumber``, ``gpuIsolation`` and ``physicalGpuIndices`` in the whole text
  (values included) with their ``leafCell`` names;
* the YAML is decoded into HiveD's ``api.PodSchedulingSpec`` as Go's ``yaml.v2`` does
  (``_GoYaml``): unknown keys are ignored, a null or missing field is its zero value, any
  scalar is a string field's raw text, a float is truncated into an integer field, and a
  value of the wrong kind is the same ``cannot unmarshal`` error, with its line;
* ``ignoreK8sSuggestedNodes`` defaults to true; no ``affinityGroup`` means the pod alone,
  named ``namespace/name``; members of the same ``leafCellNumber`` are merged;
* the checks and their messages are HiveD's (``VirtualCluster is empty``, ``Priority is less
  than -1``, ... ``AffinityGroup.Members does not contains current Pod``).

``version: v2`` with that schema's keys selects the request schema of HiveD's ``cell-as-sku``
work (``pkg/api/v2``: ``cellType``, ``cellNumber``, a ``podRootGroup`` tree of ``pod`` /
``childGroups``), with its checks and messages; its gang is flattened into this store's
members. What the store cannot place is refused plainly: ``withinOneCell``, a
``podMinNumber`` below ``podMaxNumber``, one gang asking for several cell types. Any other
spec is read as HiveD master reads it, which ignores ``version``.

**The bind info** (``hivedscheduler.microsoft.com/pod-bind-info``, ``api.PodBindInfo`` as
yaml.v2 writes it): ``node``, ``leafCellIsolation``, ``cellChain`` and
``affinityGroupBindInfo``, the whole group's placement per member, each leaf with the type of
the VC's preassigned cell it is in (``preassignedCellTypes``; "" for opportunistic use), which
is what HiveD's recovery (``AddAllocatedPod``) finds virtual cells by. Nothing else: HiveD's
types are read strictly by some tools. The store's fencing token of the allocation has its
own annotation, ``FENCING_ANNOTATION``, so a node agent can refuse a stale binding.
``hivedscheduler.microsoft.com/pod-leaf-cell-isolation``: the pod's device indices,
comma-separated (what goes into ``NVIDIA_VISIBLE_DEVICES``).

A pod is HiveD's only if a container or init container asks for the resource
``ENABLE_RESOURCE`` with a positive quantity (HiveD's ``IsHivedEnabled``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import yaml

from cluster_state.ops import MAX_PRIORITY, OPPORTUNISTIC, GroupSpec, Member, Placed

__all__ = [
    "BIND_INFO_ANNOTATION",
    "ENABLE_RESOURCE",
    "FENCING_ANNOTATION",
    "ISOLATION_ANNOTATION",
    "SPEC_ANNOTATION",
    "PodRequest",
    "SpecError",
    "bind_annotations",
    "bind_info",
    "convert_old_annotation",
    "go_quote",
    "hived_enabled",
    "pod_request",
    "slot_of_bound_pod",
]

_PREFIX = "hivedscheduler.microsoft.com/"
SPEC_ANNOTATION = _PREFIX + "pod-scheduling-spec"
BIND_INFO_ANNOTATION = _PREFIX + "pod-bind-info"
ISOLATION_ANNOTATION = _PREFIX + "pod-leaf-cell-isolation"
ENABLE_RESOURCE = _PREFIX + "pod-scheduling-enable"
#: the allocation's fencing token (the store's log position it took effect at)
FENCING_ANNOTATION = "sdpaxos.io/fencing-token"
#: what HiveD's spec errors start with
_SPEC_ERROR = f"Pod annotation {SPEC_ANNOTATION}: "
#: HiveD's ``convertOldAnnotation``: old key names, replaced anywhere in the text
_OLD_KEYS = (("gpuType", "leafCellType"), ("gpuNumber", "leafCellNumber"),
             ("gpuIsolation", "leafCellIsolation"),
             ("physicalGpuIndices", "physicalLeafCellIndices"))
_INT32 = (-(2**31), 2**31 - 1)


class SpecError(ValueError):
    """A pod whose scheduling spec HiveD would refuse: ``str()`` is HiveD's message (its
    "User Error", HTTP 400 inside the extender's answer)."""


@dataclass(frozen=True, slots=True)
class PodRequest:
    """One pod's request: its identity, its gang and its own leaf cell number."""

    namespace: str
    name: str
    uid: str
    spec: GroupSpec
    leaves: int  # this pod's leafCellNumber
    ignore_suggested: bool  # ignoreK8sSuggestedNodes

    @property
    def key(self) -> str:
        """HiveD's pod key in messages: ``uid(namespace/name)``."""
        return f"{self.uid}({self.namespace}/{self.name})"


def convert_old_annotation(text: str) -> str:
    """HiveD's ``convertOldAnnotation`` (none of the old names is part of another, so
    replacing them one after the other is Go's one-pass ``strings.Replacer``)."""
    for old, new in _OLD_KEYS:
        text = text.replace(old, new)
    return text


def go_quote(text: str) -> str:
    """``text`` as Go's ``%#v`` prints a string (``strconv.Quote``)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out) + '"'


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "\v": "\\v"}


# --------------------------------------------------------------------------- yaml.v2, as Go
# A field's kind: "string", "int32", "bool", a struct (a _Struct), ("ptr", kind) or
# ("slice", kind). Go type names appear in yaml.v2's errors.
@dataclass(slots=True)
class _Struct:
    go_name: str
    fields: tuple[tuple[str, Any], ...]  # (yaml key, kind), in the Go struct's order


_MEMBER = _Struct("api.AffinityGroupMemberSpec", (("podNumber", "int32"),
                                                  ("leafCellNumber", "int32")))
_GROUP = _Struct("api.AffinityGroupSpec", (("name", "string"),
                                           ("members", ("slice", _MEMBER))))
_SPEC_V1 = _Struct("api.PodSchedulingSpec", (
    ("virtualCluster", "string"), ("priority", "int32"), ("pinnedCellId", "string"),
    ("leafCellType", "string"), ("leafCellNumber", "int32"), ("gangReleaseEnable", "bool"),
    ("lazyPreemptionEnable", "bool"), ("ignoreK8sSuggestedNodes", "bool"),
    ("affinityGroup", ("ptr", _GROUP))))
_CELLS_PER_POD = _Struct("v2.PodGroupMemberCellSpec", (("cellType", "string"),
                                                      ("cellNumber", "int32")))
_POD_V2 = _Struct("v2.PodGroupMemberSpec", (
    ("podMinNumber", "int32"), ("podMaxNumber", "int32"), ("cellsPerPod", _CELLS_PER_POD),
    ("containsCurrentPod", "bool")))
_GROUP_V2 = _Struct("v2.PodGroupSpec", ())
_GROUP_V2.fields = (  # (set here: a group holds groups)
    ("name", "string"), ("withinOneCell", "string"), ("pod", ("ptr", _POD_V2)),
    ("childGroups", ("slice", ("ptr", _GROUP_V2))), ("pods", ("slice", _POD_V2)))
_SPEC_V2 = _Struct("v2.PodSchedulingSpec", (
    ("version", "string"), ("virtualCluster", "string"), ("priority", "int32"),
    ("pinnedCellId", "string"), ("cellType", "string"), ("cellNumber", "int32"),
    ("gangReleaseEnable", "bool"), ("lazyPreemptionEnable", "bool"),
    ("podRootGroup", ("ptr", _GROUP_V2))))

_TAGS = {"tag:yaml.org,2002:" + t: "!!" + t
         for t in ("str", "int", "float", "bool", "null", "seq", "map", "binary", "timestamp")}
_INT_TAG, _FLOAT_TAG, _BOOL_TAG, _NULL_TAG, _STR_TAG = (
    "tag:yaml.org,2002:" + t for t in ("int", "float", "bool", "null", "str"))
#: libyaml's parser where PyYAML has it (yaml.v2 is a port of libyaml: the same syntax
#: errors), else PyYAML's own
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: builds the value of a scalar node (stateless for scalars: one is enough)
_SCALARS = yaml.constructor.SafeConstructor()


def _scalar_value(node: yaml.ScalarNode) -> Any:
    """A plain scalar's value as its resolved tag says (yaml.v2's ``resolve``)."""
    if node.tag == _INT_TAG:
        return _SCALARS.construct_yaml_int(node)
    if node.tag == _FLOAT_TAG:
        return _SCALARS.construct_yaml_float(node)
    if node.tag == _BOOL_TAG:
        return _SCALARS.construct_yaml_bool(node)
    if node.tag == _NULL_TAG:
        return None
    return str(node.value)


def _go_type(kind: Any) -> str:
    if isinstance(kind, _Struct):
        return kind.go_name
    if isinstance(kind, tuple):
        return ("*" if kind[0] == "ptr" else "[]") + _go_type(kind[1])
    return str(kind)


class _GoYaml:
    """Decodes a PyYAML node tree into plain values as yaml.v2 decodes into a Go struct:
    the zero value for what is missing or null, type errors collected with their lines."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def _error(self, node: yaml.Node, kind: Any) -> None:
        tag = _TAGS.get(node.tag, node.tag)
        value = ""
        if isinstance(node, yaml.ScalarNode):
            raw = str(node.value)
            value = f" `{raw[:7]}...`" if len(raw) > 10 else f" `{raw}`"
        self.errors.append(f"line {node.start_mark.line + 1}: cannot unmarshal {tag}{value} "
                           f"into {_go_type(kind)}")

    @staticmethod
    def zero(kind: Any) -> Any:
        if kind == "string":
            return ""
        if kind == "int32":
            return 0
        if kind == "bool":
            return False
        if isinstance(kind, _Struct):
            return {name: _GoYaml.zero(k) for name, k in kind.fields}
        return None  # a nil pointer or slice

    def decode(self, node: yaml.Node | None, kind: Any,
               defaults: dict[str, Any] | None = None) -> Any:
        """``defaults``: a struct's fields before decoding (Go's initialised struct)."""
        if node is None:  # nothing to decode: the struct as initialised
            return {**self.zero(kind), **(defaults or {})}
        if isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG:
            return self.zero(kind)
        if isinstance(kind, tuple) and kind[0] == "ptr":
            return self.decode(node, kind[1])
        if isinstance(kind, tuple):  # a slice
            if not isinstance(node, yaml.SequenceNode):
                self._error(node, kind)
                return None
            return [self.decode(item, kind[1]) for item in node.value]
        if isinstance(kind, _Struct):
            if not isinstance(node, yaml.MappingNode):
                self._error(node, kind)
                return self.zero(kind)
            out = {**self.zero(kind), **(defaults or {})}
            fields = dict(kind.fields)
            for key, value in node.value:
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else None
                if name in fields:
                    out[name] = self.decode(value, fields[name])
            return out
        if not isinstance(node, yaml.ScalarNode):
            self._error(node, kind)
            return self.zero(kind)
        return self._scalar(node, kind)

    def _scalar(self, node: yaml.ScalarNode, kind: str) -> Any:
        if kind == "string":
            return str(node.value)
        if kind == "bool" and node.tag == _BOOL_TAG:
            return _scalar_value(node)
        if kind == "int32" and node.tag in (_INT_TAG, _FLOAT_TAG):
            value = _scalar_value(node)
            if isinstance(value, int | float) and value == value and abs(value) != float("inf"):
                number = int(value)  # Go's int64(float64) truncates toward zero
                if _INT32[0] <= number <= _INT32[1]:
                    return number
        self._error(node, kind)
        return self.zero(kind)


def _failed(text: str) -> str:
    return f"Failed to unmarshal YAML {go_quote(text)} to Object: "


def _compose(text: str) -> yaml.Node | None:
    """The YAML node tree of ``text``; ``SpecError`` with HiveD's message
    (``common.FromYaml``) if it is not YAML."""
    try:
        node: yaml.Node | None = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        # yaml.v2's line: the problem's (0-based: libyaml's parser has moved on a line; a
        # scanner error counts one more), else the context's, else none
        line = 0
        if exc.problem_mark is not None and exc.problem_mark.line:
            line = exc.problem_mark.line + isinstance(exc, yaml.scanner.ScannerError)
        elif exc.context_mark is not None:
            line = exc.context_mark.line
        where = f"line {line}: " if line else ""
        raise SpecError(f"{_failed(text)}yaml: {where}{exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{_failed(text)}yaml: {exc}") from None
    return node


def _decode_yaml(text: str, node: yaml.Node | None, kind: _Struct,
                 defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """``node`` (of ``text``) decoded as yaml.v2 decodes it into ``kind`` initialised with
    ``defaults``; ``SpecError`` with HiveD's message if it does not decode."""
    failed = _failed(text)
    decoder = _GoYaml()
    spec = decoder.decode(node, kind, defaults)
    if decoder.errors:
        raise SpecError(f"{failed}yaml: unmarshal errors:\n  " + "\n  ".join(decoder.errors))
    if not isinstance(spec, dict):  # a struct always decodes to a map
        raise SpecError(f"{failed}yaml: not a mapping")
    return spec


#: the keys of HiveD v2's request schema that v1 does not have
_V2_KEYS = frozenset({"cellType", "cellNumber", "podRootGroup"})


def _is_v2(node: yaml.Node | None) -> bool:
    """Whether the spec is HiveD v2's schema: ``version: v2`` and its keys. (HiveD master
    ignores ``version``: a spec of v1 keys is read as v1 whatever its version says.)"""
    if not isinstance(node, yaml.MappingNode):
        return False
    keys = {str(k.value): v for k, v in node.value if isinstance(k, yaml.ScalarNode)}
    version = keys.get("version")
    return (isinstance(version, yaml.ScalarNode) and _scalar_value(version) == "v2"
            and not _V2_KEYS.isdisjoint(keys))


# --------------------------------------------------------------------------- pods
def _metadata(pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, dict) else {}


_QUANTITY = re.compile(r"^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                       r"(?:[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$")


def _positive_quantity(raw: object) -> bool:
    """Whether a Kubernetes resource quantity (``1``, ``500m``, ``1Ki``) is above zero."""
    match = _QUANTITY.match(str(raw).strip())
    if match is None:
        return False
    try:
        return match.group(1) != "-" and Decimal(match.group(2)) > 0
    except InvalidOperation:
        return False


def hived_enabled(pod: dict[str, Any]) -> bool:
    """Whether a container or init container of ``pod`` asks for ``ENABLE_RESOURCE`` with a
    positive quantity (HiveD's ``IsHivedEnabled``)."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    for key in ("initContainers", "containers"):
        for container in (spec or {}).get(key) or []:
            if not isinstance(container, dict):
                continue
            limits = (container.get("resources") or {}).get("limits") or {}
            if isinstance(limits, dict) and _positive_quantity(limits.get(ENABLE_RESOURCE, 0)):
                return True
    return False


def pod_request(pod: dict[str, Any]) -> PodRequest:
    """The request in ``pod``'s scheduling spec annotation, read as HiveD reads it;
    ``SpecError`` with HiveD's message if HiveD would refuse it."""
    meta = _metadata(pod)
    namespace = str(meta.get("namespace") or "")
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    raw = (annotations or {}).get(SPEC_ANNOTATION)
    text = convert_old_annotation(raw if isinstance(raw, str) else "")
    if text == "":
        raise SpecError(_SPEC_ERROR + "Annotation does not exist or is empty")
    node = _compose(text)
    if _is_v2(node):
        return _v2_request(namespace, name, uid, text, node)
    spec = _decode_yaml(text, node, _SPEC_V1, {"ignoreK8sSuggestedNodes": True})
    group = spec["affinityGroup"]
    if group is None:
        group = {"name": f"{namespace}/{name}",
                 "members": [{"podNumber": 1, "leafCellNumber": spec["leafCellNumber"]}]}
    _check(spec, (spec["leafCellNumber"] <= 0, "LeafCellNumber is non-positive"),
           (group["name"] == "", "AffinityGroup.Name is empty"))
    merged: dict[int, int] = {}
    for member in group["members"] or []:
        if member["podNumber"] <= 0:
            raise SpecError(_SPEC_ERROR + "AffinityGroup.Members has non-positive PodNumber")
        if member["leafCellNumber"] <= 0:
            raise SpecError(_SPEC_ERROR
                            + "AffinityGroup.Members has non-positive LeafCellNumber")
        merged[member["leafCellNumber"]] = merged.get(member["leafCellNumber"], 0) + \
            member["podNumber"]
    if spec["leafCellNumber"] not in merged:
        raise SpecError(_SPEC_ERROR + "AffinityGroup.Members does not contains current Pod")
    return PodRequest(namespace, name, uid, _group_spec(
        group["name"], spec["virtualCluster"], spec["priority"], merged, spec["leafCellType"],
        spec["pinnedCellId"], spec["lazyPreemptionEnable"]),
        spec["leafCellNumber"], spec["ignoreK8sSuggestedNodes"])


def _check(spec: dict[str, Any], *more: tuple[bool, str]) -> None:
    """HiveD's checks of a spec, in its order: the VC, the priority's range, then ``more``
    (failed, message); ``SpecError`` with the first failure's message."""
    checks = (
        (spec["virtualCluster"] == "", "VirtualCluster is empty"),
        (spec["priority"] < OPPORTUNISTIC, f"Priority is less than {OPPORTUNISTIC}"),
        (spec["priority"] > MAX_PRIORITY, f"Priority is greater than {MAX_PRIORITY}"),
        *more,
    )
    for failed, message in checks:
        if failed:
            raise SpecError(_SPEC_ERROR + message)


def _group_spec(name: str, vc: str, priority: int, merged: dict[int, int], leaf_type: str,
                pinned: str, lazy: bool) -> GroupSpec:
    # HiveD merges members by leafCellNumber; biggest pods first, a canonical order
    return GroupSpec(
        name=name, vc=vc, priority=priority,
        members=tuple(Member(pods, size) for size, pods in sorted(merged.items(), reverse=True)),
        leaf_type=leaf_type, pinned=pinned, lazy=lazy)


def _v2_request(namespace: str, name: str, uid: str, text: str,
                node: yaml.Node | None) -> PodRequest:
    """A ``version: v2`` spec (HiveD's ``pkg/api/v2``: its defaults and ``Validate``), then
    flattened into members."""
    spec = _decode_yaml(text, node, _SPEC_V2)
    root = spec["podRootGroup"]
    if root is None:
        root = _GoYaml.zero(_GROUP_V2)
        root.update(name=f"{namespace}/{name}", pod={
            "podMinNumber": 1, "podMaxNumber": 1, "containsCurrentPod": True,
            "cellsPerPod": {"cellType": spec["cellType"], "cellNumber": spec["cellNumber"]}})
    _check(spec, (spec["cellNumber"] <= 0, "CellNumber is non-positive"),
           (root["name"] == "", "PodRootGroup.Name is empty"))
    pods: list[dict[str, Any]] = []  # every group's pod, breadth first (HiveD's Iterator)
    current: dict[str, Any] | None = None
    groups: list[dict[str, Any]] = [root]
    while groups:
        following: list[dict[str, Any]] = []
        for group in groups:
            if group is None:
                continue
            if group["pods"]:
                raise SpecError(_SPEC_ERROR
                                + "Do not support PodGroup.Pods field, please specify PodGroup.Pod")
            pod = group["pod"]
            if pod is not None:
                for field, what in (("podMinNumber", "PodMinNumber"),
                                    ("podMaxNumber", "PodMaxNumber")):
                    if pod[field] <= 0:
                        raise SpecError(f"{_SPEC_ERROR}PodGroup.Pod have non-positive {what}")
                if pod["cellsPerPod"]["cellNumber"] <= 0:
                    raise SpecError(_SPEC_ERROR
                                    + "PodGroup.Pod have non-positive CellsPerPod.CellNumber")
                if pod["containsCurrentPod"]:
                    if current is not None:
                        raise SpecError(_SPEC_ERROR
                                        + "PodGroup.Pod have multiple ContainsCurrentPod")
                    current = pod
                pods.append(pod)
            if group["withinOneCell"]:
                raise SpecError(f"withinOneCell ({group['withinOneCell']}) is not supported: "
                                "this store places a gang within one chain only")
            following.extend(group["childGroups"] or [])
        groups = following
    if current is None:
        raise SpecError(_SPEC_ERROR + "PodGroup.Pod does not contain current Pod")
    merged: dict[int, int] = {}
    types = {pod["cellsPerPod"]["cellType"] or spec["cellType"] for pod in pods}
    for pod in pods:
        if pod["podMinNumber"] != pod["podMaxNumber"]:
            raise SpecError(f"podMinNumber {pod['podMinNumber']} below podMaxNumber "
                            f"{pod['podMaxNumber']} is not supported: a gang is placed whole")
        size = pod["cellsPerPod"]["cellNumber"]
        merged[size] = merged.get(size, 0) + pod["podMaxNumber"]
    if len(types) > 1:
        raise SpecError("the pods of one group ask for several cell types "
                        f"({', '.join(sorted(types))}): a gang is placed in one cell type")
    group_spec = _group_spec(root["name"], spec["virtualCluster"], spec["priority"], merged,
                             types.pop(), spec["pinnedCellId"], spec["lazyPreemptionEnable"])
    return PodRequest(namespace, name, uid, group_spec, current["cellsPerPod"]["cellNumber"],
                      True)


# --------------------------------------------------------------------------- bind info
class _BindInfoDumper(yaml.SafeDumper):
    """yaml.v2's output for HiveD's bind info: block lists, empty strings as ``""``."""


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style='"' if not text else None)


_BindInfoDumper.add_representer(str, _represent_str)


def bind_info(group: dict[str, Any], slot: int) -> dict[str, Any]:
    """HiveD's ``PodBindInfo`` of the pod holding member pod ``slot`` of ``group`` (the
    store's group status: its ``chain``, ``pods``, ``members`` and ``preassigned`` types)."""
    pods: Sequence[Any] = group["pods"]
    preassigned: Sequence[Sequence[str]] = group["preassigned"]
    _, node, devices = pods[slot]
    members, start = [], 0
    for count, _ in group["members"]:
        members.append({"podPlacements": [
            {"physicalNode": str(pods[k][1]),
             "physicalLeafCellIndices": [int(d) for d in pods[k][2]],
             "preassignedCellTypes": [str(t) for t in preassigned[k]]}
            for k in range(start, start + int(count))]})
        start += int(count)
    return {"node": str(node), "leafCellIsolation": [int(d) for d in devices],
            "cellChain": str(group["chain"]), "affinityGroupBindInfo": members}


def bind_annotations(group: dict[str, Any], slot: int) -> dict[str, str]:
    """The annotations the Binding of the pod holding member pod ``slot`` of ``group`` carries:
    HiveD's two, and the fencing token on its own."""
    info = bind_info(group, slot)
    return {
        BIND_INFO_ANNOTATION: yaml.dump(info, Dumper=_BindInfoDumper, sort_keys=False,
                                        default_flow_style=False),
        ISOLATION_ANNOTATION: ",".join(str(d) for d in info["leafCellIsolation"]),
        FENCING_ANNOTATION: str(group["token"]),
    }


def slot_of_bound_pod(pod: dict[str, Any], placed: Placed) -> int | None:
    """The slot of ``placed`` a bound pod holds, from its bind info (node and devices; old
    key names read as HiveD reads them)."""
    text = (_metadata(pod).get("annotations") or {}).get(BIND_INFO_ANNOTATION)
    if not isinstance(text, str):
        return None
    try:
        info = yaml.load(convert_old_annotation(text), Loader=_LOADER)
        key = (str(info["node"]), tuple(int(d) for d in info["leafCellIsolation"]))
    except (yaml.YAMLError, KeyError, TypeError, ValueError):
        return None
    for slot, (_, node, devices) in enumerate(placed.pods):
        if (node, tuple(devices)) == key:
            return slot
    return None
