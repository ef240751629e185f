"""The static shape of the cluster: physical cells, chains and the VCs' preassigned cells.

Built once from a ``ClusterConfig`` and never changed, so replicas (and a store restored from a
snapshot) can share one ``Topology``; a reconfiguration builds a new one. A cell may be partly
filled (fewer children than its type's ``childCellNumber``, as HiveD accepts): ``complete[c]``
says whether it holds its level's full leaf count. Everything is numbered:

* **cells** get ids in depth-first pre-order over ``physicalCells`` in configured order, so
  "sorted by id" is the deterministic address order used for every tie-break. Per-cell facts
  live in parallel lists (``level[c]``, ``parent[c]``, ...) because the allocator reads them
  in its hottest loops.
* **items** are the VCs' preassigned virtual cells (HiveD's ``preassignedCells``): ``number``
  floating items per ``virtualCells`` entry, plus one item per pinned cell. Floating items of
  one VC, chain and level form a *slot*; within a slot, items are interchangeable and the
  allocator always binds the lowest id first, which keeps the state a function of the
  history-free facts (what is bound where) rather than of the order things happened in.
* **keys** partition items for placement: all floating items of one VC in one chain share a
  key; every pinned item has a key of its own (only requests naming it may use it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from itertools import chain as iterate_all
from itertools import compress, repeat
from operator import eq, getitem, itemgetter

import msgpack

from cluster_state.config import ClusterConfig, PhysicalCellSpec
from cluster_state.gc_pause import gc_paused

__all__ = ["ChainInfo", "Item", "LevelInfo", "Topology", "topology_of"]

_concat = iterate_all.from_iterable

#: topologies of the last few configurations, by identity (see ``topology_of``)
_TOPOLOGY_CACHE_SIZE = 4
_topologies: list[tuple[ClusterConfig, Topology]] = []


def topology_of(config: ClusterConfig) -> Topology:
    """``Topology(config)``, shared with the last few calls for the same configuration object
    (``parse_config`` returns one object per text): a replica's start builds the store and
    compares the file's digest with it, and a 100k-GPU topology takes a second to build."""
    for known, topology in _topologies:
        if known is config:
            return topology
    topology = Topology(config)
    _topologies.append((config, topology))
    del _topologies[:-_TOPOLOGY_CACHE_SIZE]
    return topology


@dataclass(frozen=True, slots=True)
class LevelInfo:
    """One level of a chain. ``leaf_number`` is how many leaves a cell of this level holds."""

    level: int
    cell_type: str
    child_number: int  # 0 at the leaf level
    leaf_number: int
    is_node: bool


@dataclass(frozen=True, slots=True)
class ChainInfo:
    index: int
    name: str
    leaf_type: str
    node_level: int
    top_level: int
    levels: tuple[LevelInfo, ...]  # levels[l - 1] describes level l
    tops: tuple[int, ...]  # the top-level cell ids

    def info(self, level: int) -> LevelInfo:
        return self.levels[level - 1]


@dataclass(frozen=True, slots=True)
class Item:
    """A preassigned virtual cell of ``vc``: floating (``pinned_id == ""``) or pinned."""

    id: int
    vc: str
    chain: int
    level: int
    index: int  # ordinal within its slot (floating) or 0 (pinned)
    slot: int  # floating: the (vc, chain, level) slot; pinned: -1
    key: int
    pinned_id: str = ""
    pinned_cell: int = -1


class Topology:
    """Immutable cell tree plus lookup tables; see the module docstring."""

    def __init__(self, config: ClusterConfig) -> None:
        # millions of long-lived tuples: the collector's passes over them find nothing
        with gc_paused():
            self._build(config)

    def _build(self, config: ClusterConfig) -> None:
        self.config = config
        self.digest: bytes = hashlib.sha256(
            msgpack.packb(config.to_dict(), use_bin_type=True)
        ).digest()
        types = config.type_table()
        self._node_types = frozenset(t.name for t in config.cell_types if t.is_node_level)
        # ------------------------------------------------------------ chains
        chain_names = sorted({c.cell_type for c in config.physical_cells})
        self.chains: list[ChainInfo] = []
        self.chain_index: dict[str, int] = {}
        chain_levels: dict[str, list[LevelInfo]] = {}
        for name in chain_names:
            path = [name]
            while path[-1] in types:
                path.append(types[path[-1]].child_type)
            path.reverse()  # leaf first
            infos: list[LevelInfo] = []
            leaves = 1
            for level, type_name in enumerate(path, start=1):
                spec = types.get(type_name)
                if spec is not None:
                    leaves *= spec.child_number
                infos.append(
                    LevelInfo(
                        level=level,
                        cell_type=type_name,
                        child_number=spec.child_number if spec else 0,
                        leaf_number=leaves,
                        is_node=bool(spec and spec.is_node_level),
                    )
                )
            chain_levels[name] = infos
        # ------------------------------------------------------------ cells
        self.level: list[int] = []
        self.parent: list[int] = []
        self.children: list[tuple[int, ...]] = []
        self.chain_of: list[int] = []
        self.cell_type: list[str] = []
        self.address: list[str] = []  # full '/'-joined address
        self.node_name: list[str] = []  # "" above the node level
        self.node_cell: list[int] = []  # the node-level ancestor-or-self, -1 above the node
        self.device: list[int] = []  # leaves: device index; others -1
        self.pinned_of: list[str] = []
        self.leaves: list[tuple[int, ...]] = []
        self.desc: list[tuple[tuple[int, ...], ...]] = []  # desc[c][l - 1]: level-l cells under c
        self.ancestors: list[tuple[int, ...]] = []  # self first, then up to the top
        tops: dict[str, list[int]] = {name: [] for name in chain_names}
        for index, name in enumerate(chain_names):
            self.chain_index[name] = index
        self._templates: dict[tuple[int, ...], _Subtree] = {}
        for cell_spec in config.physical_cells:
            top_type = cell_spec.cell_type
            top = self._add(cell_spec, self.chain_index[top_type], len(chain_levels[top_type]))
            tops[top_type].append(top)
        del self._templates  # the specs' ids it is keyed by mean nothing after the build
        for name in chain_names:
            infos = chain_levels[name]
            node_level = next(i.level for i in infos if i.is_node)
            self.chains.append(
                ChainInfo(
                    index=self.chain_index[name],
                    name=name,
                    leaf_type=infos[0].cell_type,
                    node_level=node_level,
                    top_level=len(infos),
                    levels=tuple(infos),
                    tops=tuple(tops[name]),
                )
            )
        self.size = len(self.level)
        #: level_cells[chain][l - 1]: the chain's cells of level l, ascending (a top's cells
        #: of a level are consecutive in pre-order: concatenated in C)
        self.level_cells: list[tuple[tuple[int, ...], ...]] = [
            tuple(tuple(_concat(self.desc[top][level] for top in info.tops))
                  for level in range(info.top_level))
            for info in self.chains
        ]
        # A partly filled cell (fewer children than its type's childCellNumber, somewhere
        # under it) holds fewer leaves than its level promises: it is never handed out whole
        # (never free-listed, never bound to a VC cell); its complete pieces are.
        # (The per-cell tables below are made by C loops (map, compress, zip): a 100k-GPU
        # cluster has 190k cells, and Python loops over them were a tenth of its build.)
        full = [[0, *(info.leaf_number for info in chain.levels)] for chain in self.chains]
        expected = map(getitem, map(full.__getitem__, self.chain_of), self.level)
        self.complete: list[bool] = list(map(eq, map(len, self.leaves), expected))
        self.chains_for_leaf: dict[str, tuple[int, ...]] = {}
        for chain_info in self.chains:
            previous = self.chains_for_leaf.get(chain_info.leaf_type, ())
            self.chains_for_leaf[chain_info.leaf_type] = (*previous, chain_info.index)
        # node name -> its node-level cells (one per chain it belongs to), by chain index
        nodes: dict[str, list[int]] = {}
        cell_ids = range(self.size)
        for c in compress(cell_ids, map(eq, self.node_cell, cell_ids)):
            nodes.setdefault(self.node_name[c], []).append(c)
        self.nodes: dict[str, tuple[int, ...]] = {
            name: tuple(sorted(cells, key=self.chain_of.__getitem__) if len(cells) > 1
                        else cells)
            for name, cells in sorted(nodes.items())
        }
        #: every leaf's id, ascending
        self.leaf_ids: tuple[int, ...] = tuple(compress(cell_ids, map((1).__eq__, self.level)))
        self.device_leaf: dict[tuple[int, int], int] = dict(zip(
            zip(map(self.node_cell.__getitem__, self.leaf_ids),
                map(self.device.__getitem__, self.leaf_ids), strict=False),
            self.leaf_ids, strict=False,
        ))
        pinned = list(compress(cell_ids, self.pinned_of))
        self.pinned_cells: dict[str, int] = dict(zip(map(self.pinned_of.__getitem__, pinned),
                                                     pinned, strict=False))
        # ------------------------------------------------------------ VC items
        self.vcs: tuple[str, ...] = tuple(vc.name for vc in config.virtual_clusters)
        self.items: list[Item] = []
        self.slots: list[tuple[str, int, int]] = []  # slot -> (vc, chain, level)
        self.slot_items: list[tuple[int, ...]] = []
        self.slot_of: dict[tuple[str, int, int], int] = {}
        self.key_of: dict[tuple[str, int], int] = {}  # (vc, chain) -> floating key
        self.key_chain: list[int] = []
        self.key_vc: list[str] = []
        self.vc_slots: dict[tuple[str, int], tuple[int, ...]] = {}  # (vc, chain) -> slots by level
        self.vc_pinned: dict[str, dict[str, int]] = {}  # vc -> pinned id -> item
        self.vc_chains: dict[str, tuple[int, ...]] = {}
        for vc in config.virtual_clusters:
            wanted: dict[tuple[int, int], int] = {}
            for v in vc.virtual_cells:
                chain = self.chain_index[v.chain]
                wanted[(chain, len(chain_levels[v.chain]) - len(v.path) + 1)] = v.number
            for chain, level in sorted(wanted):
                if (vc.name, chain) not in self.key_of:
                    self.key_of[(vc.name, chain)] = len(self.key_chain)
                    self.key_chain.append(chain)
                    self.key_vc.append(vc.name)
                slot = len(self.slots)
                self.slots.append((vc.name, chain, level))
                self.slot_of[(vc.name, chain, level)] = slot
                ids = []
                for i in range(wanted[(chain, level)]):
                    item = Item(
                        id=len(self.items),
                        vc=vc.name,
                        chain=chain,
                        level=level,
                        index=i,
                        slot=slot,
                        key=self.key_of[(vc.name, chain)],
                    )
                    self.items.append(item)
                    ids.append(item.id)
                self.slot_items.append(tuple(ids))
            self.vc_pinned[vc.name] = {}
            for pin in vc.pinned_cells:
                cell = self.pinned_cells[pin]
                key = len(self.key_chain)
                self.key_chain.append(self.chain_of[cell])
                self.key_vc.append(vc.name)
                item = Item(
                    id=len(self.items),
                    vc=vc.name,
                    chain=self.chain_of[cell],
                    level=self.level[cell],
                    index=0,
                    slot=-1,
                    key=key,
                    pinned_id=pin,
                    pinned_cell=cell,
                )
                self.items.append(item)
                self.vc_pinned[vc.name][pin] = item.id
            chains = {chain for chain, _ in wanted} | {
                self.chain_of[self.pinned_cells[p]] for p in vc.pinned_cells
            }
            self.vc_chains[vc.name] = tuple(sorted(chains, key=lambda c: self.chains[c].name))
        for (vc_name, chain), _key in sorted(self.key_of.items()):
            self.vc_slots[(vc_name, chain)] = tuple(
                sorted(
                    (s for s, (v, c, _) in enumerate(self.slots) if v == vc_name and c == chain),
                    key=lambda s: self.slots[s][2],
                )
            )
        self.key_items: list[tuple[int, ...]] = [
            tuple(i.id for i in self.items if i.key == key) for key in range(len(self.key_chain))
        ]
        self.chain_slots: list[tuple[int, ...]] = [
            tuple(s for s, (_, c, _) in enumerate(self.slots) if c == chain.index)
            for chain in self.chains
        ]

    def _add(
        self,
        spec: PhysicalCellSpec,
        chain: int,
        level: int,
        parent: int = -1,
        parent_address: str = "",
        node_cell: int = -1,
        node_name: str = "",
    ) -> int:
        c = len(self.level)
        address = f"{parent_address}/{spec.address}" if parent_address else spec.address
        self.level.append(level)
        self.parent.append(parent)
        self.children.append(())
        self.chain_of.append(chain)
        self.cell_type.append(spec.cell_type)
        self.address.append(address)
        if node_cell < 0 and spec.cell_type in self._node_types:
            node_cell, node_name = c, spec.address
        self.node_name.append(node_name)
        self.node_cell.append(node_cell)
        self.device.append(int(spec.address) if not spec.children else -1)
        self.pinned_of.append(spec.pinned_id)
        self.leaves.append(())
        self.desc.append(())
        self.ancestors.append(((c,) + self.ancestors[parent]) if parent >= 0 else (c,))
        if node_cell < 0 or not spec.children:
            kids = tuple([
                self._add(child, chain, level - 1, c, address, node_cell, node_name)
                for child in spec.children
            ])
        else:
            # Inside a node, a subtree whose children are the very spec objects of one built
            # before (the parser shares the inferred cells of every node of a type) is that
            # subtree again at other ids: stamped from it (see ``_Subtree``).
            key = (level, len(self.ancestors[c]), *map(id, spec.children))
            template = self._templates.get(key)
            if template is not None:
                template.stamp(self, c, chain, address, node_cell, node_name)
                return c
            kids = tuple([
                self._add(child, chain, level - 1, c, address, node_cell, node_name)
                for child in spec.children
            ])
            self._finish(c, kids, level)
            self._templates[key] = _Subtree(self, c)
            return c
        self._finish(c, kids, level)
        return c

    def _finish(self, c: int, kids: tuple[int, ...], level: int) -> None:
        """Fill in ``c``'s children, leaves and descendants from its built children."""
        self.children[c] = kids
        if kids:
            # concatenated in C (generator expressions here were a quarter of a 100k-GPU
            # topology's build time)
            leaves, desc = self.leaves, self.desc
            self.leaves[c] = tuple(_concat(leaves[k] for k in kids))
            self.desc[c] = (
                *(tuple(_concat(desc[k][i] for k in kids)) for i in range(level - 1)),
                (c,),
            )
        else:
            self.leaves[c] = (c,)
            self.desc[c] = ((c,),)

    # ------------------------------------------------------------------ helpers
    def leaf_number(self, c: int) -> int:
        return len(self.leaves[c])

    def subtree(self, c: int) -> range:
        """The ids of ``c`` and every cell under it (consecutive: ids are in pre-order, so
        the last is ``c``'s last leaf, which is ``c`` itself when it has no children)."""
        return range(c, self.leaves[c][-1] + 1)

    def item_label(self, item: int) -> str:
        it = self.items[item]
        if it.pinned_id:
            return it.pinned_id
        return f"{it.vc}/{self.chains[it.chain].info(it.level).cell_type}/{it.index}"


class _Subtree:
    """The cells under a built cell ``root`` (ids ``root + 1 .. root + size``, pre-order),
    relative to ``root``, so that a cell with the same children at the same depth elsewhere
    gets them by ``stamp``: a dozen C-level calls per node instead of a Python call per cell.

    Every tuple of ids the cells hold (children, descendants by level, ancestors) is a
    *piece* cut out of one flat tuple of ids: ``_pick`` maps the new root's ids (its own,
    then the cells under it, then its ancestors above it) onto that flat tuple, ``_cuts``
    slices it into the pieces. A cell's pieces of descendants are consecutive (its leaves
    first), so its ``desc`` is a slice of the pieces and its ``leaves`` their first piece;
    piece 0 is the empty tuple (a leaf's children)."""

    __slots__ = ("_addresses", "_ancestor_cuts", "_children_cuts", "_cuts", "_desc_cuts",
                 "_devices", "_leaves_cuts", "_levels", "_parents", "_pick", "_pinned",
                 "_size", "_types")

    def __init__(self, topo: Topology, root: int) -> None:
        end = root + 1 + sum(map(len, topo.desc[root][:-1]))  # every cell under root
        cells = range(root + 1, end)
        self._size = len(cells)
        self._levels = topo.level[root + 1 : end]
        self._parents = [topo.parent[c] - root for c in cells]
        self._types = topo.cell_type[root + 1 : end]
        self._devices = topo.device[root + 1 : end]
        self._pinned = topo.pinned_of[root + 1 : end]
        prefix = len(topo.address[root]) + 1
        self._addresses = [topo.address[c][prefix:] for c in cells]
        # an id's position in what ``stamp`` picks from: root and the cells under it by
        # offset, then root's ancestors above it
        above = topo.ancestors[root][1:]
        position = {c: c - root for c in range(root, end)}
        position.update((a, self._size + 1 + k) for k, a in enumerate(above))
        flat: list[int] = []
        cuts: list[slice] = [slice(0, 0)]

        def cut(ids: tuple[int, ...]) -> int:
            """Keep ``ids`` as the next piece; its index among the pieces."""
            cuts.append(slice(len(flat), len(flat) + len(ids)))
            flat.extend(position[i] for i in ids)
            return len(cuts) - 1

        everything = range(root, end)
        self._children_cuts = [cut(topo.children[c]) if topo.children[c] else 0
                               for c in everything]
        self._ancestor_cuts = [cut(topo.ancestors[c]) for c in cells]
        desc_cuts: list[slice] = []
        leaves_cuts: list[int] = []
        for c in everything:
            first = len(cuts)
            for ids in topo.desc[c]:
                cut(ids)
            leaves_cuts.append(first)
            desc_cuts.append(slice(first, len(cuts)))
        self._desc_cuts = desc_cuts
        self._leaves_cuts = leaves_cuts
        self._cuts = itemgetter(*cuts)
        # ``itemgetter`` with one index answers the item, not a 1-tuple: pad (never cut)
        self._pick = itemgetter(*flat, *([0] if len(flat) < 2 else []))

    def stamp(self, topo: Topology, root: int, chain: int, address: str, node_cell: int,
              node_name: str) -> None:
        """Append the cells under ``root`` (the last cell added, at ``address``)."""
        size = self._size
        pieces = self._cuts(self._pick((*range(root, root + size + 1),
                                        *topo.ancestors[root][1:])))
        part = pieces.__getitem__
        topo.level.extend(self._levels)
        topo.parent.extend(map(root.__add__, self._parents))
        topo.chain_of.extend(repeat(chain, size))
        topo.cell_type.extend(self._types)
        topo.address.extend(map(f"{address}/".__add__, self._addresses))
        topo.node_name.extend(repeat(node_name, size))
        topo.node_cell.extend(repeat(node_cell, size))
        topo.device.extend(self._devices)
        topo.pinned_of.extend(self._pinned)
        children = list(map(part, self._children_cuts))
        leaves = list(map(part, self._leaves_cuts))
        desc = list(map(part, self._desc_cuts))
        topo.children[root], topo.leaves[root], topo.desc[root] = children[0], leaves[0], desc[0]
        topo.children.extend(children[1:])
        topo.leaves.extend(leaves[1:])
        topo.desc.extend(desc[1:])
        topo.ancestors.extend(map(part, self._ancestor_cuts))
