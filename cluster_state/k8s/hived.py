"""HiveD's Kubernetes surface: the pod scheduling spec annotation in, the bind annotations out.

* ``hivedscheduler.microsoft.com/pod-scheduling-spec`` (YAML, ``api.PodSchedulingSpec``):
  ``virtualCluster``, ``priority`` (-1 opportunistic, 0..1000 guaranteed), ``pinnedCellId``,
  ``leafCellType``, ``leafCellNumber`` (this pod's), ``affinityGroup {name, members:
  [{podNumber, leafCellNumber}]}`` (default: the pod alone, named ``namespace/name``),
  ``lazyPreemptionEnable``, ``ignoreK8sSuggestedNodes`` (default true). Members with the same
  ``leafCellNumber`` are merged, as HiveD does. The same validation as HiveD's: a missing VC,
  a priority out of range, a pinned cell with priority -1, a ``leafCellNumber`` that no member
  has are user errors (HTTP 400 from the extender).
* ``hivedscheduler.microsoft.com/pod-bind-info`` (YAML, ``api.PodBindInfo``): ``node``,
  ``leafCellIsolation``, ``cellChain`` and ``affinityGroupBindInfo`` (every member's pod
  placements: ``physicalNode``, ``physicalLeafCellIndices``, ``preassignedCellTypes``), plus
  ``fencingToken``: the store's fencing token of the allocation (its global log position),
  also written alone as ``FENCING_ANNOTATION`` so a node agent can refuse a stale binding.
* ``hivedscheduler.microsoft.com/pod-leaf-cell-isolation``: the pod's device indices,
  comma-separated (what goes into ``NVIDIA_VISIBLE_DEVICES``).

A pod is HiveD's only if a container asks for the resource ``ENABLE_RESOURCE`` (> 0).
"""

from __future__ import annotations

from dataclasses import dataclass
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


class SpecError(ValueError):
    """A pod whose scheduling spec is missing or invalid (HiveD's "User Error", HTTP 400)."""


@dataclass(frozen=True, slots=True)
class PodRequest:
    """One pod's request: its identity, its gang and its own leaf cell number."""

    namespace: str
    name: str
    uid: str
    spec: GroupSpec
    leaves: int  # this pod's leafCellNumber
    ignore_suggested: bool  # ignoreK8sSuggestedNodes


def _metadata(pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        raise SpecError("the pod has no metadata")
    return meta


def hived_enabled(pod: dict[str, Any]) -> bool:
    """Whether a container of ``pod`` asks for ``ENABLE_RESOURCE`` (HiveD's IsHivedEnabled)."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
    for container in (spec or {}).get("containers") or []:
        limits = ((container or {}).get("resources") or {}).get("limits") or {}
        try:
            if int(str(limits.get(ENABLE_RESOURCE, "0"))) > 0:
                return True
        except ValueError:
            continue
    return False


def _int(raw: object, what: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise SpecError(f"{what} must be an integer, not {raw!r}")
    return raw


def pod_request(pod: dict[str, Any]) -> PodRequest:
    """The request in ``pod``'s scheduling spec annotation; ``SpecError`` if it is invalid."""
    meta = _metadata(pod)
    namespace = str(meta.get("namespace") or "default")
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
    if not name:
        raise SpecError("the pod has no name")
    text = (meta.get("annotations") or {}).get(SPEC_ANNOTATION)
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"pod {namespace}/{name} has no annotation {SPEC_ANNOTATION}")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{SPEC_ANNOTATION} is not YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{SPEC_ANNOTATION} must be a mapping")
    vc = raw.get("virtualCluster")
    if not isinstance(vc, str) or not vc:
        raise SpecError("virtualCluster is required")
    priority = _int(raw.get("priority", 0), "priority")
    if not OPPORTUNISTIC <= priority <= MAX_PRIORITY:
        raise SpecError(f"priority must be in [{OPPORTUNISTIC}, {MAX_PRIORITY}], not {priority}")
    pinned = str(raw.get("pinnedCellId") or "")
    if pinned and priority == OPPORTUNISTIC:
        raise SpecError("an opportunistic pod (priority -1) may not ask for a pinned cell")
    leaf_type = str(raw.get("leafCellType") or "")
    leaves = _int(raw.get("leafCellNumber"), "leafCellNumber")
    if leaves <= 0:
        raise SpecError(f"leafCellNumber must be positive, not {leaves}")
    group = raw.get("affinityGroup")
    merged: dict[int, int] = {}
    if group is None:
        group_name = f"{namespace}/{name}"
        merged[leaves] = 1
    else:
        if not isinstance(group, dict):
            raise SpecError("affinityGroup must be a mapping")
        group_name = str(group.get("name") or "")
        if not group_name:
            raise SpecError("affinityGroup.name is required")
        members = group.get("members")
        if not isinstance(members, list) or not members:
            raise SpecError("affinityGroup.members must be a non-empty list")
        for member in members:
            if not isinstance(member, dict):
                raise SpecError("an affinityGroup member must be a mapping")
            pods = _int(member.get("podNumber"), "podNumber")
            size = _int(member.get("leafCellNumber"), "member leafCellNumber")
            if pods <= 0 or size <= 0:
                raise SpecError("podNumber and leafCellNumber must be positive")
            merged[size] = merged.get(size, 0) + pods
        if leaves not in merged:
            raise SpecError(
                f"leafCellNumber {leaves} is not the leafCellNumber of any affinityGroup member"
            )
    spec = GroupSpec(
        name=group_name, vc=vc, priority=priority,
        # HiveD merges members by leafCellNumber; biggest pods first, a canonical order
        members=tuple(Member(pods, size) for size, pods in sorted(merged.items(), reverse=True)),
        leaf_type=leaf_type, pinned=pinned, lazy=bool(raw.get("lazyPreemptionEnable", False)),
    )
    ignore = raw.get("ignoreK8sSuggestedNodes", True)
    return PodRequest(namespace, name, uid, spec, leaves, bool(ignore))


def bind_annotations(spec: GroupSpec, placed: Placed, slot: int) -> dict[str, str]:
    """The annotations the Binding of the pod in ``slot`` of ``placed`` carries."""
    _, node, devices = placed.pods[slot]
    preassigned = "" if spec.priority == OPPORTUNISTIC else placed.chain
    members = []
    start = 0
    for member in spec.members:
        pods = placed.pods[start:start + member.pods]
        start += member.pods
        members.append({"podPlacements": [
            {"physicalNode": pod_node, "physicalLeafCellIndices": list(pod_devices),
             "preassignedCellTypes": [preassigned] * len(pod_devices)}
            for _, pod_node, pod_devices in pods
        ]})
    info = {
        "node": node,
        "leafCellIsolation": list(devices),
        "cellChain": placed.chain,
        "affinityGroupBindInfo": members,
        "fencingToken": placed.token,
    }
    return {
        BIND_INFO_ANNOTATION: yaml.safe_dump(info, sort_keys=False),
        ISOLATION_ANNOTATION: ",".join(str(d) for d in devices),
        FENCING_ANNOTATION: str(placed.token),
    }


def slot_of_bound_pod(pod: dict[str, Any], placed: Placed) -> int | None:
    """The slot of ``placed`` a bound pod holds, from its bind info (node and devices)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(BIND_INFO_ANNOTATION)
    if not isinstance(text, str):
        return None
    try:
        info = yaml.safe_load(text)
        key = (str(info["node"]), tuple(int(d) for d in info["leafCellIsolation"]))
    except (yaml.YAMLError, KeyError, TypeError, ValueError):
        return None
    for slot, (_, node, devices) in enumerate(placed.pods):
        if (node, tuple(devices)) == key:
            return slot
    return None
