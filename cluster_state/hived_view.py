"""The store's state as HiveD's inspect API shows it (``pkg/api/types.go``: ``AffinityGroup``,
``PhysicalCellStatus``, ``VirtualCellStatus``, ``ClusterStatus``), for the Kubernetes
extender's ``/v1/inspect`` paths; the store's own, richer trees (``Allocator.inspect_*``)
stay on ``sdpaxos ctl`` and gRPC.

The objects are JSON-ready maps with HiveD's field names, its ``omitempty`` omissions and its
state names; they decode strictly into HiveD's Go types
(``tests/k8s/hived_conformance``). How HiveD's view is derived from this store's state:

* **Group state**: a preemptor (its victims still running, or gone and its reservation not
  confirmed yet) is ``Preempting``; a placed group that a preemptor waits for is
  ``BeingPreempted``; any other placed group ``Allocated``. ``allocatedPods`` are the UIDs of
  the pods holding its member pods (the extender's claims); ``preemptingPods`` are the
  extender's to add (the store does not know a preemptor's pods).
* **Cell state** of a leaf: used and reserved by a preemptor ``Reserving``, used ``Used``,
  reserved ``Reserved``, else ``Free``. HiveD derives a parent's state as its children's
  events arrive (a used child makes it ``Used``; otherwise it takes a state once all its
  children share it); from the children's states alone that is: their common state if they
  share one, else ``Used`` if any of them is ``Used`` or ``Reserving``, else ``Free``.
* **Priority**: a leaf's is the higher of its user's (-1 for opportunistic or lazily preempted
  use) and its reserving preemptor's, -2 (HiveD's free priority) for none; a parent's is the
  highest of its children's. A virtual cell counts its VC's guaranteed use only.
* **Binding**: HiveD binds a VC's preassigned cell and, below it, only the path up from each
  leaf a guaranteed group uses or reserves; a physical cell so bound carries ``vc`` and a
  ``virtualCell`` (without children), and the bound virtual cell a ``physicalCell`` (without
  children or virtual cell). A leaf used opportunistically carries its user's ``vc`` and
  appears in that VC's status as HiveD's fake ``<address>-opp`` cell.
* **Addresses**: physical ones are the configuration's full paths (as HiveD infers them);
  a VC's preassigned cells are ``VC/<n>``, numbered along its ``virtualCells`` and then its
  ``pinnedCells`` as the parsed configuration holds them (HiveD follows its file's order;
  the parsed configuration is canonical — sorted, equal types merged — so that every replica,
  whatever text it parsed, numbers them alike), and a virtual cell under one is numbered as
  HiveD numbers default physical children (``parent index * children + i``, from 0 under
  the preassigned cell).
* **Order**: HiveD iterates Go maps (chains, VCs) in random order; here physical cells come in
  configuration order, a VC's cells in the order above, opportunistic cells by address.
* ``lazyPreemptionStatus.preemptionTime`` is null: HiveD stamps its clock there, and nothing
  in the replicated store reads a clock (the store keeps the log position instead).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cluster_state.index import FREE
from cluster_state.ops import OPPORTUNISTIC

if TYPE_CHECKING:
    from cluster_state.allocator import Allocator, Group

__all__ = [
    "AFFINITY_GROUP_STATES",
    "CELL_STATES",
    "HivedView",
]

#: HiveD's affinity group states (``pkg/algorithm/constants.go``)
ALLOCATED, PREEMPTING, BEING_PREEMPTED = "Allocated", "Preempting", "BeingPreempted"
AFFINITY_GROUP_STATES = (ALLOCATED, PREEMPTING, BEING_PREEMPTED)
#: HiveD's cell states and healthiness
FREE_STATE, USED, RESERVING, RESERVED = "Free", "Used", "Reserving", "Reserved"
CELL_STATES = (FREE_STATE, USED, RESERVING, RESERVED)
HEALTHY, BAD = "Healthy", "Bad"


@dataclass(frozen=True, slots=True)
class _Preassigned:
    """A VC's preassigned cell as HiveD numbers it."""

    item: int
    address: str  # VC/<n>


class HivedView:
    """HiveD's inspect objects of one allocator state (build one per query: it caches the
    per-cell facts it derives)."""

    def __init__(self, allocator: Allocator) -> None:
        self.a = allocator
        topo = allocator.topo
        self.topo = topo
        self._state: dict[int, str] = {}
        self._priority: dict[int, int] = {}
        self._vpriority: dict[int, int] = {}
        self._hived_bound: dict[int, bool] = {}
        # every item's HiveD address, per VC in specification order
        self._preassigned: dict[str, list[_Preassigned]] = {}
        self._item_address: dict[int, str] = {}
        for vc in topo.config.virtual_clusters:
            cells: list[_Preassigned] = []
            taken: dict[tuple[int, int], int] = {}
            for spec in vc.virtual_cells:
                chain = topo.chain_index[spec.chain]
                level = topo.chains[chain].top_level - len(spec.path) + 1
                slot = topo.slot_of.get((vc.name, chain, level))
                items = topo.slot_items[slot] if slot is not None else ()
                for _ in range(spec.number):
                    k = taken.get((chain, level), 0)
                    taken[(chain, level)] = k + 1
                    if k < len(items):
                        cells.append(_Preassigned(items[k], f"{vc.name}/{len(cells)}"))
            for pin in vc.pinned_cells:
                cells.append(_Preassigned(topo.vc_pinned[vc.name][pin], f"{vc.name}/{len(cells)}"))
            self._preassigned[vc.name] = cells
            for cell in cells:
                self._item_address[cell.item] = cell.address

    # ------------------------------------------------------------------ groups
    def affinity_groups(self) -> dict[str, Any]:
        """``AffinityGroupList``: every group, in name order."""
        return {"items": [self.affinity_group(name) for name in sorted(self.a.groups)]}

    def affinity_group(self, name: str) -> dict[str, Any] | None:
        """``AffinityGroup`` ``name``, or None if the store has no such group."""
        group = self.a.groups.get(name)
        if group is None:
            return None
        topo, cells = self.topo, self.a.cells
        physical: dict[str, list[int]] = {}
        virtual: dict[str, list[str]] = {}
        for leaf in group.leaves():
            physical.setdefault(topo.node_name[leaf], []).append(topo.device[leaf])
            if group.guaranteed and cells.item_of[leaf] >= 0:
                root, address = self._virtual_address(leaf)
                virtual.setdefault(root, []).append(address)
        status: dict[str, Any] = {
            "vc": group.spec.vc,
            "priority": group.spec.priority,
            "state": _group_state(group),
        }
        if physical:
            status["physicalPlacement"] = physical
        if virtual:
            status["virtualPlacement"] = virtual
        pods = [uid for _, (uid, _) in sorted(group.claims.items())]
        if pods:
            status["allocatedPods"] = pods
        if group.downgraded:
            status["lazyPreemptionStatus"] = {"preemptor": group.downgraded_by,
                                              "preemptionTime": None}
        return {"metadata": {"name": name}, "status": status}

    # ------------------------------------------------------------------ cells
    def cluster_status(self) -> dict[str, Any]:
        """``ClusterStatus``: the physical cluster and every VC."""
        return {"physicalCluster": self.physical_cluster(),
                "virtualClusters": self.virtual_clusters()}

    def physical_cluster(self) -> list[dict[str, Any]]:
        """``PhysicalClusterStatus``: every top-level cell's tree, in configuration order."""
        return [self._physical(top, None) for top in range(self.topo.size)
                if self.topo.parent[top] < 0]

    def virtual_clusters(self) -> dict[str, list[dict[str, Any]]]:
        """``map[VirtualClusterName]VirtualClusterStatus``."""
        return {vc: self._virtual_cluster(vc, self._preassigned[vc]) for vc in self.topo.vcs}

    def virtual_cluster(self, vc: str) -> list[dict[str, Any]] | None:
        """``VirtualClusterStatus`` of ``vc`` (None if there is no such VC): its preassigned
        cells' trees, then one fake cell per leaf its opportunistic groups use."""
        cells = self._preassigned.get(vc)
        return None if cells is None else self._virtual_cluster(vc, cells)

    def _virtual_cluster(self, vc: str, cells: list[_Preassigned]) -> list[dict[str, Any]]:
        buddy = self.a.buddy
        out = []
        for cell in cells:
            item = self.topo.items[cell.item]
            out.append(self._virtual(cell.item, item.level, cell.address,
                                     buddy.item_cell[cell.item], top=True))
        for leaf in self._opportunistic_leaves(vc):
            # HiveD's fake cell points at the physical leaf's own status (bound, in a pinned
            # cell, it has its virtual cell)
            bound = self._virtual_address(leaf)[1] if self.a.cells.item_of[leaf] >= 0 else None
            physical = self._physical(leaf, bound)
            out.append({
                "cellType": physical["cellType"],
                "cellAddress": physical["cellAddress"] + "-opp",
                "cellState": USED,
                "cellHealthiness": physical["cellHealthiness"],
                "cellPriority": OPPORTUNISTIC,
                "physicalCell": physical,
            })
        return out

    # ------------------------------------------------------------------ physical cells
    def _physical(self, c: int, virtual: str | None) -> dict[str, Any]:
        """One physical cell's ``PhysicalCellStatus`` with its subtree; ``virtual``: the
        virtual address the cell is at inside a bound preassigned cell (None: outside one).
        Fields in the Go struct's order."""
        topo, buddy = self.topo, self.a.buddy
        doc = self._cell_status(c)
        item = buddy.bound[c]
        if item >= 0:
            virtual = self._item_address.get(item, virtual)
        kids = topo.children[c]
        if kids:
            base = _child_base(virtual, item >= 0)
            width = len(kids)
            doc["cellChildren"] = [
                self._physical(k, None if virtual is None else f"{virtual}/{base * width + i}")
                for i, k in enumerate(kids)
            ]
        vc = self._physical_vc(c)
        if vc:
            doc["vc"] = vc
        if virtual is not None and self._bound(c):
            # HiveD's copy of the virtual cell: its priority follows the physical cell's
            doc["virtualCell"] = self._virtual_flat(c, virtual, top=item >= 0,
                                                    priority=self.priority(c))
        return doc

    def _physical_flat(self, c: int) -> dict[str, Any]:
        """A physical cell's own fields (no children, no virtual cell): HiveD's shallow copy
        in a virtual cell's ``physicalCell``."""
        doc = self._cell_status(c)
        vc = self._physical_vc(c)
        if vc:
            doc["vc"] = vc
        return doc

    def _cell_status(self, c: int) -> dict[str, Any]:
        """A physical cell's ``CellStatus`` fields."""
        topo = self.topo
        doc: dict[str, Any] = {}
        if topo.parent[c] < 0:
            doc["leafCellType"] = topo.chains[topo.chain_of[c]].leaf_type
        doc["cellType"] = topo.cell_type[c]
        if topo.node_cell[c] == c:
            doc["isNodeLevel"] = True
        doc["cellAddress"] = topo.address[c]
        doc["cellState"] = self.state(c)
        doc["cellHealthiness"] = BAD if self.a.cells.bad_n[c] else HEALTHY
        doc["cellPriority"] = self.priority(c)
        return doc

    def _physical_vc(self, c: int) -> str:
        """The ``vc`` of a physical cell: its binding's, or an opportunistic user's."""
        if self._bound(c):
            return self._vc_at(c)
        return self._opportunistic_vc(c) if self.topo.level[c] == 1 else ""

    def state(self, c: int) -> str:
        known = self._state.get(c)
        if known is not None:
            return known
        topo, cells = self.topo, self.a.cells
        if topo.level[c] == 1:
            used, reserved = cells.owner[c] is not None, cells.reserver[c] is not None
            state = (RESERVING if reserved else USED) if used else (
                RESERVED if reserved else FREE_STATE)
        else:
            states = {self.state(k) for k in topo.children[c]}
            if len(states) == 1:
                state = states.pop()
            else:
                state = USED if states & {USED, RESERVING} else FREE_STATE
        self._state[c] = state
        return state

    def priority(self, c: int) -> int:
        return self._highest(c, self._priority, self._leaf_priority)

    def virtual_priority(self, c: int) -> int:
        """The priority as the cell's VC sees it: guaranteed use and reservations only."""
        return self._highest(c, self._vpriority, self._guaranteed_priority)

    def _highest(self, c: int, known: dict[int, int], leaf: Callable[[int], int]) -> int:
        """``leaf(c)`` at a leaf, the highest of the children's above (kept in ``known``)."""
        value = known.get(c)
        if value is None:
            kids = self.topo.children[c]
            value = max(self._highest(k, known, leaf) for k in kids) if kids else leaf(c)
            known[c] = value
        return value

    def _leaf_priority(self, leaf: int) -> int:
        return max(self._user_priority(leaf), self._reserver_priority(leaf))

    def _user_priority(self, leaf: int) -> int:
        owner = self.a.cells.owner[leaf]
        return self.a.groups[owner].priority if owner is not None else FREE

    def _reserver_priority(self, leaf: int) -> int:
        reserver = self.a.cells.reserver[leaf]
        return self.a.groups[reserver].priority if reserver is not None else FREE

    def _guaranteed_priority(self, leaf: int) -> int:
        best = self._reserver_priority(leaf)
        owner = self.a.cells.owner[leaf]
        if owner is not None and self.a.groups[owner].guaranteed:
            best = max(best, self.a.groups[owner].priority)
        return best

    def _bound(self, c: int) -> bool:
        """Whether HiveD would have ``c`` bound to a virtual cell: an item is bound exactly
        here, or a leaf under ``c`` inside an item is used by a guaranteed group or reserved
        (HiveD binds the path up from each such leaf)."""
        known = self._hived_bound.get(c)
        if known is None:
            if self.a.buddy.bound[c] >= 0:
                known = True
            elif self.a.cells.item_of[c] < 0:
                known = False
            elif self.topo.level[c] == 1:
                known = self._guaranteed_priority(c) > FREE
            else:
                known = any(self._bound(k) for k in self.topo.children[c])
            self._hived_bound[c] = known
        return known

    def _vc_at(self, c: int) -> str:
        item = self.a.cells.item_of[c]
        return self.topo.items[item].vc if item >= 0 else ""

    def _opportunistic_vc(self, leaf: int) -> str:
        """The VC of the opportunistic (or lazily preempted) group using ``leaf``, if any and
        nobody reserves it (a preemptor's reservation takes it from HiveD's VC view)."""
        owner = self.a.cells.owner[leaf]
        if owner is None or self.a.cells.reserver[leaf] is not None:
            return ""
        group = self.a.groups[owner]
        return "" if group.guaranteed else group.spec.vc

    def _opportunistic_leaves(self, vc: str) -> Iterator[int]:
        leaves = sorted({leaf for g in self.a.groups.values()
                         if g.spec.vc == vc and not g.guaranteed for leaf in g.leaves()},
                        key=self.topo.address.__getitem__)
        return (leaf for leaf in leaves if self._opportunistic_vc(leaf) == vc)

    # ------------------------------------------------------------------ virtual cells
    def _virtual_flat(self, c: int, address: str, *, top: bool,
                      priority: int | None = None) -> dict[str, Any]:
        """The fields of the virtual cell bound to physical cell ``c`` at ``address`` (no
        children, no physical cell): HiveD's shallow copy in a physical cell's
        ``virtualCell``."""
        topo = self.topo
        doc: dict[str, Any] = {}
        if top:
            doc["leafCellType"] = topo.chains[topo.chain_of[c]].leaf_type
        doc["cellType"] = topo.cell_type[c]
        if topo.node_cell[c] == c:
            doc["isNodeLevel"] = True
        doc["cellAddress"] = address
        doc["cellState"] = self.state(c)
        doc["cellHealthiness"] = BAD if self.a.cells.bad_n[c] else HEALTHY
        doc["cellPriority"] = self.virtual_priority(c) if priority is None else priority
        return doc

    def _virtual(self, item: int, level: int, address: str, c: int, *,
                 top: bool = False, index: int = 0) -> dict[str, Any]:
        """A virtual cell's ``VirtualCellStatus`` with its subtree: bound to physical cell
        ``c`` (-1: not bound) if HiveD would have it bound."""
        topo = self.topo
        chain = topo.chains[topo.items[item].chain]
        info = chain.info(level)
        bound = c >= 0 and self._bound(c)
        if bound:
            doc = self._virtual_flat(c, address, top=top)
        else:
            doc = {}
            if top:
                doc["leafCellType"] = chain.leaf_type
            doc["cellType"] = info.cell_type
            if info.is_node:
                doc["isNodeLevel"] = True
            doc["cellAddress"] = address
            doc["cellState"] = FREE_STATE
            doc["cellHealthiness"] = HEALTHY
            doc["cellPriority"] = FREE
        if level > 1:
            kids = topo.children[c] if c >= 0 else ()
            width = info.child_number
            base = 0 if top else index
            doc["cellChildren"] = [
                self._virtual(item, level - 1, f"{address}/{base * width + i}",
                              kids[i] if i < len(kids) else -1, index=base * width + i)
                for i in range(width)
            ]
        if bound:
            doc["physicalCell"] = self._physical_flat(c)
        return doc

    def _virtual_address(self, leaf: int) -> tuple[str, str]:
        """(preassigned cell's address, leaf's virtual address) of a leaf in a bound item."""
        topo = self.topo
        item = self.a.cells.item_of[leaf]
        root = self.a.buddy.item_cell[item]
        top = self._item_address[item]
        path = topo.ancestors[leaf]
        address, index = top, 0
        for k in range(path.index(root) - 1, -1, -1):
            cell, parent = path[k], path[k + 1]
            siblings = topo.children[parent]
            index = (0 if parent == root else index) * len(siblings) + siblings.index(cell)
            address = f"{address}/{index}"
        return top, address


def _group_state(group: Group) -> str:
    if group.preempting:
        return PREEMPTING
    return BEING_PREEMPTED if group.preemptors else ALLOCATED


def _child_base(virtual: str | None, at_item: bool) -> int:
    """The index the children of a cell bound at ``virtual`` are numbered from (0 under a
    preassigned cell; else the cell's own index times the number of children)."""
    if virtual is None or at_item:
        return 0
    return int(virtual.rsplit("/", 1)[1])
