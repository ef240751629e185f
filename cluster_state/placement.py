"""Choosing leaves: pack a gang's pods into nodes and pick each pod's leaves with the lowest
common ancestor possible. Pure planning: reads the cell state, changes nothing.

A plan is built against an availability *threshold*: ``None`` takes free leaves only (no
preemption, HiveD's first pass); a priority ``p`` also takes healthy leaves whose effective
priority is below ``p`` (the second pass), preferring free ones wherever there is a choice so
as few groups as possible are preempted.

* ``pack``: pods in decreasing size (ties: pod order) go to the node with the fewest available
  leaves that still fits (best-fit decreasing: packs, leaves big holes for big pods).
* ``pick``: inside a node, descend into the child with the fewest available leaves that holds
  the whole pod; when no child does, this cell is the pod's lowest common ancestor and the
  pod takes the fullest children first (touching as few as possible). Ties go to lower ids.

A request may be confined to some nodes (Kubernetes' suggested nodes, ``NodeFilter``): the
picker then packs on those nodes only.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

from cluster_state.cells import Topology
from cluster_state.index import FREE, CellState

__all__ = ["NodeFilter", "Picker", "pick_free"]


class NodeFilter:
    """The nodes a request may use, by name (HiveD's suggested nodes; names the
    configuration does not know are ignored), and the cells that hold one of them. Nothing
    is computed ahead (a preempt of a large cluster's pod names thousands of nodes, and a
    plan looks at a few cells): a cell above the node level is looked at once."""

    __slots__ = ("_above", "_topo", "names")

    def __init__(self, topo: Topology, names: Set[str]) -> None:
        self.names = names
        self._topo = topo
        self._above: dict[int, bool] = {}  # cells above the node level, once looked at

    def holds(self, c: int) -> bool:
        """Whether cell ``c`` is or lies in an allowed node, or holds one."""
        topo = self._topo
        if topo.node_cell[c] >= 0:
            return topo.node_name[c] in self.names
        known = self._above.get(c)
        if known is None:
            node_level = topo.chains[topo.chain_of[c]].node_level
            names, node_name = self.names, topo.node_name
            known = any(node_name[n] in names for n in topo.desc[c][node_level - 1])
            self._above[c] = known
        return known


class Picker:
    """One planning attempt: remembers the leaves it already chose for earlier pods."""

    __slots__ = ("cells", "only", "taken", "taken_free", "threshold", "topo")

    def __init__(self, topo: Topology, cells: CellState, threshold: int | None,
                 only: NodeFilter | None = None) -> None:
        self.topo = topo
        self.cells = cells
        self.threshold = threshold
        self.only = only  # the nodes it may pack on (None: any)
        self.taken: dict[int, int] = {}  # cell -> leaves chosen under it so far
        self.taken_free: dict[int, int] = {}  # ... of which were free

    def avail(self, c: int) -> int:
        if self.threshold is None:  # free leaves only (the first pass): no call for that
            return self.cells.free_n[c] - self.taken.get(c, 0)
        return self.cells.avail(c, self.threshold) - self.taken.get(c, 0)

    def cost(self, c: int, need: int) -> int:
        """How many non-free (preempted) leaves ``need`` leaves from ``c`` take at least."""
        if self.threshold is None:
            return 0
        free = self.cells.free_n[c] - self.taken_free.get(c, 0)
        return need - free if need > free else 0

    def nodes(self, roots: Sequence[int], node_level: int) -> list[int]:
        """The placement units under ``roots``: node-level cells, or a root itself when it
        lies at or below the node level (a sub-node VC cell is its own unit, as in HiveD);
        those on allowed nodes only."""
        level, desc = self.topo.level, self.topo.desc
        out: list[int] = []
        for r in roots:
            if level[r] <= node_level:
                out.append(r)
            else:
                out.extend(desc[r][node_level - 1])
        if self.only is not None:
            out = list(filter(self.only.holds, out))
        return out

    def best_node(self, nodes: Sequence[int], need: int) -> int:
        if self.threshold is None:
            return self._best_free_node(nodes, need)
        best, best_key = -1, (0, 0, 0)
        avail = self.avail
        for n in nodes:
            a = avail(n)
            if a >= need:
                key = (self.cost(n, need), a, n)
                if best < 0 or key < best_key:
                    best, best_key = n, key
        return best

    def _best_free_node(self, nodes: Sequence[int], need: int) -> int:
        """``best_node`` of the first pass (nothing preempted, so every cost is 0): the
        fewest available leaves that fit, then the lowest id, in one loop without a call or
        a key per node (a spread gang scans every node its VC holds, hundreds at 100k GPUs,
        for each pod: the keyed loop took ~7 times as long)."""
        free_n, taken = self.cells.free_n, self.taken
        best, best_a = -1, 0
        for n in nodes:
            a = free_n[n] - taken.get(n, 0)
            if a >= need and (best < 0 or a < best_a or (a == best_a and n < best)):
                best, best_a = n, a
        return best

    def pack(
        self, nodes: Sequence[int], sizes: Sequence[int], order: Sequence[int], *,
        final: bool = False,
    ) -> list[tuple[int, ...]] | None:
        """Leaves for every pod (indexed like ``sizes``), or None if they do not all fit.
        ``final``: this picker plans nothing more, so the last pod's leaves are not counted
        as taken (what a placement of one pod, the commonest, spends most of ``pick`` on)."""
        out: list[tuple[int, ...]] = [() for _ in sizes]
        last = order[-1] if final and order else -1
        for i in order:
            node = self.best_node(nodes, sizes[i])
            if node < 0:
                return None
            out[i] = self.pick(node, sizes[i], remember=i != last)
        return out

    def pick(self, root: int, need: int, *, remember: bool = True) -> tuple[int, ...]:
        """``need`` leaves under ``root``, ascending; ``remember``: counted as taken for
        what this picker plans next."""
        chosen: list[int] = []
        self._descend(root, need, chosen)
        if not remember:
            chosen.sort()
            return tuple(chosen)
        eff, bad, ancestors = self.cells.eff, self.cells.bad, self.topo.ancestors
        taken, taken_free = self.taken, self.taken_free
        for leaf in chosen:
            free = eff[leaf] == FREE and not bad[leaf]
            for a in ancestors[leaf]:
                taken[a] = taken.get(a, 0) + 1
                if free:
                    taken_free[a] = taken_free.get(a, 0) + 1
        chosen.sort()
        return tuple(chosen)

    def _descend(self, c: int, need: int, out: list[int]) -> None:
        topo = self.topo
        if topo.level[c] == 1:
            out.append(c)
            return
        if self.threshold is None:
            self._descend_free(c, need, out)
            return
        kids = []
        best, best_key = -1, (0, 0, 0)
        avail = self.avail
        for k in topo.children[c]:
            a = avail(k)
            if a <= 0:
                continue
            kids.append((a, k))
            if a >= need:
                key = (self.cost(k, need), a, k)
                if best < 0 or key < best_key:
                    best, best_key = k, key
        if best >= 0:
            self._descend(best, need, out)
            return
        kids.sort(key=lambda ak: (-ak[0], self.cost(ak[1], ak[0]), ak[1]))
        for a, k in kids:
            n = a if a < need else need
            self._descend(k, n, out)
            need -= n
            if not need:
                return
        raise AssertionError("pick: fewer leaves available than counted")

    def _descend_free(self, c: int, need: int, out: list[int]) -> None:
        """``_descend`` of the first pass (free leaves only, so every cost is 0)."""
        _descend_free(self.topo, self.cells.free_n, self.taken, c, need, out)


#: nothing taken (``pick_free``: one pod, no picker)
_NOTHING_TAKEN: dict[int, int] = {}


def pick_free(topo: Topology, cells: CellState, root: int, need: int) -> tuple[int, ...]:
    """``Picker(topo, cells, None).pick(root, need, remember=False)``: a first pass's
    ``need`` free leaves under ``root``, ascending, without making a picker (one pod, the
    commonest placement)."""
    chosen: list[int] = []
    _descend_free(topo, cells.free_n, _NOTHING_TAKEN, root, need, chosen)
    chosen.sort()
    return tuple(chosen)


def _descend_free(topo: Topology, free_n: list[int], taken: dict[int, int], c: int, need: int,
                  out: list[int]) -> None:
    """``Picker._descend`` of the first pass (free leaves only, so every cost is 0; ``taken``:
    the picker's), without a call or a key per child: the same choices, the commonest
    placement's hot loop."""
    level, children, leaves = topo.level, topo.children, topo.leaves
    while True:
        if level[c] == 1:
            out.append(c)
            return
        if need == free_n[c] == len(leaves[c]) and c not in taken:
            out.extend(leaves[c])  # every leaf, all free and none taken yet
            return
        best, best_a = -1, 0
        for k in children[c]:
            a = free_n[k] - taken.get(k, 0)
            if a >= need and (best < 0 or a < best_a or (a == best_a and k < best)):
                best, best_a = k, a
        if best < 0:
            break
        c = best
    # no child holds the whole pod: c is its lowest common ancestor; fullest first
    kids = sorted((-a, k) for k in children[c] if (a := free_n[k] - taken.get(k, 0)) > 0)
    for minus_a, k in kids:
        n = -minus_a if -minus_a < need else need
        _descend_free(topo, free_n, taken, k, n, out)
        need -= n
        if not need:
            return
    raise AssertionError("pick: fewer leaves available than counted")
