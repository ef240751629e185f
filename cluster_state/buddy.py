"""Buddy cell allocation: the free lists, binding VC items to physical cells, the safety
invariant, and doomed-bad bindings (HiveD §3 and §5).

**Free lists.** ``free[chain][l]`` holds the *maximal* physical cells of level ``l`` that no
item is bound in or under (HiveD's ``freeCellList``); at start, the top-level cells minus what
pinned cells split off. Binding an item to cell ``c`` splits ``c``'s free ancestor down to
``c``; unbinding puts ``c`` back and merges buddies upward. The lists are therefore a function
of the set of bound cells alone — whatever order bindings came and went in — which is what
makes "release restores the exact previous state" and snapshot/restore hold. A partly filled
cell (``Topology.complete``) is split from the start and never merges: only its complete
pieces are listed, so every listed cell of a level holds that level's full leaf count and the
safety arithmetic below stays exact.

**Binding is isomorphic.** A VC item is bound to one physical cell of its own level, and its
whole virtual subtree maps child-for-child onto the physical subtree. HiveD binds the lower
virtual levels lazily too, but inside one preassigned cell any such mapping is equivalent; the
isomorphic one lets the VC see the exact physical topology and health of what it holds.

**Safety.** ``demand[chain][l]`` counts unbound floating items (HiveD's ``allVCFreeCellNum``).
Going down a chain, ``surplus[top] = |free[top]| - demand[top]`` and
``surplus[l] = |free[l]| - demand[l] + surplus[l+1] * childNumber(l+1)`` must stay >= 0: every
VC can still get every cell it was promised. (It implies HiveD's per-level check
``totalLeft[l] >= demand[l]``.) A binding is taken from the lowest non-empty level first, like
buddy allocation; splitting a higher cell happens only where the surplus allows it.

**Doomed bad cells.** When a VC has more unbound items at a level than the chain has healthy
obtainable cells there (``unbound(vc, l) > healthy(l)``, HiveD's per-VC rule), the excess items
are bound to bad free cells and flagged *doomed*, so the VC sees its degraded capacity instead
of being promised cells that cannot be delivered. ``reconcile_doomed`` recomputes these
bindings from scratch (unbind the unused doomed items, then bind again), top level first and
VCs in name order, so they too are a function of the rest of the state. A doomed item that a
group starts using becomes an ordinary bound item.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator

from cluster_state.cells import Topology
from cluster_state.index import CellState

__all__ = ["CLEAN", "HEALTHY", "SICK", "Buddy"]

#: ``find_cell`` modes: a healthy cell whose leaves are all free (nothing to preempt) ...
CLEAN = 0
#: ... a healthy cell, fewest used (opportunistic) leaves first ...
HEALTHY = 1
#: ... or a bad cell (for a doomed binding).
SICK = 2


class Buddy:
    __slots__ = (
        "bound",
        "cells",
        "demand",
        "doomed",
        "free",
        "item_cell",
        "item_used",
        "listed",
        "n_doomed",
        "topo",
        "unbound",
    )

    def __init__(self, topo: Topology, cells: CellState) -> None:
        self.topo = topo
        self.cells = cells
        n = topo.size
        self.free: list[list[list[int]]] = [
            [[] for _ in range(chain.top_level)] for chain in topo.chains
        ]
        self.listed: list[bool] = [False] * n  # c is in a free list
        self.bound: list[int] = [-1] * n  # the item bound exactly at c
        self.item_cell: list[int] = [-1] * len(topo.items)
        self.item_used: list[int] = [0] * len(topo.items)  # leaves held by guaranteed groups
        self.doomed: list[bool] = [False] * len(topo.items)
        self.n_doomed: list[int] = [0] * len(topo.chains)
        self.unbound: list[list[int]] = [list(ids) for ids in topo.slot_items]
        self.demand: list[list[int]] = [[0] * info.top_level for info in topo.chains]
        for slot, (_, chain, level) in enumerate(topo.slots):
            self.demand[chain][level - 1] += len(topo.slot_items[slot])
        for info in topo.chains:
            for top in info.tops:
                self._list_whole(top)
        for item in topo.items:
            if item.pinned_id:
                self._take(item.pinned_cell)
                self._attach(item.id, item.pinned_cell)

    # ------------------------------------------------------------------ free lists
    def _list_whole(self, c: int) -> None:
        """List ``c`` if it is complete, else its complete pieces (a partly filled cell is
        split from the start and never merges)."""
        if self.topo.complete[c]:
            self._list(c)
            return
        for k in self.topo.children[c]:
            self._list_whole(k)

    def region_root(self, c: int) -> int:
        """The free-listed ancestor-or-self of ``c`` (so ``c`` may be bound), else -1."""
        listed = self.listed
        for a in self.topo.ancestors[c]:
            if listed[a]:
                return a
        return -1

    def _unlist(self, c: int) -> None:
        fl = self.free[self.topo.chain_of[c]][self.topo.level[c] - 1]
        del fl[bisect_left(fl, c)]
        self.listed[c] = False

    def _list(self, c: int) -> None:
        insort(self.free[self.topo.chain_of[c]][self.topo.level[c] - 1], c)
        self.listed[c] = True

    def _take(self, c: int) -> None:
        """Remove ``c`` from the free region, splitting its free ancestor down to it."""
        root = self.region_root(c)
        if root < 0:
            raise AssertionError(f"cell {self.topo.address[c]} is not free")
        topo, listed = self.topo, self.listed
        path = topo.ancestors[c]
        below = path.index(root)
        self._unlist(root)
        free, level = self.free[topo.chain_of[c]], topo.level
        children, parent = topo.children, topo.parent
        for a in reversed(path[:below]):  # from below root down to c
            # a's siblings: no cell of their level under their parent was listed, so they
            # go in side by side, in one insertion
            siblings = [s for s in children[parent[a]] if s != a]
            if siblings:
                fl = free[level[a] - 1]
                at = bisect_left(fl, siblings[0])
                fl[at:at] = siblings
                for sibling in siblings:
                    listed[sibling] = True
        # The split cells on the way (and partly filled ones above the root, which are
        # never listed) and everything under c leave the free region.
        self.cells.set_region(path[1:], False)
        self.cells.set_region_subtree(c, False)

    def _give(self, c: int) -> None:
        """Return ``c`` to the free region, merging buddies upward."""
        parent, children, listed = self.topo.parent, self.topo.children, self.listed
        complete = self.topo.complete
        self.cells.set_region_subtree(c, True)
        while True:
            p = parent[c]
            siblings = [s for s in children[p] if s != c] if p >= 0 and complete[p] else None
            if siblings is None or not all(map(listed.__getitem__, siblings)):
                self._list(c)
                self._refresh_partial(p)
                return
            # c's siblings, all listed, are side by side in their free list (c is not
            # listed, and nothing else of their level lies under p): one deletion
            if siblings:
                fl = self.free[self.topo.chain_of[c]][self.topo.level[c] - 1]
                at = bisect_left(fl, siblings[0])
                del fl[at : at + len(siblings)]
                for s in siblings:
                    listed[s] = False
            self.cells.set_region([p], True)
            c = p

    def _refresh_partial(self, p: int) -> None:
        """Partly filled ancestors from ``p`` up are in the free region again once nothing
        under them is bound."""
        topo, in_region = self.topo, self.cells.in_region
        while p >= 0 and not topo.complete[p]:
            inside = all(in_region[k] for k in topo.children[p])
            if in_region[p] == inside:
                return
            self.cells.set_region([p], inside)
            p = topo.parent[p]

    # ------------------------------------------------------------------ bindings
    def _attach(self, item: int, c: int) -> None:
        self.bound[c] = item
        self.item_cell[item] = c
        self.cells.mark_item(c, item)

    def bind(self, item: int, c: int, *, doomed: bool = False) -> None:
        """Bind unbound floating ``item`` to free cell ``c`` of its level."""
        it = self.topo.items[item]
        unbound = self.unbound[it.slot]
        del unbound[bisect_left(unbound, item)]
        self.demand[it.chain][it.level - 1] -= 1
        self._take(c)
        self._attach(item, c)
        self.doomed[item] = doomed
        self.n_doomed[it.chain] += doomed

    def unbind(self, item: int) -> None:
        it = self.topo.items[item]
        c = self.item_cell[item]
        self.cells.unmark_item(c)
        self.bound[c] = -1
        self.item_cell[item] = -1
        self.n_doomed[it.chain] -= self.doomed[item]
        self.doomed[item] = False
        self._give(c)
        insort(self.unbound[it.slot], item)
        self.demand[it.chain][it.level - 1] += 1

    def mark_used(self, item: int) -> None:
        """A group uses ``item`` now: if it was doomed, it is an ordinary bound item."""
        if self.doomed[item]:
            self.doomed[item] = False
            self.n_doomed[self.topo.items[item].chain] -= 1

    # ------------------------------------------------------------------ safety
    def surplus(self, chain: int) -> list[int]:
        """``surplus[level - 1]`` for every level (see the module docstring)."""
        return self._surplus(chain, [len(fl) for fl in self.free[chain]], self.demand[chain])

    def _surplus(self, chain: int, free: list[int], demand: list[int]) -> list[int]:
        levels = self.topo.chains[chain].levels
        out = [0] * len(levels)
        carry = 0
        for lv in range(len(levels), 0, -1):
            child_number = levels[lv].child_number if lv < len(levels) else 0
            carry = free[lv - 1] - demand[lv - 1] + carry * child_number
            out[lv - 1] = carry
        return out

    def safe_take(self, chain: int, level: int, from_level: int) -> bool:
        """Would binding a level-``level`` item to a cell split off a free cell of
        ``from_level`` keep the surplus non-negative?"""
        # ``_surplus`` of the free lists and demand after the split, top level down, without
        # copying them: every submit that binds an item asks this of each level it tries
        free, demand = self.free[chain], self.demand[chain]
        levels = self.topo.chains[chain].levels
        carry = 0
        child_number = 0
        for lv in range(len(levels), 0, -1):
            left = len(free[lv - 1]) - demand[lv - 1]
            if lv == from_level:
                left -= 1
            elif level <= lv < from_level:
                left += levels[lv].child_number - 1
            if lv == level:
                left += 1
            carry = left + carry * child_number
            if carry < 0:
                return False
            child_number = levels[lv - 1].child_number
        return True

    def find_cell(self, chain: int, level: int, mode: int) -> int:
        """A free cell of ``level`` to bind an item to, taken from the lowest non-empty free
        level that safety allows; within a level, lowest id (``HEALTHY``: fewest used leaves
        first). -1 if there is none."""
        topo, cells = self.topo, self.cells
        free_n, bad_n, desc = cells.free_n, cells.bad_n, topo.desc
        levels = topo.chains[chain].levels
        size = levels[level - 1].leaf_number
        for lv in range(level, len(levels) + 1):
            fl = self.free[chain][lv - 1]
            if not fl or not self.safe_take(chain, level, lv):
                continue
            if mode == CLEAN:
                c = self._first_clean(fl, level, size, levels[lv - 1].leaf_number)
                if c >= 0:
                    return c
                continue
            best, best_used = -1, size + 1
            for f in fl:
                for c in (f,) if lv == level else desc[f][level - 1]:
                    if mode == SICK:
                        if bad_n[c]:
                            return c
                    elif not bad_n[c]:
                        used = size - free_n[c]
                        if used == 0:
                            return c
                        if mode == HEALTHY and used < best_used:
                            best, best_used = c, used
            if best >= 0:
                return best
        return -1

    def cells_to_bind(self, chain: int, level: int, mode: int,
                      usable: Callable[[int], bool] | None = None) -> Iterator[int]:
        """Every cell ``find_cell`` may choose, in its order of preference (its answer is
        the first): free levels from ``level`` up where safety allows the split; within a
        level, ``CLEAN`` cells in id order, ``HEALTHY`` ones by fewest used leaves then id,
        ``SICK`` ones in id order. ``usable``: only cells it accepts, and only under free
        cells it accepts (it must accept every ancestor of a cell it accepts). A caller that
        cannot use a choice takes the next (HiveD's backtracking buddy allocation); binding
        a choice and unbinding it again before asking for the next is safe (each level's
        free list is copied when it is reached, and unbinding restores every list and
        count)."""
        cells, desc = self.cells, self.topo.desc
        free_n, bad_n = cells.free_n, cells.bad_n
        levels = self.topo.chains[chain].levels
        size = levels[level - 1].leaf_number
        for lv in range(level, len(levels) + 1):
            listed = list(filter(usable, self.free[chain][lv - 1]) if usable
                          else self.free[chain][lv - 1])
            if not listed or not self.safe_take(chain, level, lv):
                continue
            under = (c for f in listed for c in ((f,) if lv == level else desc[f][level - 1])
                     if usable is None or usable(c))
            if mode == CLEAN:  # (lazily: a caller often takes the first)
                yield from (c for c in under if free_n[c] == size)
            elif mode == HEALTHY:
                yield from sorted((c for c in under if not bad_n[c]),
                                  key=lambda c: size - free_n[c])
            else:
                yield from (c for c in under if bad_n[c])

    def _first_clean(self, listed: list[int], level: int, size: int, full: int) -> int:
        """``find_cell``'s ``CLEAN`` choice among the free-listed cells ``listed`` of one
        level (``full`` leaves each; cells of ``level`` hold ``size``): the first whose every
        leaf is free (its first cell of ``level``), else the first clean cell of ``level``
        under the first one holding any; -1 if none does.

        A clean cell has every leaf free, healthy ones (a bad leaf is never free), so a
        listed cell with fewer free leaves is passed over at the cost of one comparison: the
        free list, hundreds of cells at 100k GPUs, is scanned for every item a spread gang
        binds."""
        free_n, desc = self.cells.free_n, self.topo.desc
        for f in listed:
            free = free_n[f]
            if free < size:
                continue
            if free == full:
                return desc[f][level - 1][0]
            for c in desc[f][level - 1]:  # (only below f's level: there size < full)
                if free_n[c] == size:
                    return c
        return -1

    # ------------------------------------------------------------------ doomed bad cells
    def healthy_obtainable(self, chain: int, level: int) -> int:
        """Healthy cells of ``level`` in the free region (free-listed or under one)."""
        topo, bad_n = self.topo, self.cells.bad_n
        total = 0
        for lv in range(level, topo.chains[chain].top_level + 1):
            for f in self.free[chain][lv - 1]:
                under = topo.desc[f][level - 1]
                total += len(under) if not bad_n[f] else sum(1 for c in under if not bad_n[c])
        return total

    def reconcile_doomed(self, chain: int) -> None:
        """Recompute the chain's doomed bindings (see the module docstring)."""
        topo = self.topo
        if not self.n_doomed[chain] and not self.cells.chain_bad[chain]:
            return  # nothing doomed, nothing to doom: the common case costs nothing
        slots = topo.chain_slots[chain]
        for slot in slots:
            for item in topo.slot_items[slot]:
                if self.doomed[item]:
                    self.unbind(item)
        if not self.cells.chain_bad[chain]:
            return
        by_level = sorted(slots, key=lambda s: (-topo.slots[s][2], topo.slots[s][0]))
        healthy: dict[int, int] = {}
        for slot in by_level:
            _, _, level = topo.slots[slot]
            if level not in healthy:
                healthy[level] = self.healthy_obtainable(chain, level)
            excess = len(self.unbound[slot]) - healthy[level]
            while excess > 0:
                c = self.find_cell(chain, level, SICK)
                if c < 0:
                    break
                self.bind(self.unbound[slot][0], c, doomed=True)
                excess -= 1
