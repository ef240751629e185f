"""HiveD's inspect documents (read models): the physical cell trees with their state, health,
priority and bindings, a virtual cluster's preassigned cells with their virtual subtrees, and an
affinity group's physical and virtual placement, as the ``inspect`` query answers them.

Each is computed from an ``Allocator``'s state when asked and changes nothing; the allocator
owns that state (``cluster_state.allocator``). Virtual addresses are HiveD's:
``VC/<index among the VC's cells>`` (or ``VC/<pinned id>``), then a child index per level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cluster_state.errors import RequestError
from cluster_state.index import FREE
from cluster_state.reads import lazy_status

if TYPE_CHECKING:
    from cluster_state.allocator import Allocator

__all__ = ["inspect_group", "inspect_physical", "inspect_vc"]


def _leaf_state(alloc: Allocator, leaf: int) -> str:
    owner, reserver = alloc.cells.owner[leaf], alloc.cells.reserver[leaf]
    if owner is not None:
        return "reserving" if reserver is not None else "used"
    return "reserved" if reserver is not None else "free"


def _cell_doc(alloc: Allocator, c: int, virtual: str) -> dict[str, Any]:
    """One physical cell and its subtree, HiveD's ``PhysicalCellStatus`` fields."""
    topo, cells, buddy = alloc.topo, alloc.cells, alloc.buddy
    doc: dict[str, Any] = {
        "address": topo.address[c],
        "type": topo.cell_type[c],
        "level": topo.level[c],
        "healthy": not cells.bad_n[c],
    }
    if topo.level[c] == 1:
        doc["state"] = _leaf_state(alloc, c)
        doc["priority"] = cells.eff[c]
        doc["group"] = cells.owner[c] or cells.reserver[c]
    else:
        states = {_leaf_state(alloc, leaf) for leaf in topo.leaves[c]}
        order = ("reserving", "reserved", "used")
        doc["state"] = next((s for s in order if s in states), "free")
        doc["priority"] = max((p for p in cells.hist[c]), default=FREE)
        if not topo.complete[c]:
            doc["partial"] = True
    if topo.node_cell[c] == c:
        doc["node"] = topo.node_name[c]
    item = buddy.bound[c]
    if item >= 0:
        virtual = _item_address(alloc, item)
        doc["vc"] = topo.items[item].vc
        doc["doomed"] = buddy.doomed[item]
    if virtual:
        doc["virtual"] = virtual
    kids = topo.children[c]
    if kids:
        doc["children"] = [
            _cell_doc(alloc, k, f"{virtual}/{i}" if virtual else "") for i, k in enumerate(kids)
        ]
    return doc


def _virtual_of(alloc: Allocator, c: int) -> str:
    """The virtual address ``c`` is bound under ("" if none)."""
    topo, bound = alloc.topo, alloc.buddy.bound
    path = topo.ancestors[c]
    for k, a in enumerate(path):
        if bound[a] >= 0:
            steps = [
                str(topo.children[path[j + 1]].index(path[j])) for j in range(k - 1, -1, -1)
            ]
            return "/".join([_item_address(alloc, bound[a]), *steps])
    return ""


def _item_address(alloc: Allocator, item: int) -> str:
    """A preassigned virtual cell's address, ``VC/<index among the VC's cells>`` (or
    ``VC/<pinned id>``), as HiveD numbers them."""
    it = alloc.topo.items[item]
    if it.pinned_id:
        return f"{it.vc}/{it.pinned_id}"
    mine = [i.id for i in alloc.topo.items if i.vc == it.vc and not i.pinned_id]
    return f"{it.vc}/{mine.index(item)}"


def inspect_physical(alloc: Allocator, chain: str = "") -> list[dict[str, Any]]:
    """Every physical cell tree (of ``chain``), top cells in configured order. ``chain``
    may also be a cell's full address (``rack-a/dgx-a0``): that cell's subtree only (a
    whole large cluster's tree is megabytes)."""
    topo = alloc.topo
    if chain and chain not in topo.chain_index:
        cell = next((c for c in range(topo.size) if topo.address[c] == chain), -1)
        if cell < 0:
            raise RequestError(f"no chain or cell address {chain!r}")
        info = topo.chains[topo.chain_of[cell]]
        return [{"chain": info.name, "cells": [_cell_doc(alloc, cell, _virtual_of(alloc, cell))]}]
    return [
        {"chain": info.name, "cells": [_cell_doc(alloc, t, "") for t in info.tops]}
        for info in topo.chains
        if not chain or info.name == chain
    ]


def inspect_vc(alloc: Allocator, vc: str) -> dict[str, Any]:
    """A VC's preassigned virtual cells with their virtual subtrees and, where bound, the
    physical counterpart of each virtual cell; opportunistic use is not the VC's."""
    topo, buddy = alloc.topo, alloc.buddy
    if vc not in topo.vc_pinned:
        raise RequestError(f"unknown virtual cluster {vc!r}")
    cells = []
    for it in topo.items:
        if it.vc != vc:
            continue
        c = buddy.item_cell[it.id]
        info = topo.chains[it.chain].info(it.level)
        doc: dict[str, Any] = {
            "address": _item_address(alloc, it.id),
            "chain": topo.chains[it.chain].name,
            "type": info.cell_type,
            "level": it.level,
            "pinned": it.pinned_id,
            "bound": c >= 0,
            "doomed": buddy.doomed[it.id],
            "used_leaves": buddy.item_used[it.id],
        }
        if c >= 0:
            doc["physical"] = _virtual_doc(alloc, c, doc["address"])
        cells.append(doc)
    return {"vc": vc, "cells": cells}


def _virtual_doc(alloc: Allocator, c: int, virtual: str) -> dict[str, Any]:
    topo, cells = alloc.topo, alloc.cells
    doc: dict[str, Any] = {
        "virtual": virtual,
        "address": topo.address[c],
        "healthy": not cells.bad_n[c],
    }
    if topo.level[c] == 1:
        owner = cells.owner[c]
        guaranteed = owner is not None and alloc.groups[owner].guaranteed
        doc["state"] = _leaf_state(alloc, c)
        doc["priority"] = cells.eff[c]
        doc["group"] = owner if guaranteed else None  # opportunistic users are no VC's
    else:
        doc["priority"] = max((p for p in cells.hist[c] if p >= 0), default=FREE)
        doc["children"] = [
            _virtual_doc(alloc, k, f"{virtual}/{i}") for i, k in enumerate(topo.children[c])
        ]
    return doc


def inspect_group(alloc: Allocator, name: str) -> dict[str, Any] | None:
    """HiveD's affinity-group status: physical placement per node, virtual placement per
    preassigned cell (none once lazily preempted) and the lazy-preemption status."""
    group = alloc.groups.get(name)
    if group is None:
        return None
    topo, cells = alloc.topo, alloc.cells
    physical: dict[str, list[int]] = {}
    virtual: dict[str, list[str]] = {}
    for leaf in group.leaves():
        physical.setdefault(topo.node_name[leaf], []).append(topo.device[leaf])
        item = cells.item_of[leaf]
        if group.guaranteed and item >= 0:
            root = alloc.buddy.item_cell[item]
            path = topo.ancestors[leaf]
            steps = [
                str(topo.children[path[k + 1]].index(path[k]))
                for k in range(path.index(root) - 1, -1, -1)
            ]
            address = _item_address(alloc, item)
            virtual.setdefault(address, []).append("/".join([address, *steps]))
    return {
        "name": name,
        "vc": group.spec.vc,
        "priority": group.spec.priority,
        "state": group.state,
        "chain": topo.chains[group.chain].name,
        "physical_placement": {node: sorted(d) for node, d in sorted(physical.items())},
        "virtual_placement": {a: sorted(v) for a, v in sorted(virtual.items())},
        "victims": sorted(group.victims),
        "preempted_by": sorted(group.preemptors),
        "lazy_preemption": lazy_status(group),
        # HiveD's allocatedPods: the pods holding its member pods (their claims)
        "allocated_pods": [uid for _, (uid, _) in sorted(group.claims.items())],
    }
