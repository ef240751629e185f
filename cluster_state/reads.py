"""The store's status documents (read models): one group, the groups, one virtual cluster and
the whole cluster, as the ``group``, ``groups``, ``vc`` and ``summary`` queries answer them.

Each is computed from an ``Allocator``'s state when asked and changes nothing; the allocator
owns that state (``cluster_state.allocator``) and answers these queries by calling here. HiveD's
inspect documents (cell trees) are ``cluster_state.inspection``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cluster_state.errors import RequestError
from cluster_state.ops import OPPORTUNISTIC

if TYPE_CHECKING:
    from cluster_state.allocator import Allocator, Group

__all__ = ["group_info", "lazy_status", "list_groups", "summary", "vc_info"]


def lazy_status(group: Group) -> dict[str, Any] | None:
    """HiveD's ``lazyPreemptionStatus`` of ``group``: who downgraded it, at which position
    (None unless it was lazily preempted)."""
    if not group.downgraded:
        return None
    return {"preemptor": group.downgraded_by, "position": group.downgraded_at}


def group_info(alloc: Allocator, name: str) -> dict[str, Any] | None:
    """Everything about group ``name`` (None if the store holds no such group)."""
    group = alloc.groups.get(name)
    if group is None:
        return None
    spec = group.spec
    placed = alloc.placed(group)
    return {
        "name": spec.name,
        "vc": spec.vc,
        "priority": spec.priority,
        "members": [[m.pods, m.leaves] for m in spec.members],
        "leaf_type": spec.leaf_type,
        "pinned": spec.pinned,
        "lazy": spec.lazy,
        "state": group.state,
        "downgraded": group.downgraded,
        "lazy_preemption": lazy_status(group),
        "chain": placed.chain,
        "pods": [[n, node, list(d)] for n, node, d in placed.pods],
        "token": group.token,
        "victims": sorted(group.victims),
        "preempted_by": sorted(group.preemptors),
        "incarnation": group.created,
        "claims": [[slot, uid, pod] for slot, (uid, pod) in sorted(group.claims.items())],
        "preassigned": preassigned_types(alloc, group),
    }


def preassigned_types(alloc: Allocator, group: Group) -> list[list[str]]:
    """Per pod, per leaf: the cell type of the VC's preassigned cell the leaf is in (""
    for opportunistic or lazily preempted use): HiveD's ``preassignedCellTypes``, by
    which its recovery finds the leaf's virtual cell."""
    topo, item_of = alloc.topo, alloc.cells.item_of
    out = []
    for pod in group.pods:
        types = []
        for leaf in pod:
            item = item_of[leaf] if group.guaranteed else -1
            it = topo.items[item] if item >= 0 else None
            types.append(topo.chains[it.chain].info(it.level).cell_type if it else "")
        out.append(types)
    return out


def list_groups(alloc: Allocator, vc: str = "") -> list[dict[str, Any]]:
    """One line per group (of ``vc``; "": every VC's), in name order."""
    return [
        {
            "name": name,
            "vc": g.spec.vc,
            "priority": g.priority,
            "state": g.state,
            "leaves": sum(len(p) for p in g.pods),
            "chain": alloc.topo.chains[g.chain].name,
            "token": g.token,
            "pods": [[n, node, list(d)] for n, node, d in alloc.placed(g).pods],
            "incarnation": g.created,
        }
        for name, g in sorted(alloc.groups.items())
        if not vc or g.spec.vc == vc
    ]


def vc_info(alloc: Allocator, vc: str) -> dict[str, Any]:
    """A VC's cells per level (bound, used, doomed, bad), pinned cells and leaf counts."""
    topo, buddy, bad_n = alloc.topo, alloc.buddy, alloc.cells.bad_n
    if vc not in topo.vc_pinned:
        raise RequestError(f"unknown virtual cluster {vc!r}")
    levels = []
    total = 0
    for slot, (slot_vc, chain, level) in enumerate(topo.slots):
        if slot_vc != vc:
            continue
        items = topo.slot_items[slot]
        cells = [buddy.item_cell[i] for i in items if buddy.item_cell[i] >= 0]
        used = sum(1 for i in items if buddy.item_used[i])
        info = topo.chains[chain].info(level)
        total += len(items) * info.leaf_number
        levels.append(
            {
                "chain": topo.chains[chain].name,
                "level": level,
                "cell_type": info.cell_type,
                "cells": len(items),
                "bound": len(cells),
                "used": used,
                "free": len(items) - used,
                "doomed": sum(1 for i in items if buddy.doomed[i]),
                "bad": sum(1 for c in cells if bad_n[c]),
            }
        )
    pinned = []
    for pin, item in sorted(topo.vc_pinned[vc].items()):
        c = topo.items[item].pinned_cell
        total += topo.leaf_number(c)
        pinned.append(
            {
                "id": pin,
                "chain": topo.chains[topo.chain_of[c]].name,
                "level": topo.level[c],
                "address": topo.address[c],
                "used": buddy.item_used[item] > 0,
                "bad": bad_n[c] > 0,
            }
        )
    mine = [g for g in alloc.groups.values() if g.spec.vc == vc]
    return {
        "name": vc,
        "cells": levels,
        "pinned": pinned,
        "leaves": {
            "total": total,
            # a preempting group's leaves are its victims' until they go: count them apart
            "used": sum(len(g.leaves()) for g in mine if g.guaranteed and not g.preempting),
            "reserved": sum(len(g.leaves()) for g in mine if g.guaranteed and g.preempting),
            "bad_held": sum(
                bad_n[buddy.item_cell[i]]
                for i in range(len(topo.items))
                if topo.items[i].vc == vc and buddy.item_cell[i] >= 0
            ),
        },
        "groups": len(mine),
    }


def summary(alloc: Allocator) -> dict[str, Any]:
    """Per chain: leaves free, used and bad, the free lists, VC demand and the surplus."""
    topo, cells, buddy = alloc.topo, alloc.cells, alloc.buddy
    chains = []
    for info in topo.chains:
        tops = info.tops
        used: dict[int, int] = {}
        for t in tops:
            for prio, n in cells.hist[t].items():
                used[prio] = used.get(prio, 0) + n
        chains.append(
            {
                "name": info.name,
                "leaf_type": info.leaf_type,
                "leaves": sum(topo.leaf_number(t) for t in tops),
                "free": sum(cells.free_n[t] for t in tops),
                "opportunistic": used.get(OPPORTUNISTIC, 0),
                "guaranteed": sum(n for p, n in used.items() if p >= 0),
                "bad": sum(cells.bad_n[t] for t in tops),
                "free_cells": [len(fl) for fl in buddy.free[info.index]],
                "demand": list(buddy.demand[info.index]),
                "surplus": buddy.surplus(info.index),
            }
        )
    return {
        "chains": chains,
        "nodes": len(topo.nodes),
        "bad_nodes": sorted(alloc.bad_nodes),
        "groups": len(alloc.groups),
        "preempting": sum(1 for g in alloc.groups.values() if g.preempting),
        "vcs": list(topo.vcs),
    }
