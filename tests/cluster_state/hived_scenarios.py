"""HiveD's own unit scenarios (``TestHivedAlgorithm`` in HiveD's
``pkg/algorithm/hived_algorithm_test.go``, master ``66f26ac``) replayed against the store, each
judged against what HiveD's test expects.

HiveD's test drives its algorithm pod by pod: ``Schedule(pod, suggestedNodes, phase)``,
``AddAllocatedPod``, ``DeleteAllocatedPod``, ``DeleteUnallocatedPod`` and node health. The
store works on whole groups (affinity groups), so ``Replay`` maps those calls onto it as the
extender does: a pod's spec is parsed from its annotation by the extender's own parser
(``pod_request``); HiveD's filtering phase is the store's dry run (``plan_submit``), its
preempting phase ``submit``; a first pod whose plan needs no victims is not placed until the
pod is added as allocated (HiveD's ``Schedule`` changes nothing then either); a pod of a
placed group takes the next member pod of its size; a group is released when its last
allocated pod is deleted, a preempting one when its last preempting pod is.

Every check is one of:

* ``match`` — the store answers what HiveD's test expects;
* ``equivalent`` — the same kind of answer with another placement of the same shape (the
  same number of leaves under a lowest common ancestor of the same cell type);
* ``differ`` — another answer;
* ``unsupported`` — the store takes no input the scenario depends on (suggested nodes, on a
  build without them) and answers otherwise.

The design configuration, the pod specs and the expectations below are HiveD's test data
(``example/config/design/hivedscheduler.yaml``, ``pss``, ``expectedBindInfos``, ...), written
out here; the scenario numbering is this file's own.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import yaml
from cs_helpers import Driver, check_invariants

from cluster_state import ClusterStore, GpuConfigError, ops, parse_config
from cluster_state.k8s.hived import SPEC_ANNOTATION, SpecError, pod_request

__all__ = ["CHECKS", "Check", "Replay", "run_all", "tally"]

MATCH, EQUIVALENT, DIFFER, UNSUPPORTED = "match", "equivalent", "differ", "unsupported"
FILTERING, PREEMPTING = "filtering", "preempting"

#: whether this build's store takes suggested nodes (``ops.submit(..., suggested=...)``)
SUGGESTED = "suggested" in inspect.signature(ops.submit).parameters

# HiveD's design configuration: CPU-like CT1 nodes, a rack of three DGX-1 P100 nodes (one of
# them also a CT1 node), DGX-2 nodes alone, in a rack of three and in two racks of four with
# a forged 2/4/8-GPU hierarchy, and a pinned IB pair.
DESIGN = """
physicalCluster:
  cellTypes:
    CT1-NODE: {childCellType: CT1, childCellNumber: 2, isNodeLevel: true}
    DGX1-P100-PCI-SWITCH: {childCellType: DGX1-P100, childCellNumber: 2}
    DGX1-P100-CPU-SOCKET: {childCellType: DGX1-P100-PCI-SWITCH, childCellNumber: 2}
    DGX1-P100-NODE: {childCellType: DGX1-P100-CPU-SOCKET, childCellNumber: 2, isNodeLevel: true}
    3-DGX1-P100-NODE: {childCellType: DGX1-P100-NODE, childCellNumber: 3}
    DGX1-V100-PCI-SWITCH: {childCellType: DGX1-V100, childCellNumber: 2}
    DGX1-V100-CPU-SOCKET: {childCellType: DGX1-V100-PCI-SWITCH, childCellNumber: 2}
    DGX1-V100-NODE: {childCellType: DGX1-V100-CPU-SOCKET, childCellNumber: 2, isNodeLevel: true}
    2-DGX1-V100-NODE: {childCellType: DGX1-V100-NODE, childCellNumber: 2}
    DGX2-V100-NODE-2-GPU: {childCellType: DGX2-V100, childCellNumber: 2}
    DGX2-V100-NODE-4-GPU: {childCellType: DGX2-V100-NODE-2-GPU, childCellNumber: 2}
    DGX2-V100-NODE-8-GPU: {childCellType: DGX2-V100-NODE-4-GPU, childCellNumber: 2}
    DGX2-V100-NODE: {childCellType: DGX2-V100-NODE-8-GPU, childCellNumber: 2, isNodeLevel: true}
    2-DGX2-V100-NODE: {childCellType: DGX2-V100-NODE, childCellNumber: 2}
    3-DGX2-V100-NODE: {childCellType: DGX2-V100-NODE, childCellNumber: 3}
    4-DGX2-V100-NODE: {childCellType: 2-DGX2-V100-NODE, childCellNumber: 2}
    IB-DGX2-V100-NODE-2-GPU: {childCellType: IB-DGX2-V100-V100, childCellNumber: 2}
    IB-DGX2-V100-NODE-4-GPU: {childCellType: IB-DGX2-V100-NODE-2-GPU, childCellNumber: 2}
    IB-DGX2-V100-NODE-8-GPU: {childCellType: IB-DGX2-V100-NODE-4-GPU, childCellNumber: 2}
    IB-DGX2-V100-NODE: {childCellType: IB-DGX2-V100-NODE-8-GPU, childCellNumber: 2,
                        isNodeLevel: true}
    2-IB-DGX2-V100-NODE: {childCellType: IB-DGX2-V100-NODE, childCellNumber: 2}
  physicalCells:
  - {cellType: CT1-NODE, cellAddress: 0.0.0.0}
  - {cellType: CT1-NODE, cellAddress: 0.0.0.1}
  - cellType: CT1-NODE
    cellAddress: 1.0.0.2
    cellChildren: [{cellAddress: 8, pinnedCellId: VC1-YQW-CT1}, {cellAddress: 9}]
  - cellType: 3-DGX1-P100-NODE
    cellChildren:
    - {cellAddress: 1.0.0.2}
    - cellAddress: 1.0.0.1
      cellChildren:
      - cellAddress: 0
        cellChildren:
        - {cellAddress: 0, cellChildren: [{cellAddress: 0}, {cellAddress: 1}]}
        - {cellAddress: 1, cellChildren: [{cellAddress: 2}, {cellAddress: 3}]}
      - cellAddress: 1
        cellChildren:
        - {cellAddress: 2, cellChildren: [{cellAddress: 4}, {cellAddress: 5}]}
        - {cellAddress: 3, cellChildren: [{cellAddress: 6}, {cellAddress: 7}]}
    - cellAddress: 1.0.0.0
      cellChildren:
      - cellAddress: 1
        cellChildren:
        - {cellAddress: 1, cellChildren: [{cellAddress: 1}, {cellAddress: 3}]}
        - {cellAddress: 0, cellChildren: [{cellAddress: 4}, {cellAddress: 7}]}
      - cellAddress: 0
        cellChildren:
        - {cellAddress: 1, cellChildren: [{cellAddress: 0}, {cellAddress: 2}]}
        - {cellAddress: 0, cellChildren: [{cellAddress: 6}, {cellAddress: 5}]}
  - {cellType: DGX2-V100-NODE, cellAddress: 0.0.1.0}
  - {cellType: DGX2-V100-NODE, cellAddress: 0.0.5.0}
  - cellType: 3-DGX2-V100-NODE
    cellChildren: [{cellAddress: 0.0.2.0}, {cellAddress: 0.0.2.1}, {cellAddress: 0.0.2.2}]
  - cellType: 4-DGX2-V100-NODE
    cellChildren:
    - pinnedCellId: VC1-YQW-DGX2
      cellChildren: [{cellAddress: 0.0.3.0}, {cellAddress: 0.0.3.1}]
    - cellChildren: [{cellAddress: 0.0.3.2}, {cellAddress: 0.0.3.3}]
  - cellType: 4-DGX2-V100-NODE
    cellChildren:
    - cellChildren: [{cellAddress: 0.0.4.0}, {cellAddress: 0.0.4.1}]
    - cellChildren: [{cellAddress: 0.0.4.2}, {cellAddress: 0.0.4.3}]
  - cellType: 2-IB-DGX2-V100-NODE
    pinnedCellId: VC1-YQW-IB-DGX2
    cellChildren: [{cellAddress: 0.1.0.0}, {cellAddress: 0.1.0.1}]
virtualClusters:
  VC1:
    virtualCells:
    - {cellType: 4-DGX2-V100-NODE.2-DGX2-V100-NODE.DGX2-V100-NODE, cellNumber: 2}
    - {cellType: 3-DGX2-V100-NODE.DGX2-V100-NODE, cellNumber: 2}
    - {cellType: DGX2-V100-NODE, cellNumber: 2}
    - {cellType: 4-DGX2-V100-NODE.2-DGX2-V100-NODE, cellNumber: 1}
    pinnedCells:
    - {pinnedCellId: VC1-YQW-CT1}
    - {pinnedCellId: VC1-YQW-DGX2}
    - {pinnedCellId: VC1-YQW-IB-DGX2}
  VC2:
    virtualCells:
    - {cellType: 3-DGX1-P100-NODE.DGX1-P100-NODE, cellNumber: 2}
    - {cellType: 3-DGX1-P100-NODE.DGX1-P100-NODE.DGX1-P100-CPU-SOCKET, cellNumber: 2}
    - {cellType: CT1-NODE, cellNumber: 1}
"""

#: group -> members [(podNumber, leafCellNumber)]
GROUPS: dict[str, list[tuple[int, int]]] = {
    **{f"group{i}": [(1, 1)] for i in (1, 2, 4, 6, 10)},
    "group3": [(1, 8)], "group8": [(1, 8)], "group7": [(3, 8)],
    "group9": [(1, 7), (1, 5)],
    **{f"group{i}": [(2, 16)] for i in (5, 11, 12, 13, 14, 18, 19, 24, 26, 27)},
    **{f"group{i}": [(1, 2)] for i in (15, 16, 17)},
    **{f"group{i}": [(1, 16)] for i in (20, 21, 22, 23, 25, 28, 30, 31, 32, 33, 34)},
    "group29": [(4, 16)],
}

_DGX2, _PIN = "DGX2-V100", "VC1-YQW-DGX2"
#: pod -> (vc, priority, lazyPreemptionEnable, pinnedCellId, leafCellType, leafCellNumber,
#: group); every pod sets ignoreK8sSuggestedNodes false (Go's zero value in HiveD's test)
PODS: dict[str, tuple[str, int, bool, str, str, int, str]] = {
    "pod1": ("VC1", 0, True, "", _DGX2, 1, "group1"),
    "pod2": ("VC1", 1, True, "", _DGX2, 1, "group2"),  # buddy of pod1
    "pod3": ("VC1", 2, True, "", _DGX2, 8, "group3"),  # not pod1/2's buddy (no preemption)
    "pod4": ("VC1", -1, True, "", _DGX2, 1, "group4"),  # opportunistic: away from guaranteed
    "pod5": ("VC1", 1, True, _PIN, _DGX2, 16, "group5"),
    "pod6": ("VC1", 1, True, _PIN, _DGX2, 16, "group5"),
    "pod7": ("VC2", 1, True, "", "DGX1-P100", 8, "group7"),  # more than the VC holds: waits
    "pod8": ("VC2", 1, True, "", "", 7, "group9"),  # any leaf type, mixed gang
    "pod9": ("VC2", 1, True, "", "", 5, "group9"),
    "pod10": ("VC2", 1, True, "", _DGX2, 1, "group6"),  # a type the VC lacks: user error
    "pod11": ("VC2", 1, True, "", "DGX1-P100", 2, "group8"),  # no member of 2: user error
    "pod12": ("VC2", 1, True, "", "DGX1-P100", 2, "group8"),
    "pod13": ("surprise!", 1, True, "", "DGX1-P100", 1, "group10"),  # unknown VC
    "pod14": ("VC2", 1, True, "surprise!", "DGX1-P100", 1, "group10"),  # unknown pinned cell
    "pod15": ("VC2", 1001, True, "", "DGX1-P100", 1, "group10"),  # priority out of range
    "pod16": ("VC1", 2, True, _PIN, _DGX2, 16, "group11"),  # preempts group5
    "pod17": ("VC1", 2, True, _PIN, _DGX2, 16, "group11"),
    "pod18": ("VC1", 1, True, "", _DGX2, 16, "group12"),
    "pod19": ("VC1", 1, True, "", _DGX2, 16, "group12"),
    "pod20": ("VC1", 1, True, "", _DGX2, 16, "group13"),
    "pod21": ("VC1", 1, True, "", _DGX2, 16, "group13"),
    "pod22": ("VC1", -1, True, "", _DGX2, 16, "group14"),
    "pod23": ("VC1", -1, True, "", _DGX2, 16, "group14"),
    "pod24": ("VC2", 0, True, "", "CT1", 2, "group15"),
    "pod25": ("VC2", 1, False, "", "CT1", 2, "group16"),  # lazily preempts group15
    "pod27": ("VC1", 1, False, _PIN, _DGX2, 16, "group18"),
    "pod28": ("VC1", 1, False, _PIN, _DGX2, 16, "group19"),
    "pod29": ("VC1", 2, True, _PIN, _DGX2, 16, "group20"),
    "pod30": ("VC1", 1, True, _PIN, _DGX2, 16, "group21"),
    "pod31": ("VC1", 2, True, _PIN, _DGX2, 16, "group22"),
    "pod32": ("VC1", 2, True, _PIN, _DGX2, 16, "group23"),
    "pod33": ("VC1", 3, True, _PIN, _DGX2, 16, "group24"),
    "pod34": ("VC1", 4, False, _PIN, _DGX2, 16, "group25"),
    "pod35": ("VC1", 5, True, _PIN, _DGX2, 16, "group26"),
    "pod36": ("VC1", -1, True, "", "", 1, "group1"),
    "pod37": ("VC1", 1, True, _PIN, _DGX2, 1, "group1"),
    "pod38": ("VC1", 1, True, _PIN, _DGX2, 1, "group2"),
    "pod39": ("VC1", 1, True, "", _DGX2, 16, "group27"),
    "pod40": ("VC1", 1, True, "", _DGX2, 16, "group28"),
    "pod41": ("VC1", 2, True, "", _DGX2, 16, "group29"),
    "pod42": ("VC1", 0, True, "", _DGX2, 16, "group30"),
    "pod43": ("VC2", 0, True, "", _DGX2, 16, "group31"),
    "pod44": ("VC1", 0, True, "", _DGX2, 16, "group32"),
    "pod45": ("VC1", 0, True, "", _DGX2, 16, "group33"),
    "pod46": ("VC1", 0, True, "", _DGX2, 16, "group34"),
}

_ALL16 = tuple(range(16))
#: what HiveD's test expects a pod's Schedule to bind: (node, devices)
BINDS: dict[str, tuple[str, tuple[int, ...]]] = {
    "pod1": ("0.0.1.0", (0,)), "pod2": ("0.0.1.0", (1,)),
    "pod3": ("0.0.1.0", tuple(range(8, 16))), "pod4": ("0.0.5.0", (0,)),
    "pod5": ("0.0.3.0", _ALL16), "pod6": ("0.0.3.1", _ALL16),
    "pod8": ("1.0.0.0", (1, 3, 4, 7, 0, 2, 6)), "pod9": ("1.0.0.2", (0, 1, 2, 3, 4)),
    "pod18": ("0.0.3.2", _ALL16), "pod19": ("0.0.3.3", _ALL16),
    "pod20": ("0.0.4.0", _ALL16), "pod21": ("0.0.4.1", _ALL16),
    "pod22": ("0.0.4.2", _ALL16), "pod23": ("0.0.4.3", _ALL16),
    "pod24": ("0.0.0.1", (0, 1)), "pod25": ("0.0.0.0", (0, 1)),
    "pod28": ("0.0.3.0", _ALL16), "pod34": ("0.0.3.0", _ALL16),
    "pod36": ("0.0.1.0", (0,)), "pod37": ("0.0.3.0", (0,)), "pod38": ("0.0.3.1", (0,)),
    "pod39": ("0.0.3.2", _ALL16), "pod40": ("0.0.4.3", _ALL16),
    "pod44": ("0.0.3.2", _ALL16), "pod45": ("0.0.4.2", _ALL16),
}
#: the victims HiveD's test allows a pod's Schedule to name (it checks a subset)
VICTIMS: dict[str, frozenset[str]] = {
    "pod16": frozenset({"pod5", "pod6"}), "pod17": frozenset({"pod5", "pod6"}),
    "pod29": frozenset({"pod28"}), "pod31": frozenset({"pod28"}),
    "pod33": frozenset({"pod28"}), "pod35": frozenset({"pod34"}),
}


def design() -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(DESIGN)
    return raw


def text_of(raw: dict[str, Any]) -> str:
    return yaml.safe_dump(raw, sort_keys=False)


def pod_object(name: str) -> dict[str, Any]:
    vc, priority, lazy, pinned, leaf_type, leaves, group = PODS[name]
    spec = {"virtualCluster": vc, "priority": priority, "lazyPreemptionEnable": lazy,
            "pinnedCellId": pinned, "leafCellType": leaf_type, "leafCellNumber": leaves,
            "affinityGroup": {"name": group, "members": [
                {"podNumber": p, "leafCellNumber": n} for p, n in GROUPS[group]]},
            "ignoreK8sSuggestedNodes": False}
    return {"metadata": {"name": name, "namespace": "test", "uid": name,
                         "annotations": {SPEC_ANNOTATION: yaml.safe_dump(spec)}}}


# --------------------------------------------------------------------------- outcomes


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a pod's Schedule answered: ``bind`` (node, devices), ``preempt`` (victim pods),
    ``wait`` or ``error`` (a user error)."""

    kind: str
    node: str = ""
    devices: tuple[int, ...] = ()
    victims: frozenset[str] = frozenset()
    reason: str = ""
    slot: int = -1


@dataclass(frozen=True, slots=True)
class Check:
    id: str
    what: str
    verdict: str
    detail: str = ""


@dataclass
class Replay:
    """One HiveD algorithm instance, played on a store (see the module documentation)."""

    text: str
    driver: Driver = field(init=False)
    all_nodes: tuple[str, ...] = field(init=False)
    #: group -> member pod slot -> the allocated pod holding it
    allocated: dict[str, dict[int, str]] = field(default_factory=dict)
    #: group -> the pods that scheduled it in the preempting phase while it preempts
    preempting: dict[str, set[str]] = field(default_factory=dict)
    #: pod -> the suggested nodes of its last Schedule, for the submit that allocates it
    last_suggested: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: set when a Schedule passed suggested nodes this build's store cannot take
    dropped_suggestion: bool = False

    def __post_init__(self) -> None:
        self.driver = Driver(ClusterStore(parse_config(self.text)))
        self.all_nodes = tuple(sorted(self.driver.store.topology.nodes))

    # ------------------------------------------------------------------ the store
    def _suggest(self, suggested: Sequence[str] | None) -> dict[str, Any]:
        if suggested is None:
            return {}
        if SUGGESTED:
            return {"suggested": list(suggested)}
        if set(self.all_nodes) - set(suggested):
            self.dropped_suggestion = True
        return {}

    def _op(self, build: Callable[..., bytes], spec: ops.GroupSpec,
            suggested: Sequence[str] | None) -> bytes:
        return build(spec.name, spec.vc, spec.priority, spec.members, leaf_type=spec.leaf_type,
                     pinned=spec.pinned, lazy=spec.lazy, **self._suggest(suggested))

    def apply(self, op: bytes) -> list[Any]:
        """Apply ``op``; the store's invariants hold afterwards (``check_invariants``)."""
        result = self.driver.apply(op)
        check_invariants(self.driver.store.allocator)
        return result

    def submit(self, spec: ops.GroupSpec, suggested: Sequence[str] | None) -> ops.Result:
        return ops.decode_result(msgpack.packb(self.apply(self._op(ops.submit, spec,
                                                                   suggested))))

    def plan(self, spec: ops.GroupSpec, suggested: Sequence[str] | None) -> ops.Result:
        answer = self.driver.query(self._op(ops.plan_submit, spec, suggested))
        if answer[0] == "error":
            return ops.Error(answer[1])
        return ops.decode_result(msgpack.packb(answer[2]))

    def group(self, name: str) -> dict[str, Any] | None:
        info: dict[str, Any] | None = self.driver.query(ops.get_group(name))[2]
        return info

    def release(self, group: str) -> None:
        self.apply(ops.release(group))
        self.allocated.pop(group, None)
        self.preempting.pop(group, None)

    def node_health(self, node: str, healthy: bool) -> None:
        self.apply(ops.set_node_health(node, healthy))

    def vc_cells(self, vc: str, chain: str, level: int) -> list[dict[str, Any]]:
        tree = self.driver.query(ops.inspect("vc", vc))[2]
        return [c for c in tree["cells"] if c["chain"] == chain and c["level"] == level]

    # ------------------------------------------------------------------ HiveD's calls
    def schedule(self, pod: str, suggested: Sequence[str] | None = None,
                 phase: str = PREEMPTING) -> Outcome:
        """HiveD's ``Schedule(pod, suggested, phase)``; ``suggested`` None: every node."""
        try:
            request = pod_request(pod_object(pod))
        except SpecError as exc:
            return Outcome("error", reason=str(exc))
        spec = request.spec
        suggested = self.all_nodes if suggested is None else tuple(suggested)
        self.last_suggested[pod] = suggested
        exists = self.group(spec.name) is not None
        if phase == FILTERING or not exists:
            result = self.plan(spec, suggested)
            if phase == PREEMPTING and isinstance(result, ops.Preempting):
                result = self.submit(spec, suggested)  # the preemption state is created
        else:
            result = self.submit(spec, suggested)
        match result:
            case ops.Error(reason):
                return Outcome("error", reason=reason)
            case ops.Waiting(_, reason):
                return Outcome("wait", reason=reason)
            case ops.Preempting(group, victims):
                if phase == PREEMPTING:
                    self.preempting.setdefault(group, set()).add(pod)
                return Outcome("preempt", victims=frozenset(
                    p for v in victims for p in self.allocated.get(v, {}).values()))
            case ops.Placed(group, _, pods, _):
                held = self.allocated.get(group, {})
                free = [i for i, p in enumerate(pods) if p.leaves == request.leaves
                        and i not in held]
                if not free:
                    return Outcome("error", reason="more pods than the group declares")
                _, node, devices = pods[free[0]]
                return Outcome("bind", node, tuple(devices), slot=free[0])
        raise AssertionError(f"unexpected result {result!r}")

    def add_allocated(self, pod: str, outcome: Outcome) -> None:
        """HiveD's ``AddAllocatedPod`` of a pod bound as ``outcome`` says."""
        assert outcome.kind == "bind", outcome
        spec = pod_request(pod_object(pod)).spec
        info = self.group(spec.name)
        if info is None or info["state"] != "placed":
            placed = self.submit(spec, self.last_suggested.get(pod))
            assert isinstance(placed, ops.Placed), placed
            assert (placed.pods[outcome.slot][1:] == (outcome.node, outcome.devices)), (
                "the placement changed between Schedule and AddAllocatedPod")
        self.allocated.setdefault(spec.name, {})[outcome.slot] = pod
        self.preempting.pop(spec.name, None)

    def delete_allocated(self, pod: str) -> None:
        group = PODS[pod][6]
        held = self.allocated.get(group, {})
        for slot in [s for s, p in held.items() if p == pod]:
            del held[slot]
        if not held and self.group(group) is not None:
            self.release(group)

    def delete_unallocated(self, pod: str) -> None:
        group = PODS[pod][6]
        pods = self.preempting.get(group, set())
        pods.discard(pod)
        info = self.group(group)
        if not pods and info is not None and info["state"] != "placed":
            self.release(group)


# --------------------------------------------------------------------------- judging


def _leaves(replay: Replay, node: str, devices: Iterable[int]) -> list[int] | None:
    topo = replay.driver.store.topology
    for n in topo.nodes.get(node, ()):
        found = [topo.device_leaf.get((n, d), -1) for d in devices]
        if all(leaf >= 0 for leaf in found):
            return found
    return None


def _shape(replay: Replay, node: str, devices: Sequence[int]) -> str:
    """The cell type of the lowest common ancestor of a pod's leaves, with their count."""
    topo = replay.driver.store.topology
    leaves = _leaves(replay, node, devices)
    if not leaves:
        return "?"
    common = set(topo.ancestors[leaves[0]])
    for leaf in leaves[1:]:
        common &= set(topo.ancestors[leaf])
    lca = min(common, key=lambda c: topo.level[c])
    return f"{len(leaves)}@{topo.cell_type[lca]}"


def judge(replay: Replay, pod: str, outcome: Outcome) -> tuple[str, str]:
    """The verdict on ``outcome`` of ``pod``'s Schedule against HiveD's expectation."""
    detail = f"{outcome.kind} {outcome.node} {list(outcome.devices)}".strip()
    if outcome.kind == "preempt":
        detail = f"preempt {sorted(outcome.victims)}"
    if outcome.kind in ("wait", "error"):
        detail = f"{outcome.kind}: {outcome.reason}"
    if pod in BINDS:
        node, devices = BINDS[pod]
        if outcome.kind != "bind":
            return DIFFER, f"{detail} (HiveD: bind {node} {list(devices)})"
        if (outcome.node, sorted(outcome.devices)) == (node, sorted(devices)):
            return MATCH, detail
        same = _shape(replay, node, devices) == _shape(replay, outcome.node, outcome.devices)
        return (EQUIVALENT if same else DIFFER), f"{detail} (HiveD: {node} {list(devices)})"
    if outcome.kind == "bind":
        return DIFFER, f"{detail} (HiveD: no binding)"
    if pod in VICTIMS:
        ok = outcome.kind == "preempt" and outcome.victims and outcome.victims <= VICTIMS[pod]
        return (MATCH if ok else DIFFER), f"{detail} (HiveD: preempt {sorted(VICTIMS[pod])})"
    return (MATCH if outcome.kind == "wait" else DIFFER), f"{detail} (HiveD: waits)"


class Recorder:
    """Collects the checks of one scenario family, with the suggestion caveat applied."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self.checks: list[Check] = []

    def add(self, id_: str, what: str, verdict: str, detail: str = "") -> None:
        if self.replay.dropped_suggestion and verdict != MATCH:
            verdict = UNSUPPORTED
        self.replay.dropped_suggestion = False
        self.checks.append(Check(id_, what, verdict, detail))

    def expect(self, id_: str, what: str, ok: bool, detail: str = "") -> None:
        self.add(id_, what, MATCH if ok else DIFFER, detail)

    def schedule(self, id_: str, pod: str, suggested: Sequence[str] | None = None,
                 phase: str = PREEMPTING) -> Outcome:
        outcome = self.replay.schedule(pod, suggested, phase)
        verdict, detail = judge(self.replay, pod, outcome)
        self.add(id_, f"{pod}: Schedule ({phase})", verdict, detail)
        return outcome


# --------------------------------------------------------------------------- scenarios

SUCCEED = ("pod1", "pod2", "pod3", "pod4", "pod5", "pod6", "pod7", "pod8", "pod9", "pod16",
           "pod17", "pod18", "pod19", "pod20", "pod21", "pod22", "pod23", "pod24", "pod25")
FAIL = (("pod10",), ("pod11", "pod12"), ("pod13",), ("pod14",), ("pod15",))


#: pods whose placement lazily preempts a group on another node: the VC cell they take is on
#: the node they do not bind to, so their nodes alone cannot be suggested
_LAZY_PREEMPTORS = ("pod25",)


def _succeed(rec: Recorder, prefix: str, *,
             as_hived: bool = False) -> tuple[list[str], list[str]]:
    """HiveD's testCasesThatShouldSucceed: (allocated pods, preempting pods). ``as_hived``:
    each pod HiveD binds is scheduled with HiveD's node as the only suggested one, so the
    store ends where HiveD's test does (the chain HiveD tries first for a leaf type is a
    Go map's order, which HiveD's test sorts; the store's is sorted by name)."""
    allocated, preempting = [], []
    for i, pod in enumerate(SUCCEED, start=1):
        group = PODS[pod][6]
        suggested = None
        if as_hived and pod in BINDS and pod not in _LAZY_PREEMPTORS:
            suggested = sorted({BINDS[p][0] for p in SUCCEED if PODS[p][6] == group
                                and p in BINDS})
        outcome = rec.schedule(f"{prefix}{i}", pod, suggested)
        if outcome.kind == "bind":
            rec.replay.add_allocated(pod, outcome)
            allocated.append(pod)
        elif outcome.kind == "preempt":
            preempting.append(pod)
    return allocated, preempting


def _delete_all(rec: Recorder, id_: str, allocated: list[str], preempting: list[str]) -> None:
    """HiveD's testDeletePods: every group is gone afterwards."""
    replay = rec.replay
    for pod in reversed(allocated):
        replay.delete_allocated(pod)
    left = sorted({PODS[p][6] for p in allocated if replay.group(PODS[p][6]) is not None})
    rec.expect(f"{id_}a", "deleting the allocated pods deletes their groups", not left,
               f"left: {left}")
    for pod in reversed(preempting):
        replay.delete_unallocated(pod)
    left = sorted({PODS[p][6] for p in preempting if replay.group(PODS[p][6]) is not None})
    rec.expect(f"{id_}b", "deleting the preempting pods cancels their groups", not left,
               f"left: {left}")


def normal_operations() -> list[Check]:
    """testNormalOperations: the pods that succeed, those that are user errors, deletes."""
    rec = Recorder(Replay(text_of(design())))
    allocated, preempting = _succeed(rec, "N")
    for i, pods in enumerate(FAIL, start=1):
        outcomes = []
        for pod in pods:
            outcome = rec.replay.schedule(pod)
            outcomes.append(outcome)
            if outcome.kind == "error":
                break
            if outcome.kind == "bind":
                rec.replay.add_allocated(pod, outcome)
                allocated.append(pod)
        last = outcomes[-1]
        rec.expect(f"F{i}", f"{'+'.join(pods)}: a user error", last.kind == "error",
                   f"{last.kind}: {last.reason}")
    _delete_all(rec, "D", allocated, preempting)
    return rec.checks


def suggested_nodes() -> list[Check]:
    """testSuggestedNodes: placement inside the suggested nodes, other leaf types, the
    preempting phase only, a preemption cancelled when its nodes leave the suggested set,
    backtracking buddy allocation and a reverted lazy preemption."""
    rec = Recorder(Replay(text_of(design())))
    replay = rec.replay
    rec.schedule("S1", "pod36", ["0.0.1.0"])
    held = rec.schedule("S2", "pod37", ["0.0.3.0"])
    if held.kind == "bind":
        replay.add_allocated("pod37", held)
    rec.schedule("S3", "pod38", ["0.0.3.1"])
    replay.delete_allocated("pod37")
    nodes = [n for n in replay.all_nodes if n != "0.0.3.1"]
    first = replay.schedule("pod27", nodes)
    nodes.append("0.0.3.1")
    second = replay.schedule("pod27", nodes)
    rec.add("S4", "pod27: waits while a node of its pinned cell is not suggested, then binds",
            MATCH if (first.kind, second.kind) == ("wait", "bind") else DIFFER,
            f"{first.kind}, then {second.kind}")
    if second.kind == "bind":
        replay.add_allocated("pod27", second)
    replay.schedule("pod33", nodes, FILTERING)
    rec.expect("S5", "pod33 in the filtering phase creates no preemption",
               replay.group("group24") is None)
    replay.schedule("pod33", nodes[:-1])
    rec.expect("S6", "pod33 preempts nothing with a placement outside the suggested nodes",
               replay.group("group24") is None)
    replay.schedule("pod33", nodes)
    info = replay.group("group24")
    rec.expect("S7", "pod33 preempts in the preempting phase",
               info is not None and info["state"] == "preempting", str(info and info["state"]))
    replay.schedule("pod33", nodes[:-1])
    rec.expect("S8", "pod33's preemption is cancelled when its nodes leave the suggested set",
               replay.group("group24") is None)

    # backtracking buddy allocation: VC1's three 2-node cells of one 4-node chain
    raw = design()
    cells = raw["virtualClusters"]["VC1"]["virtualCells"]
    cells[0]["cellNumber"], cells[3]["cellNumber"] = 0, 3
    rec.replay = replay = Replay(text_of(raw))
    for id_, pod, suggested in (("S9", "pod39", ["0.0.3.2", "0.0.3.3"]),
                                ("S10", "pod40", ["0.0.4.3"])):
        outcome = rec.schedule(id_, pod, suggested)
        if outcome.kind == "bind":
            replay.add_allocated(pod, outcome)
    replay.schedule("pod41", ["0.0.3.2", "0.0.3.3", "0.0.4.3"])
    states = {g: replay.group(g) for g in ("group27", "group28")}
    ok = all(i is not None and i["state"] == "placed" and not i["downgraded"]
             for i in states.values())
    rec.expect("S11", "pod41's lazy preemption of group27 and group28 is reverted", ok,
               str({g: i and (i["state"], i["downgraded"]) for g, i in states.items()}))
    return rec.checks


def stateful_preemption() -> list[Check]:
    """testStatefulPreemption: preemptors reserve, cancel lower ones, are cancelled."""
    rec = Recorder(Replay(text_of(design())))
    replay = rec.replay
    allocated: list[str] = []
    for i, pod in enumerate(("pod28", "pod29", "pod30", "pod31", "pod32", "pod33", "pod34",
                             "pod35"), start=1):
        outcome = rec.schedule(f"P{i}", pod)
        if outcome.kind == "bind":
            replay.add_allocated(pod, outcome)
            allocated.append(pod)
        if pod == "pod31":
            nodes = {g: {p[1] for p in (replay.group(g) or {}).get("pods", [])}
                     for g in ("group20", "group22")}
            rec.expect("P4b", "pod31 reserves another node than pod29",
                       bool(nodes["group20"]) and nodes["group20"].isdisjoint(nodes["group22"]),
                       str(nodes))
        if pod == "pod33":
            gone = [g for g in ("group20", "group22") if replay.group(g) is None]
            rec.expect("P6b", "pod33 cancels group20's and group22's preemptions",
                       len(gone) == 2, f"cancelled: {gone}")
            replay.delete_allocated(allocated[0])
        if pod == "pod34":
            rec.expect("P7b", "pod34 cancels group24's preemption",
                       replay.group("group24") is None)
        if pod == "pod35":
            leaves = _pinned_leaves(replay, "group26")
            replay.delete_unallocated(pod)
            cells = replay.driver.store.allocator.cells
            ok = replay.group("group26") is None and all(
                (cells.eff[leaf] == 4) if cells.owner[leaf] else cells.eff[leaf] == -2
                for leaf in leaves)
            rec.expect("P8b", "deleting pod35 cancels group26: its cells are group25's or free",
                       ok)
    return rec.checks


def _pinned_leaves(replay: Replay, group: str) -> list[int]:
    info = replay.group(group) or {"pods": []}
    found: list[int] = []
    for _, node, devices in info["pods"]:
        found.extend(_leaves(replay, node, devices) or [])
    return found


def bad_nodes() -> list[Check]:
    """testBadNodes: doomed bad cells follow node health and usage."""
    raw = design()
    raw["virtualClusters"]["VC2"]["virtualCells"][2] = {
        "cellType": "3-DGX2-V100-NODE.DGX2-V100-NODE", "cellNumber": 1}
    rec = Recorder(Replay(text_of(raw)))
    replay = rec.replay
    chain, level = "3-DGX2-V100-NODE", 5

    def healthy(cell: dict[str, Any]) -> bool:
        return not cell["bound"] or bool(cell["physical"]["healthy"])

    def free_cells_are(vcs: Sequence[str], want_healthy: bool, *, every: bool = False) -> bool:
        for vc in vcs:
            for cell in replay.vc_cells(vc, chain, level):
                if (every or not cell["used_leaves"]) and healthy(cell) != want_healthy:
                    return False
        return True

    placed = replay.schedule("pod42", ["0.0.2.0"])
    rec.expect("B1", "pod42 binds on its suggested node 0.0.2.0",
               (placed.kind, placed.node) == ("bind", "0.0.2.0"), f"{placed.kind} {placed.node}")
    if placed.kind == "bind":
        replay.add_allocated("pod42", placed)
    replay.node_health("0.0.2.1", False)
    rec.expect("B2", "0.0.2.1 bad: VC1's and VC2's free cells stay healthy",
               free_cells_are(("VC1", "VC2"), True))
    other = replay.schedule("pod43", ["0.0.2.2"])
    if other.kind == "bind":
        replay.add_allocated("pod43", other)
    rec.expect("B3", "pod43 on 0.0.2.2: VC1's free cell is doomed bad",
               (other.kind, other.node) == ("bind", "0.0.2.2") and free_cells_are(("VC1",), False),
               f"{other.kind} {other.node}")
    replay.delete_allocated("pod43")
    rec.expect("B4", "pod43 deleted: VC1's cells are healthy again",
               free_cells_are(("VC1",), True))
    replay.node_health("0.0.2.2", False)
    rec.expect("B5", "0.0.2.2 bad too: VC1's and VC2's free cells are doomed bad",
               free_cells_are(("VC1", "VC2"), False))
    replay.node_health("0.0.2.2", True)
    rec.expect("B6", "0.0.2.2 healthy again: every free cell is healthy",
               free_cells_are(("VC1", "VC2"), True))
    replay.node_health("0.0.2.0", False)
    replay.node_health("0.0.2.2", False)
    replay.delete_allocated("pod42")
    rec.expect("B7", "pod42 deleted from bad 0.0.2.0: every cell of VC1 and VC2 there is bad",
               free_cells_are(("VC1", "VC2"), False, every=True))
    return rec.checks


def safe_relaxed_buddy_alloc() -> list[Check]:
    """testSafeRelaxedBuddyAlloc: a higher cell is split only where safety allows."""
    raw = design()
    cells = raw["virtualClusters"]["VC1"]["virtualCells"]
    cells[0]["cellNumber"], cells[2]["cellNumber"], cells[3]["cellNumber"] = 4, 0, 0
    raw["virtualClusters"]["VC2"]["virtualCells"][2] = {
        "cellType": "4-DGX2-V100-NODE.2-DGX2-V100-NODE", "cellNumber": 1}
    rec = Recorder(Replay(text_of(raw)))
    replay = rec.replay
    four = ["0.0.3.2", "0.0.3.3", "0.0.4.2", "0.0.4.3"]
    outcome = rec.schedule("R1", "pod44", four)
    if outcome.kind == "bind":
        replay.add_allocated("pod44", outcome)
    replay.node_health("0.0.3.3", False)
    outcome = rec.schedule("R2", "pod45", four)
    if outcome.kind == "bind":
        replay.add_allocated("pod45", outcome)
    replay.node_health("0.0.4.3", False)
    rec.schedule("R3", "pod46", ["0.0.3.2", "0.0.3.3", "0.0.4.0", "0.0.4.1", "0.0.4.2",
                                 "0.0.4.3"])
    return rec.checks


#: the groups HiveD's reconfiguration test expects lazily preempted (pods 8, 9, 20, 21, 24)
LAZY_AFTER_RECONFIGURATION = ("group9", "group13", "group15")
#: those HiveD keeps guaranteed (its algorithm's answer for the same test; not asserted by it)
KEPT_AFTER_RECONFIGURATION = ("group1", "group2", "group3", "group12", "group16")
#: lazily preempted before the reconfiguration (by group11), guaranteed again after it in
#: HiveD, whose recovery rebuilds groups from their pods' bind info, which does not record a
#: lazy preemption; the store keeps the downgrade
REGUARANTEED_BY_HIVED = "group5"


def reconfigured(raw: dict[str, Any]) -> dict[str, Any]:
    """testReconfiguration's new configuration: DGX-2 nodes hold their GPUs directly, a node
    of the pinned cell is renamed, VC2 has one DGX-1 node fewer, and the second 4-node DGX-2
    rack is split into four single nodes (its rack holds four new nodes)."""
    new = copy.deepcopy(raw)
    new["physicalCluster"]["cellTypes"]["DGX2-V100-NODE"] = {
        "childCellType": "DGX2-V100", "childCellNumber": 16, "isNodeLevel": True}
    cells = new["physicalCluster"]["physicalCells"]
    cells[7]["cellChildren"][0]["cellChildren"][0]["cellAddress"] = "0.0.3.100"
    new["virtualClusters"]["VC2"]["virtualCells"][0]["cellNumber"] = 1
    rack = cells[8]
    nodes = [node for half in rack["cellChildren"] for node in half["cellChildren"]]
    singles = [{"cellType": "DGX2-V100-NODE", "cellAddress": n["cellAddress"]} for n in nodes]
    cells[8] = singles[0]
    cells.extend(singles[1:])
    for i, node in enumerate(nodes):
        node["cellAddress"] = f"0.0.4.{100 + i}"
    cells.append(rack)
    return new


def reconfiguration() -> list[Check]:
    """testReconfiguration: groups that no longer fit their VC are lazily preempted."""
    raw = design()
    rec = Recorder(Replay(text_of(raw)))
    replay = rec.replay
    allocated, _ = _succeed(rec, "C0.", as_hived=True)
    rec.checks.clear()  # testNormalOperations judged the placements already
    hived_nodes: dict[str, set[str]] = {}
    for pod in allocated:
        hived_nodes.setdefault(PODS[pod][6], set()).add(BINDS[pod][0])
    nodes = {g: {node for _, node, _ in (replay.group(g) or {"pods": []})["pods"]}
             for g in hived_nodes}
    replay.dropped_suggestion = not SUGGESTED  # the placements above needed them
    rec.expect("C00", "every group is placed on the nodes HiveD's test binds it to first",
               nodes == hived_nodes, str(nodes))
    result = replay.apply(ops.reconfigure(text_of(reconfigured(raw))))
    rec.expect("C0", "the new configuration is taken", result[0] == "reconfigured",
               str(result[:2]))
    for i, group in enumerate(LAZY_AFTER_RECONFIGURATION, start=1):
        info = replay.group(group)
        rec.expect(f"C{i}", f"{group} is lazily preempted",
                   info is not None and bool(info["downgraded"]),
                   str(info and info["downgraded"]))
    kept = [g for g in KEPT_AFTER_RECONFIGURATION
            if (info := replay.group(g)) is not None and not info["downgraded"]]
    rec.expect("C4", "the other guaranteed groups stay guaranteed (HiveD's run)",
               len(kept) == len(KEPT_AFTER_RECONFIGURATION),
               f"downgraded: {sorted(set(KEPT_AFTER_RECONFIGURATION) - set(kept))}")
    info = replay.group(REGUARANTEED_BY_HIVED)
    rec.expect("C5", f"{REGUARANTEED_BY_HIVED}, lazily preempted before, is guaranteed again "
               "(HiveD's run: its recovery forgets lazy preemptions)",
               info is not None and not info["downgraded"],
               "the store keeps the downgrade" if info and info["downgraded"] else "")
    _delete_all(rec, "C6", allocated, [])
    del rec.checks[-1]  # nothing was preempting
    return rec.checks


def invalid_initial_assignment() -> list[Check]:
    """testInvalidInitialAssignment: VC1 asks for more CT1 cells than exist."""
    raw = design()
    cells = raw["virtualClusters"]["VC1"]["virtualCells"]
    cells[0]["cellType"] = "CT1-NODE"
    cells[1]["cellType"], cells[1]["cellNumber"] = "CT1-NODE.CT1", 2
    try:
        parse_config(text_of(raw))
    except GpuConfigError as exc:
        return [Check("I1", "an infeasible VC assignment is refused", MATCH, str(exc))]
    return [Check("I1", "an infeasible VC assignment is refused", DIFFER, "accepted")]


CHECKS: tuple[Callable[[], list[Check]], ...] = (
    normal_operations, suggested_nodes, stateful_preemption, bad_nodes,
    safe_relaxed_buddy_alloc, reconfiguration, invalid_initial_assignment,
)


def run_all() -> list[Check]:
    return [check for family in CHECKS for check in family()]


def tally(checks: Iterable[Check]) -> dict[str, int]:
    counts = dict.fromkeys((MATCH, EQUIVALENT, DIFFER, UNSUPPORTED), 0)
    for check in checks:
        counts[check.verdict] += 1
    return counts


if __name__ == "__main__":  # python tests/cluster_state/hived_scenarios.py: the table
    results = run_all()
    for check in results:
        print(f"{check.id:6} {check.verdict:11} {check.what} — {check.detail}")
    print(tally(results))
