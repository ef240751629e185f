"""Work-preserving reconfiguration: the allocator of a new topology holding a running
allocator's groups, as HiveD rebuilds its state from its pods' bind info after a configuration
change, and the report of what happened to every group (``reconfigured`` has the rules).

It owns nothing: it reads the running allocator and builds the new one through the new one's
write path (``Allocator.mark_bad``, ``bind_tentatively``, ``bind_at``, ``adopt``); the store
swaps allocators when the ``reconfigure`` command applies (``ClusterStore._reconfigure``), and a
dry run (``plan_reconfigure``) reconfigures a copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cluster_state.allocator import Allocator, Group, placed_data
from cluster_state.cells import Topology
from cluster_state.config import NODES_START_BAD
from cluster_state.ops import OPPORTUNISTIC

__all__ = ["reconfigured"]


def reconfigured(alloc: Allocator, topo: Topology,
                 position: int) -> tuple[Allocator, dict[str, Any]]:
    """A new allocator for ``topo`` holding ``alloc``'s groups, as HiveD rebuilds its state
    after a configuration change (``createAllocatedAffinityGroup``), and the report of
    what happened to every group. Nothing here changes; the caller swaps allocators.

    * A leaf is the same leaf when its node name, device index and leaf type are the same
      (wherever its cells sit now: a node that moved chain is found in its new chain), or
      when the leaf type was renamed and that node's device is the only one left there.
    * Leaves missing from ``topo`` are dropped from their group (``trimmed``); a group
      left with no leaf at all is released (``dropped``). A group's pods must share one
      chain: leaves that landed in another chain than most of the group are dropped too.
    * Guaranteed groups are given their VC's cells again, highest priority first (then
      oldest), binding VC cells around their leaves as buddy allocation would and only
      where safety allows. As HiveD recovers a group from its pods' bind info (each
      leaf's ``preassignedCellTypes``), a leaf is covered only by a VC cell of the type
      that covered it before, looked up by name in the chain the leaf is in now. A group
      that no longer fits its VC that way (the VC or pinned cell is gone, the cell type
      is not in the leaf's chain any more, or the VC has no such cell left there) is
      downgraded to opportunistic (HiveD's lazy preemption), keeping its GPUs. A group
      downgraded before stays downgraded (HiveD, which keeps no record of a lazy
      preemption, would make it guaranteed again where its cells allow).
    * Preempting and reserved groups are cancelled (HiveD keeps no reservation over a
      restart either): their schedulers submit them again.
    * Node health carries over by node name; a new node starts healthy, or bad with
      ``initialNodeHealth: bad``.
    """
    new = Allocator(topo)
    old_topo, old_cells = alloc.topo, alloc.cells
    start_bad = topo.config.options.initial_node_health == NODES_START_BAD
    for node in sorted(topo.nodes):
        if node in alloc.bad_nodes or (start_bad and node not in old_topo.nodes):
            new.mark_bad(node, position)
    where: dict[tuple[str, int, str], int] = {}
    by_device: dict[tuple[str, int], list[int]] = {}  # for a renamed leaf type
    for c in range(topo.size):
        if topo.level[c] == 1 and topo.node_cell[c] >= 0:
            leaf_type = topo.chains[topo.chain_of[c]].leaf_type
            where[(topo.node_name[c], topo.device[c], leaf_type)] = c
            by_device.setdefault((topo.node_name[c], topo.device[c]), []).append(c)
    old_types = {info.leaf_type for info in old_topo.chains}

    def moved(leaf: int) -> int:
        node, device = old_topo.node_name[leaf], old_topo.device[leaf]
        leaf_type = old_topo.chains[old_topo.chain_of[leaf]].leaf_type
        found = where.get((node, device, leaf_type), -1)
        if found < 0:
            # The leaf type was renamed: the same device of the same node is the same
            # leaf when that is unambiguous (one new leaf there, of a new type name).
            same = by_device.get((node, device), [])
            if len(same) == 1:
                new_type = topo.chains[topo.chain_of[same[0]]].leaf_type
                if new_type not in old_types:
                    found = same[0]
        return found

    _rebind(new, alloc, moved)
    outcomes: dict[str, dict[str, Any]] = {}
    touched: set[str] = set()
    for name, g in sorted(alloc.groups.items()):
        if g.preempting:
            outcomes[name] = {"outcome": "cancelled", "reason": "reservations end"}
            new.events.append(("cancelled", name, ["reconfiguration"]))
            touched.add(name)
    order = sorted(
        (g for g in alloc.groups.values() if not g.preempting),
        key=lambda g: (not g.guaranteed, -g.priority, g.token, g.spec.name),
    )
    for g in order:
        name = g.spec.name
        mapped = [[moved(leaf) for leaf in pod] for pod in g.pods]
        count: dict[int, int] = {}
        for pod in mapped:
            for leaf in pod:
                if leaf >= 0:
                    count[topo.chain_of[leaf]] = count.get(topo.chain_of[leaf], 0) + 1
        dropped = [
            old_topo.address[old]
            for pod, new_pod in zip(g.pods, mapped, strict=True)
            for old, leaf in zip(pod, new_pod, strict=True)
            if leaf < 0
        ]
        if not count:
            outcomes[name] = {"outcome": "dropped", "dropped": dropped,
                              "reason": "none of its leaf cells is left"}
            new.events.append(("released", name, []))
            touched.add(name)
            continue
        chain = min(count, key=lambda c: (-count[c], topo.chains[c].name))
        elsewhere = [
            old_topo.address[old]
            for pod, new_pod in zip(g.pods, mapped, strict=True)
            for old, leaf in zip(pod, new_pod, strict=True)
            if leaf >= 0 and topo.chain_of[leaf] != chain
        ]
        pods = tuple(
            tuple(sorted(x for x in pod if x >= 0 and topo.chain_of[x] == chain))
            for pod in mapped
        )
        group = Group(g.spec, chain, pods)
        group.token = g.token
        group.created, group.claims = g.created, g.claims
        group.downgraded, group.downgraded_at = g.downgraded, g.downgraded_at
        group.downgraded_by = g.downgraded_by
        entry: dict[str, Any] = {"outcome": "kept"}
        if old_topo.chains[g.chain].name != topo.chains[chain].name:
            entry["moved"] = [old_topo.chains[g.chain].name, topo.chains[chain].name]
        if dropped or elsewhere:
            entry = {**entry, "outcome": "trimmed", "dropped": dropped + elsewhere}
            touched.add(name)
        if group.guaranteed:
            # what covered each leaf (HiveD's preassignedCellTypes of its bind info)
            types = {leaf: _preassigned_type(alloc, old)
                     for pod, new_pod in zip(g.pods, mapped, strict=True)
                     for old, leaf in zip(pod, new_pod, strict=True) if leaf >= 0}
            reason = _cover(new, group, types)
            if reason:
                group.downgraded, group.downgraded_at = True, position
                group.downgraded_by = ""
                entry = {**entry, "outcome": "downgraded", "reason": reason}
                new.events.append(("downgraded", name, [""]))
                touched.add(name)
        outcomes[name] = entry
        new.adopt(group, position)
        if dropped or elsewhere:  # watchers (the GPU ledger) learn the smaller placement
            new.events.append(("trimmed", name, placed_data(new.placed(group))))
    # Leaves whose holder did not change keep their revision (a conditional bind that
    # read them before still holds); every other leaf changed now.
    back = {leaf: old for old in range(old_topo.size) if (leaf := moved(old)) >= 0}
    for leaf, old in back.items():
        holder = old_cells.owner[old] or old_cells.reserver[old]
        if (holder is None or holder not in touched) and new.cells.owner[leaf] == holder:
            new.cells.rev[leaf] = old_cells.rev[old]
    new.settle_every_chain()
    nodes_before, nodes_now = set(old_topo.nodes), set(topo.nodes)
    report = {
        "groups": {name: outcomes[name] for name in sorted(outcomes)},
        "nodes_added": sorted(nodes_now - nodes_before),
        "nodes_removed": sorted(nodes_before - nodes_now),
        "vcs_added": sorted(set(topo.vcs) - set(old_topo.vcs)),
        "vcs_removed": sorted(set(old_topo.vcs) - set(topo.vcs)),
    }
    return new, report


def _rebind(alloc: Allocator, old: Allocator, moved: Callable[[int], int]) -> None:
    """Bind the VC cells ``old`` had bound for running guaranteed groups to the same
    cells again where they still exist whole (same type, leaves mapped into one cell,
    safety permitting): HiveD's recovery finds each leaf's preassigned cell type in its
    bind info, so a reconfiguration that did not touch a cell keeps its binding. Cells
    used by higher priorities are bound first (a shrunk quota spares them)."""
    old_topo, topo, buddy = old.topo, alloc.topo, alloc.buddy
    users: dict[int, int] = {}  # old item -> highest priority of a group using it
    for g in old.groups.values():
        if g.guaranteed and not g.preempting:
            for leaf in g.leaves():
                item = old.cells.item_of[leaf]
                users[item] = max(users.get(item, OPPORTUNISTIC), g.priority)
    for item in sorted(users, key=lambda i: (-users[i], i)):
        it, c = old_topo.items[item], old.buddy.item_cell[item]
        if it.pinned_id or c < 0:
            continue  # pinned cells are bound by the configuration itself
        targets = {
            topo.ancestors[n][it.level - 1]
            for leaf in old_topo.leaves[c]
            if (n := moved(leaf)) >= 0 and len(topo.ancestors[n]) >= it.level
        }
        if len(targets) != 1:
            continue
        (a,) = targets
        if topo.cell_type[a] != old_topo.cell_type[c] or not topo.complete[a]:
            continue
        chain = topo.chain_of[a]
        slot = topo.slot_of.get((it.vc, chain, it.level))
        root = buddy.region_root(a)
        if slot is None or not buddy.unbound[slot] or root < 0:
            continue
        if buddy.safe_take(chain, it.level, topo.level[root]):
            alloc.bind_tentatively(buddy.unbound[slot][0], a)


def _preassigned_type(alloc: Allocator, leaf: int) -> str:
    """The cell type of the VC cell ``leaf`` is covered by ("" if none)."""
    item = alloc.cells.item_of[leaf]
    if item < 0:
        return ""
    it = alloc.topo.items[item]
    return alloc.topo.chains[it.chain].info(it.level).cell_type


def _cover(alloc: Allocator, group: Group, types: Mapping[int, str]) -> str:
    """Bind ``group``'s VC cells around its leaves, each of the cell type ``types``
    names for it (the cells already bound for groups placed before it count); "" if
    every leaf is covered, else why not (nothing bound)."""
    topo, cells, buddy = alloc.topo, alloc.cells, alloc.buddy
    spec = group.spec
    if spec.vc not in topo.vc_pinned:
        return f"virtual cluster {spec.vc} is gone"
    if spec.pinned:
        item = topo.vc_pinned[spec.vc].get(spec.pinned)
        if item is None:
            return f"pinned cell {spec.pinned} is no longer {spec.vc}'s"
        key = topo.items[item].key
    else:
        key = topo.key_of.get((spec.vc, group.chain), -1)
        if key < 0:
            return f"{spec.vc} has no cells in chain {topo.chains[group.chain].name}"
    fresh: list[int] = []
    levels = {i.cell_type: i.level for i in topo.chains[group.chain].levels}
    for leaf in group.leaves():
        item = cells.item_of[leaf]
        if item >= 0 and cells.key_of_item[item] == key:
            continue
        cell_type = types.get(leaf, "")
        level = levels.get(cell_type, 0)
        if (item < 0 and not spec.pinned and level
                and alloc.bind_at(spec.vc, group.chain, leaf, level, fresh)):
            continue
        for item in reversed(fresh):
            buddy.unbind(item)
        if not cell_type:
            return f"{topo.address[leaf]} was in no cell of {spec.vc}"
        if not level:
            return (f"{topo.address[leaf]} was in a {cell_type} cell, which chain "
                    f"{topo.chains[group.chain].name} has no more")
        return f"{topo.address[leaf]} is outside what {spec.vc} can hold now"
    return ""
