"""Per-cell counters and the free-capacity indexes, kept exact on every leaf change.

A leaf is in exactly one *category*: bad (its node is unhealthy), free (healthy, no user, no
reservation), or used at its *effective priority* ``eff`` (the higher of its user's and its
reserving preemptor's priority; -1 for opportunistic use). Every cell keeps, over its leaves:

* ``free_n[c]``  — free leaves (what a request that preempts nothing may take);
* ``hist[c]``    — effective priority -> count of used healthy leaves (what a request at
  priority p may take on top: counts with key < p; above the leaf level brought up to date
  when read, see ``CellState.hist``);
* ``bad_n[c]``   — bad leaves (a cell is bad iff this is non-zero).

The **indexes** answer "which cells at level l have at least n free leaves, fewest first, then
lowest id" without scanning: per index and level, ``buckets[count]`` is a sorted set of the
cells (``SortedIds``) with exactly that many free leaves (cells with none are not listed).
Index ``chain`` holds every cell of a chain at level >= 2 (opportunistic placement); index
``n_chains + key`` holds
the cells inside the items bound under placement key ``key`` (guaranteed placement inside a
VC), including a bound item's own cell even at level 1; index ``region(chain)`` holds the
cells of the chain's *free region* (no item bound in, under or above them), where opportunistic
groups go first. Buckets are sorted, not insertion ordered, so the order is a function of
the state alone and a store rebuilt from a snapshot makes the same choices as one that never
restarted. They are kept lazily: a change notes the cells it moves (through each cell's
references to the notes of the index levels that list it), and an index level is brought up
to date when it is read (``CellState._refresh``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain as iterate_all
from itertools import compress, repeat
from operator import attrgetter
from typing import Any

from cluster_state.cells import Topology
from consensus.loop_share import give_way

__all__ = ["FREE", "CellState", "SortedIds"]

_concat = iterate_all.from_iterable
#: a loop run in C (``Counter``, ``map``) takes at most this many items at once: a restore
#: runs in a replica's worker thread, and one C call holds the interpreter lock, so the
#: replica's event loop, for as long as it runs (100 ms for a 100k-GPU cluster's leaves)
C_LOOP_ITEMS = 4096

#: The effective priority of a free leaf (HiveD's "free" priority).
FREE = -2
#: most entries ``CellState._under`` keeps (it starts again when full)
UNDER_KEPT = 4096
#: most histogram changes ``CellState`` keeps due (it makes them all when there are more):
#: a read after many changes costs at most this many ancestor counts' additions
HIST_DUE_KEPT = 512
#: most ids in one chunk of a ``SortedIds``: an insert or delete moves at most this many
_CHUNK = 512


class SortedIds:
    """A sorted set of cell ids, kept in chunks of at most ``_CHUNK``: adding or removing one
    costs two bisects and a short move, whatever the size. (A plain sorted list moves half of
    itself on every insert and delete: at 100k GPUs a bucket holds tens of thousands of cells,
    and those moves were most of the apply time.) Iterates in ascending order; do not change
    it while iterating."""

    __slots__ = ("_chunks", "_maxes")

    def __init__(self) -> None:
        self._chunks: list[list[int]] = []
        self._maxes: list[int] = []  # the last id of each chunk

    @classmethod
    def from_sorted(cls, ids: list[int]) -> SortedIds:
        """The set of ``ids``, which ascend (cut into chunks in C)."""
        made = cls()
        made._chunks = [ids[i : i + _CHUNK] for i in range(0, len(ids), _CHUNK)]
        made._maxes = [chunk[-1] for chunk in made._chunks]
        return made

    def append(self, c: int) -> None:
        """Add ``c``, larger than every id held (building in ascending order)."""
        if self._chunks and len(self._chunks[-1]) < _CHUNK:
            self._chunks[-1].append(c)
            self._maxes[-1] = c
        else:
            self._chunks.append([c])
            self._maxes.append(c)

    def add(self, c: int) -> None:
        maxes, chunks = self._maxes, self._chunks
        k = bisect_left(maxes, c)
        if k == len(maxes):
            if not chunks:
                self.append(c)
                return
            k -= 1
            chunk = chunks[k]
            chunk.append(c)
            maxes[k] = c
        else:
            chunk = chunks[k]
            insort(chunk, c)
        if len(chunk) > _CHUNK:
            upper = chunk[_CHUNK // 2:]
            del chunk[_CHUNK // 2:]
            chunks.insert(k + 1, upper)
            maxes[k] = chunk[-1]
            maxes.insert(k + 1, upper[-1])

    def remove(self, c: int) -> None:
        """Remove ``c`` (which must be held)."""
        k = bisect_left(self._maxes, c)
        chunk = self._chunks[k]
        del chunk[bisect_left(chunk, c)]
        if chunk:
            self._maxes[k] = chunk[-1]
        else:
            del self._chunks[k]
            del self._maxes[k]

    def __iter__(self) -> Iterator[int]:
        return iterate_all.from_iterable(self._chunks)

    def __len__(self) -> int:
        return sum(map(len, self._chunks))

    def __bool__(self) -> bool:
        return bool(self._chunks)

    def __eq__(self, other: object) -> bool:
        """Equal to a ``SortedIds`` or a list holding the same ids in the same order (checks
        compare the indexes with lists built the obvious way)."""
        if isinstance(other, SortedIds | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"SortedIds({list(self)!r})"


_chunks_of = attrgetter("_chunks")


def _assign(refs: list[dict[int, int] | None], cells: Iterable[int],
            value: dict[int, int] | None) -> None:
    """``refs[c] = value`` for every cell ``c`` of ``cells`` (a loop in C)."""
    deque(map(refs.__setitem__, cells, repeat(value)), maxlen=0)


def _count(hist: list[dict[int, int]], under: dict[int, int], prio: int) -> None:
    """``under[c]`` more leaves of cell ``c`` are used at ``prio`` (``hist``)."""
    for c, n in under.items():
        h = hist[c]
        h[prio] = h.get(prio, 0) + n


def _uncount(hist: list[dict[int, int]], under: dict[int, int], prio: int) -> None:
    """``under[c]`` fewer leaves of cell ``c`` are used at ``prio`` (``hist``)."""
    for c, n in under.items():
        h = hist[c]
        left = h[prio] - n
        if left:
            h[prio] = left
        else:
            del h[prio]


class CellState:
    __slots__ = (
        "_buckets",
        "_chain_stale_of",
        "_hist",
        "_hist_due",
        "_key_stale_of",
        "_leaf_items",
        "_region_stale_of",
        "_stale",
        "_top_leaves",
        "_under",
        "bad",
        "bad_n",
        "bulk",
        "chain_bad",
        "eff",
        "free_n",
        "in_region",
        "item_of",
        "item_root",
        "key_of_item",
        "n_chains",
        "n_keys",
        "owner",
        "reserver",
        "rev",
        "topo",
    )

    def __init__(self, topo: Topology, *, bulk: bool = False) -> None:
        """``bulk``: start in bulk mode, indexes not built (for a state loaded in bulk, as a
        restore does, which ends with ``rebuild_indexes``)."""
        self.topo = topo
        n = topo.size
        self.free_n: list[int] = list(map(len, topo.leaves))
        self._hist: list[dict[int, int]] = [{} for _ in range(n)]
        #: the histogram changes of ancestors not yet made (see ``hist``): (id of an
        #: ``_under`` answer, priority) -> [that answer, the priority, how many times its
        #: counts are to be added (negative: taken away)]
        self._hist_due: dict[tuple[int, int], list[Any]] = {}
        self.bad_n: list[int] = [0] * n
        self.item_of: list[int] = [-1] * n  # the bound item whose cell holds c, or -1
        self.item_root: dict[int, int] = {}  # bound item -> its cell (``mark_item``'s root)
        self.key_of_item: list[int] = [item.key for item in topo.items]
        # leaf state (indexed by cell id; meaningful for leaves only)
        self.owner: list[str | None] = [None] * n
        self.reserver: list[str | None] = [None] * n
        self.eff: list[int] = [FREE] * n
        self.bad: list[bool] = [False] * n
        self.rev: list[int] = [-1] * n  # revision of the leaf's last change
        self.chain_bad: list[int] = [0] * len(topo.chains)  # bad leaves per chain
        self.in_region: list[bool] = [True] * n  # in the free region (see the docstring)
        self.n_chains = len(topo.chains)
        self.n_keys = len(topo.key_chain)
        #: whether some leaf is a top-level cell (a chain of one level: it has no parent)
        self._top_leaves = any(chain.top_level == 1 for chain in topo.chains)
        #: whether some item is a single leaf (listed in its key's index: level 1)
        self._leaf_items = any(item.level == 1 for item in topo.items)
        #: while set, the indexes are not kept (``_shift_free``, ``set_region``, ``mark_item``
        #: leave the buckets alone) until ``rebuild_indexes``: a restore changes most cells,
        #: and rebuilding once costs a pass where keeping up costs a sorted insert per change
        self.bulk = bulk
        self._buckets: list[list[list[SortedIds]]] = []
        #: per index, the cells whose listing may be out of date -> the count they are listed
        #: under (0: not listed); see ``_refresh``
        self._stale: list[list[dict[int, int]]] = []
        #: per cell, the stale notes (``_stale[index][level - 1]``) of the index levels that
        #: list it: its chain's and its chain's free region's (None for a leaf: levels >= 2
        #: only), and its bound item's key's (None outside a bound item, and for a leaf that
        #: is not an item's own cell). A change notes a cell through these, without working
        #: out its indexes (``_shift_free``); the key's is kept by ``mark_item`` and
        #: ``unmark_item``, the others are fixed (set by ``rebuild_indexes``).
        self._chain_stale_of: list[dict[int, int] | None] = []
        self._region_stale_of: list[dict[int, int] | None] = []
        self._key_stale_of: list[dict[int, int] | None] = [None] * n
        #: moved leaves -> how many of them each of their ancestors above the leaf level
        #: holds (``set_leaves``: a group's leaves move back as they came, and a cluster
        #: that is mostly free packs gangs onto the same cells again and again)
        self._under: dict[tuple[int, ...], dict[int, int]] = {}
        if not bulk:
            self.rebuild_indexes()

    def rebuild_indexes(self) -> None:
        """Every bucket from the counters (``free_n``, ``in_region``, ``item_of``) alone, and
        leave bulk mode: the indexes are a function of those.

        Each index level is filled from its cells in ascending order by one stable sort on
        their free counts, cut into buckets (C loops: a Python loop over a 100k-GPU
        cluster's cells was most of a restore)."""
        topo = self.topo
        self.bulk = False
        self._buckets = []
        index_chains = [*range(self.n_chains), *topo.key_chain, *range(self.n_chains)]
        self._stale = [[{} for _ in topo.chains[chain].levels] for chain in index_chains]
        for chain in index_chains:
            levels = topo.chains[chain].levels
            self._buckets.append([[SortedIds() for _ in range(i.leaf_number + 1)]
                                 for i in levels])
        in_region, fill = self.in_region, self._fill
        first_key, first_region = self.n_chains, self.n_chains + self.n_keys
        chain_stale_of: list[dict[int, int] | None] = [None] * topo.size
        region_stale_of: list[dict[int, int] | None] = [None] * topo.size
        self._chain_stale_of, self._region_stale_of = chain_stale_of, region_stale_of
        key_stale_of: list[dict[int, int] | None] = [None] * topo.size
        self._key_stale_of = key_stale_of
        for info in topo.chains:
            for level in range(2, info.top_level + 1):
                cells = topo.level_cells[info.index][level - 1]
                _assign(chain_stale_of, cells, self._stale[info.index][level - 1])
                _assign(region_stale_of, cells,
                        self._stale[first_region + info.index][level - 1])
                fill(self._buckets[info.index][level - 1], cells)
                fill(self._buckets[first_region + info.index][level - 1],
                     list(compress(cells, map(in_region.__getitem__, cells))))
        # a key's index: the cells of its bound items at level >= 2, and an item's own cell
        roots: dict[int, list[int]] = {}
        for item, root in self.item_root.items():
            roots.setdefault(self.key_of_item[item], []).append(root)
        levels, desc = topo.level, topo.desc
        for key, cells_of_key in roots.items():
            cells_of_key.sort()  # disjoint subtrees: their cells of a level then ascend
            index = self._buckets[first_key + key]
            stale = self._stale[first_key + key]
            own_leaves = [root for root in cells_of_key if levels[root] == 1]
            fill(index[0], own_leaves)
            _assign(key_stale_of, own_leaves, stale[0])
            for lv in range(2, len(index) + 1):
                listed = list(_concat(
                    desc[root][lv - 1] for root in cells_of_key if levels[root] >= lv
                ))
                fill(index[lv - 1], listed)
                _assign(key_stale_of, listed, stale[lv - 1])

    def _fill(self, buckets: list[SortedIds], cells: Sequence[int]) -> None:
        """Put ``cells`` (ascending) into the buckets of their free counts (none: left out)."""
        give_way()  # (a restore's: in a worker)
        count_of = self.free_n.__getitem__
        ordered = sorted(cells, key=count_of)  # stable: ids still ascend within a count
        counts = list(map(count_of, ordered))
        start = bisect_right(counts, 0)
        while start < len(counts):
            end = bisect_right(counts, counts[start], start)
            buckets[counts[start]] = SortedIds.from_sorted(ordered[start:end])
            start = end

    # ------------------------------------------------------------------ queries
    def region(self, chain: int) -> int:
        """The index of ``chain``'s free region."""
        return self.n_chains + self.n_keys + chain

    @property
    def hist(self) -> list[dict[int, int]]:
        """``hist[c]`` of every cell, up to date.

        Above the leaf level the histograms are kept lazily: a group's leaves moving from
        or to a priority note, per kept ancestor count (``_ancestors_of``) and priority,
        how many times the count is due to be added or taken away (``_hist_due``), and the
        histograms are brought up to date when read. A group placed and released before
        then costs a note and its undoing: only a plan that may preempt reads a
        histogram (``avail`` with a threshold), and most submits are placed by the
        first pass."""
        if self._hist_due:
            self._settle_hist()
        return self._hist

    def _owe_hist(self, under: dict[int, int], prio: int, times: int) -> None:
        """Each ``under[c]`` is to be added ``times`` times to ``hist[c][prio]`` (taken away:
        negative), when ``hist`` is read next."""
        due = self._hist_due
        key = (id(under), prio)  # (``under`` is held by the entry: its id is not reused)
        entry = due.get(key)
        if entry is None:
            due[key] = [under, prio, times]
            if len(due) > HIST_DUE_KEPT:
                self._settle_hist()
            return
        entry[2] += times
        if not entry[2]:
            del due[key]

    def _settle_hist(self) -> None:
        """Make every due histogram change (``hist``): the additions first, so no count
        goes below its final value, which is not negative."""
        hist = self._hist
        due = list(self._hist_due.values())
        self._hist_due.clear()
        for under, prio, times in due:
            if times > 0:
                for c, n in under.items():
                    h = hist[c]
                    h[prio] = h.get(prio, 0) + n * times
        for under, prio, times in due:
            if times < 0:
                for c, n in under.items():
                    h = hist[c]
                    left = h[prio] + n * times
                    if left:
                        h[prio] = left
                    else:
                        del h[prio]

    def avail(self, c: int, threshold: int | None) -> int:
        """Leaves of ``c`` a request may take: free ones, plus (``threshold`` = its priority)
        healthy ones whose effective priority is strictly lower."""
        n = self.free_n[c]
        if threshold is not None:
            if self._hist_due:
                self._settle_hist()
            for prio, count in self._hist[c].items():
                if prio < threshold:
                    n += count
        return n

    @property
    def buckets(self) -> list[list[list[SortedIds]]]:
        """Every index, up to date (for checks and ``debug_state``: the allocator reads one
        index at a time, through ``candidates``)."""
        for index, levels in enumerate(self._stale):
            for level in range(1, len(levels) + 1):
                self._refresh(index, level)
        return self._buckets

    def candidates(self, index: int, level: int, need: int) -> Iterator[int]:
        """Cells of ``index`` at ``level`` with at least ``need`` free leaves: fewest free
        first (best fit), then lowest id. Do not change the state while iterating."""
        if self._stale[index][level - 1]:
            self._refresh(index, level)
        # (a chain of C iterators over the buckets' chunks: most buckets are empty)
        return _concat(_concat(map(_chunks_of, self._buckets[index][level - 1][max(need, 1):])))

    def _refresh(self, index: int, level: int) -> None:
        """List every stale cell of ``index`` at ``level`` where its state says now.

        The indexes are kept lazily: a change of a cell's free count, region or item only
        notes, per index and level that lists (or listed) it, the count it is listed under;
        an index's level is brought up to date when it is read. Most changes undo
        themselves before then (a gang placed and released again, the indexes of the VCs
        and chains not asked about, the levels a search does not reach), and a cell that
        moved is moved once, however often it changed: the sorted inserts and deletes of
        keeping every index up to date on every change were most of an allocation's CPU at
        100k GPUs. The buckets are a function of the state alone, so they read the same as
        if kept eagerly."""
        stale = self._stale[index][level - 1]
        by_count = self._buckets[index][level - 1]
        free_n = self.free_n
        first_key, first_region = self.n_chains, self.n_chains + self.n_keys
        if index < first_key:  # a chain's index: its every cell of level >= 2
            moved = [(c, listed, now) for c, listed in stale.items()
                     if (now := free_n[c]) != listed]
        elif index < first_region:  # a key's: the cells of its bound items (the cells
            # whose key's notes are this level's, see ``_key_stale_of``)
            key_stale = self._key_stale_of
            moved = [(c, listed, now) for c, listed in stale.items()
                     if (now := free_n[c] if key_stale[c] is stale else 0) != listed]
        else:  # a chain's free region
            in_region = self.in_region
            moved = [(c, listed, now) for c, listed in stale.items()
                     if (now := free_n[c] if in_region[c] else 0) != listed]
        stale.clear()
        for c, listed, now in moved:
            if listed:
                by_count[listed].remove(c)
            if now:
                by_count[now].add(c)

    # ------------------------------------------------------------------ updates
    def _shift_free(self, free_delta: dict[int, int], sign: int = 1) -> None:
        """Add ``sign * free_delta[c]`` to ``free_n[c]`` of every cell, noting each changed
        cell as stale wherever it is listed: in its chain's index and, inside the free
        region, the region's (levels >= 2); in its bound item's key's index (levels >= 2,
        and an item's own cell). No call per cell: a placement or a release changes a dozen
        cells in up to three indexes each."""
        free_n = self.free_n
        if self.bulk:
            for c, d in free_delta.items():
                free_n[c] += sign * d
            return
        chain_stale, region_stale = self._chain_stale_of, self._region_stale_of
        key_stale, in_region = self._key_stale_of, self.in_region
        for c, d in free_delta.items():
            old = free_n[c]
            free_n[c] = old + sign * d
            if (stale := chain_stale[c]) is not None:
                stale.setdefault(c, old)
                if in_region[c]:
                    region_stale[c].setdefault(c, old)  # type: ignore[union-attr]
            if (stale := key_stale[c]) is not None:
                stale.setdefault(c, old)

    def _ancestors_of(self, moved: list[int]) -> dict[int, int] | None:
        """How many of the leaves ``moved`` each of their ancestors above the leaf level
        holds (None: none, the leaves are top-level cells). Kept per ``moved``
        (``_under``): the answer is the topology's alone."""
        key = tuple(moved)
        under = self._under.get(key)
        if under is not None:
            return under
        parents = list(map(self.topo.parent.__getitem__, moved))
        if self._top_leaves:
            parents = [p for p in parents if p >= 0]
            if not parents:
                return None
        # counted in C, not leaf by leaf; leaves of one parent, the commonest gang, need
        # no count
        ancestors = self.topo.ancestors
        under = (dict.fromkeys(ancestors[parents[0]], len(parents))
                 if parents.count(parents[0]) == len(parents)
                 else Counter(_concat(map(ancestors.__getitem__, parents))))
        if len(self._under) >= UNDER_KEPT:
            self._under.clear()
        self._under[key] = under
        return under

    def set_leaves(self, leaves: Sequence[int], effs: Sequence[int], rev: int) -> None:
        """Give ``leaves[i]`` effective priority ``effs[i]`` (``FREE`` for free) and stamp
        them with ``rev``; counters and indexes of every ancestor follow, each moved once per
        kind of change (``(old, new)`` pair: one for a placement or a release)."""
        eff, bad, stamp = self.eff, self.bad, self.rev
        moves: dict[tuple[int, int], list[int]] = {}  # (old, new) -> healthy leaves
        for start in range(0, len(leaves), C_LOOP_ITEMS):  # (a restore's: in a worker)
            give_way()
            for leaf, new in zip(leaves[start : start + C_LOOP_ITEMS],
                                 effs[start : start + C_LOOP_ITEMS], strict=True):
                stamp[leaf] = rev
                old = eff[leaf]
                if old != new:
                    eff[leaf] = new
                    if not bad[leaf]:  # a bad leaf counts only in bad_n, whatever its priority
                        moves.setdefault((old, new), []).append(leaf)
        if not moves:
            return
        if self.bulk:
            self._count_moves(moves)
            return
        hist, free_n = self._hist, self.free_n
        for (old, new), moved in moves.items():
            # The leaves themselves (healthy: each holds itself, free or used at ``old``) ...
            if old == FREE:
                for leaf in moved:
                    free_n[leaf] = 0
                    hist[leaf][new] = 1
            else:
                for leaf in moved:
                    h = hist[leaf]
                    h.clear()
                    if new == FREE:
                        free_n[leaf] = 1
                    else:
                        h[new] = 1
            # ... then their ancestors
            self._move_ancestors(moved, old, new)

    def set_leaves_to(self, leaves: list[int], new: int, rev: int) -> None:
        """``set_leaves(leaves, [new] * len(leaves), rev)``: what a group's leaves do (placed,
        released, promoted, downgraded). When they all move from one priority and none is
        bad (looked at in C), each leaf is moved in one short loop, without sorting the
        leaves by kind of change."""
        eff = self.eff
        olds = set(map(eff.__getitem__, leaves))
        if (len(olds) != 1 or self.bulk
                or (any(self.chain_bad) and any(map(self.bad.__getitem__, leaves)))):
            self.set_leaves(leaves, [new] * len(leaves), rev)
            return
        old = olds.pop()
        stamp = self.rev
        if old == new:
            for leaf in leaves:
                stamp[leaf] = rev
            return
        hist, free_n = self._hist, self.free_n
        if old == FREE:
            for leaf in leaves:
                stamp[leaf] = rev
                eff[leaf] = new
                free_n[leaf] = 0
                hist[leaf][new] = 1
        elif new == FREE:
            for leaf in leaves:
                stamp[leaf] = rev
                eff[leaf] = new
                free_n[leaf] = 1
                hist[leaf].clear()
        else:
            for leaf in leaves:
                stamp[leaf] = rev
                eff[leaf] = new
                h = hist[leaf]
                h.clear()
                h[new] = 1
        self._move_ancestors(leaves, old, new)

    def _move_ancestors(self, moved: list[int], old: int, new: int) -> None:
        """The leaves ``moved`` (healthy) went from effective priority ``old`` to ``new``
        (they differ): their ancestors' counters and indexes follow, each by the whole group
        at once (at most one of ``old`` and ``new`` is FREE)."""
        if self._leaf_items and (old == FREE or new == FREE):
            self._note_leaf_items(moved, int(old == FREE))
        under = self._ancestors_of(moved)
        if under is None:
            return
        if old == FREE:
            self._shift_free(under, -1)
        else:
            self._owe_hist(under, old, -1)
        if new == FREE:
            self._shift_free(under, 1)
        else:
            self._owe_hist(under, new, 1)

    def _note_leaf_items(self, leaves: list[int], listed: int) -> None:
        """Note the leaves among ``leaves`` that are a bound item's own cell as stale in its
        key's index, where they were listed under ``listed`` free leaves."""
        key_stale = self._key_stale_of
        for leaf in leaves:
            if (stale := key_stale[leaf]) is not None:
                stale.setdefault(leaf, listed)

    def _count_moves(self, moves: dict[tuple[int, int], list[int]]) -> None:
        """``set_leaves``'s counting in bulk mode: no index to keep, so each ancestor's
        counters change in place, one tight loop per kind of change (a restore moves every
        used leaf of a 100k-GPU cluster at once)."""
        ancestors, free_n, hist = self.topo.ancestors, self.free_n, self.hist  # (settled)
        for (old, new), moved in moves.items():
            under: Counter[int] = Counter()
            for start in range(0, len(moved), C_LOOP_ITEMS):  # (see C_LOOP_ITEMS)
                give_way()
                under.update(_concat(map(ancestors.__getitem__,
                                         moved[start : start + C_LOOP_ITEMS])))
            give_way()
            if old == FREE and new != FREE:  # a restore's every move: one loop
                for k, (a, n) in enumerate(under.items()):
                    if not k % C_LOOP_ITEMS:
                        give_way()
                    free_n[a] -= n
                    h = hist[a]
                    h[new] = h.get(new, 0) + n
                continue
            if old == FREE:
                for a, n in under.items():
                    free_n[a] -= n
            else:
                _uncount(hist, under, old)
            if new == FREE:
                for a, n in under.items():
                    free_n[a] += n
            else:
                _count(hist, under, new)

    def set_bad(self, leaves: Sequence[int], is_bad: bool, rev: int) -> None:
        """Mark ``leaves`` bad (or healthy again); their priorities are kept."""
        free_delta: dict[int, int] = {}
        hist_delta: dict[int, dict[int, int]] = {}
        sign = 1 if is_bad else -1
        for leaf in leaves:
            if self.bad[leaf] == is_bad:
                continue
            self.bad[leaf] = is_bad
            self.rev[leaf] = rev
            self.chain_bad[self.topo.chain_of[leaf]] += sign
            prio = self.eff[leaf]
            for a in self.topo.ancestors[leaf]:
                self.bad_n[a] += sign
                if prio == FREE:
                    free_delta[a] = free_delta.get(a, 0) - sign
                else:
                    h = hist_delta.setdefault(a, {})
                    h[prio] = h.get(prio, 0) - sign
        self._apply(free_delta, hist_delta)

    def _apply(self, free_delta: dict[int, int], hist_delta: dict[int, dict[int, int]]) -> None:
        self._shift_free(free_delta)
        hist = self.hist  # (settled: the changes below are made to the counts as they are)
        for c, changes in hist_delta.items():
            h = hist[c]
            for prio, d in changes.items():
                if d:
                    v = h.get(prio, 0) + d
                    if v:
                        h[prio] = v
                    else:
                        del h[prio]

    def set_region(self, cells: Sequence[int], inside: bool) -> None:
        """``cells`` enter (or leave) the free region."""
        in_region = self.in_region
        if self.bulk:  # no index to keep
            if isinstance(cells, range) and cells.step == 1:  # a subtree: one slice
                in_region[cells.start : cells.stop] = [inside] * len(cells)
                return
            for c in cells:
                in_region[c] = inside
            return
        region_stale, free_n = self._region_stale_of, self.free_n
        for c in cells:
            if in_region[c] == inside:
                continue
            if (stale := region_stale[c]) is not None:  # (levels >= 2)
                stale.setdefault(c, free_n[c] if in_region[c] else 0)
            in_region[c] = inside

    def set_region_subtree(self, root: int, inside: bool) -> None:
        """Every cell under ``root`` (and ``root``) enters (or leaves) the free region: as
        ``set_region`` of ``topo.subtree(root)``, a level at a time when they all move (a
        cell bound or given back: the leaves, which no region index lists, need no look)."""
        subtree = self.topo.subtree(root)
        start, stop = subtree.start, subtree.stop
        in_region = self.in_region
        if self.bulk or in_region[start:stop].count(not inside) != len(subtree):
            self.set_region(subtree, inside)
            return
        free_n, region_stale = self.free_n, self._region_stale_of
        for cells in self.topo.desc[root][1:]:  # levels >= 2
            if not cells:
                continue
            notes = region_stale[cells[0]]
            assert notes is not None
            note = notes.setdefault
            if inside:  # listed under 0 (out of the region) until now
                for c in cells:
                    note(c, 0)
            else:
                for c in cells:
                    note(c, free_n[c])
        in_region[start:stop] = [inside] * len(subtree)

    def mark_item(self, root: int, item: int) -> None:
        """The cells under ``root`` now belong to bound item ``item``: list them in its key's
        index (a level-1 cell only when it is the item's own cell)."""
        self.item_root[item] = root
        self._mark_range(root, item)
        if self.bulk:  # no index to keep: the subtree is one range of ids (pre-order)
            return
        # (the cells were in no item: listed in no key's index, under 0 free leaves)
        stale = self._stale[self.n_chains + self.key_of_item[item]]
        key_stale = self._key_stale_of
        if self.topo.level[root] == 1:
            stale[0].setdefault(root, 0)
            key_stale[root] = stale[0]
        for level, cells in enumerate(self.topo.desc[root][1:], start=2):
            notes = stale[level - 1]
            note = notes.setdefault
            for c in cells:
                key_stale[c] = notes
                note(c, 0)

    def _mark_range(self, root: int, item: int) -> None:
        subtree = self.topo.subtree(root)
        self.item_of[subtree.start : subtree.stop] = [item] * len(subtree)

    def unmark_item(self, root: int) -> None:
        item = self.item_of[root]
        del self.item_root[item]
        self._mark_range(root, -1)
        if self.bulk:
            return
        stale = self._stale[self.n_chains + self.key_of_item[item]]
        free_n, key_stale = self.free_n, self._key_stale_of
        if self.topo.level[root] == 1:
            stale[0].setdefault(root, free_n[root])
            key_stale[root] = None
        for level, cells in enumerate(self.topo.desc[root][1:], start=2):
            note = stale[level - 1].setdefault
            for c in cells:
                key_stale[c] = None
                note(c, free_n[c])
