"""Cluster configuration in HiveD's YAML format: cell types, physical cells, virtual clusters.

Accepted shape (keys HiveD reads but the store does not, e.g. ``skuTypes`` or HiveD's
scheduler settings such as ``webServerAddress``, are ignored; any other key is refused, naming
the key and the nearest known one, so a misspelled ``virtualCluster:`` is not read as "no
virtual clusters")::

    physicalCluster:
      cellTypes:
        K80-2GPU:   {childCellType: K80, childCellNumber: 2}
        K80-NODE:   {childCellType: K80-2GPU, childCellNumber: 2, isNodeLevel: true}
        3-K80-NODE: {childCellType: K80-NODE, childCellNumber: 3}
      physicalCells:
      - cellType: 3-K80-NODE
        cellChildren:
        - cellAddress: 10.151.41.20
        - {cellAddress: 10.151.41.21, pinnedCellId: VC2-K80}
        - cellAddress: 10.151.41.22
    virtualClusters:
      VC1: {virtualCells: [{cellType: 3-K80-NODE.K80-NODE, cellNumber: 1}]}
      VC2:
        virtualCells: [{cellType: 3-K80-NODE.K80-NODE, cellNumber: 1}]
        pinnedCells: [{pinnedCellId: VC2-K80}]

A type name used as a ``childCellType`` but not defined is a *leaf* type (one device). Levels
count from the leaf (level 1). A *chain* is the type of a top-level physical cell; a virtual cell
type ``CHAIN.T1.T2`` names the type ``T2`` inside that chain. Omitted children are inferred;
their addresses follow HiveD (``pkg/api/config.go: inferPhysicalCellSpec``): the default
child address is ``parent_default * childCellNumber + i``, where a top-level cell's default is
its index in ``physicalCells`` (whatever address it is given) and a node's is 0 (so a leaf's
address is its device index, and the second 2-node cell of the 8th top-level 4-node rack is
``7/15``). A node-level cell's address is its node name and must be given.

``parse_config`` checks everything HiveD checks at start (plus a few things it does not) and
raises ``GpuConfigError`` naming the offending item. ``synthetic_config`` builds DGX-like
clusters of any size for tests, benchmarks and demos.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import itertools
import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from cluster_state.errors import GpuConfigError

_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
#: validated configurations by the sha256 of their text: the serve path reads the same file
#: several times at start (the log's first configuration, the file's, the proposal's), and a
#: 100k-GPU file takes seconds to validate (configurations are immutable, so sharing is safe)
_PARSED_CACHE_SIZE = 4
_parsed: OrderedDict[bytes, ClusterConfig] = OrderedDict()

__all__ = [
    "NODES_START_BAD",
    "NODES_START_HEALTHY",
    "RESERVE_PLACE_AT_ONCE",
    "RESERVE_UNTIL_CONFIRMED",
    "CellTypeSpec",
    "ClusterConfig",
    "PhysicalCellSpec",
    "StoreOptions",
    "VirtualCellSpec",
    "VirtualClusterSpec",
    "load_config",
    "parse_config",
    "synthetic_config",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class CellTypeSpec:
    """One ``cellTypes`` entry: a cell of this type holds ``child_number`` cells of
    ``child_type``."""

    name: str
    child_type: str
    child_number: int
    is_node_level: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PhysicalCellSpec:
    """One physical cell with its whole (inferred) subtree. ``address`` is this cell's own
    address component; ``pinned_id`` is "" unless the cell is pinned."""

    cell_type: str
    address: str
    pinned_id: str = ""
    children: tuple[PhysicalCellSpec, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class VirtualCellSpec:
    """``number`` preassigned cells of type ``path[-1]`` in chain ``path[0]``."""

    path: tuple[str, ...]
    number: int

    @property
    def chain(self) -> str:
        return self.path[0]

    @property
    def cell_type(self) -> str:
        return self.path[-1]


@dataclass(frozen=True, slots=True, kw_only=True)
class VirtualClusterSpec:
    name: str
    virtual_cells: tuple[VirtualCellSpec, ...]
    pinned_cells: tuple[str, ...] = ()


#: ``StoreOptions.reservations``: a preemptor whose victims are gone stays reserved until the
#: scheduler confirms it (a second submit or a bind), as HiveD's Preempting state does ...
RESERVE_UNTIL_CONFIRMED = "confirm"
#: ... or it is placed as soon as its last victim is released (this store's first behaviour).
RESERVE_PLACE_AT_ONCE = "immediate"
#: ``StoreOptions.initial_node_health``: every node starts healthy ...
NODES_START_HEALTHY = "healthy"
#: ... or bad until a health report says otherwise (HiveD trusts only what Kubernetes reports).
NODES_START_BAD = "bad"


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreOptions:
    """The store's own settings, under the optional top-level key ``storeOptions`` (HiveD
    ignores it): ``{reservations: confirm | immediate, initialNodeHealth: healthy | bad}``.
    They are part of the configuration (and of its digest), so every replica applies the same
    ones, and a reconfiguration may change them."""

    reservations: str = RESERVE_UNTIL_CONFIRMED
    initial_node_health: str = NODES_START_HEALTHY

    def to_dict(self) -> dict[str, Any]:
        return {"reservations": self.reservations, "initialNodeHealth": self.initial_node_health}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """A validated configuration. ``cell_types`` and ``virtual_clusters`` are sorted by name;
    ``physical_cells`` keeps the configured order (it decides default addresses)."""

    cell_types: tuple[CellTypeSpec, ...]
    physical_cells: tuple[PhysicalCellSpec, ...]
    virtual_clusters: tuple[VirtualClusterSpec, ...]
    options: StoreOptions = StoreOptions()

    def type_table(self) -> dict[str, CellTypeSpec]:
        return {t.name: t for t in self.cell_types}

    def to_dict(self, *, compact: bool = False) -> dict[str, Any]:
        """The configuration in HiveD's format, every cell written out (canonical), or with
        ``compact`` the children of nodes left out where they are what parsing would infer
        (a 100k-GPU file shrinks tenfold; it parses to the same configuration)."""
        types_table = self.type_table()
        inferred = _InferredNodes(types_table) if compact else None
        # Cells inside nodes are shared by every node of a type (see ``_CellBuilder``): their
        # dicts are built once (the caller only reads or serializes the result).
        done: dict[int, dict[str, Any]] = {}

        def cell(spec: PhysicalCellSpec, top: bool) -> dict[str, Any]:
            known = done.get(id(spec))
            if known is not None and not top:
                return known
            out: dict[str, Any] = {}
            if top:
                out["cellType"] = spec.cell_type
            out["cellAddress"] = spec.address
            if spec.pinned_id:
                out["pinnedCellId"] = spec.pinned_id
            if spec.children and not (
                inferred is not None and inferred.matches(spec)
            ):
                out["cellChildren"] = [cell(child, False) for child in spec.children]
            done[id(spec)] = out
            return out

        types: dict[str, Any] = {}
        for t in self.cell_types:
            entry: dict[str, Any] = {
                "childCellType": t.child_type,
                "childCellNumber": t.child_number,
            }
            if t.is_node_level:
                entry["isNodeLevel"] = True
            types[t.name] = entry
        vcs: dict[str, Any] = {}
        for vc in self.virtual_clusters:
            entry = {
                "virtualCells": [
                    {"cellType": ".".join(v.path), "cellNumber": v.number}
                    for v in vc.virtual_cells
                ]
            }
            if vc.pinned_cells:
                entry["pinnedCells"] = [{"pinnedCellId": p} for p in vc.pinned_cells]
            vcs[vc.name] = entry
        out: dict[str, Any] = {
            "physicalCluster": {
                "cellTypes": types,
                "physicalCells": [cell(c, True) for c in self.physical_cells],
            },
            "virtualClusters": vcs,
        }
        if self.options != StoreOptions():  # the default is left out: older digests hold
            out["storeOptions"] = self.options.to_dict()
        return out

    def to_yaml(self) -> str:
        """YAML text that parses to this configuration (``to_dict(compact=True)``)."""
        text: str = yaml.dump(self.to_dict(compact=True), Dumper=_YAML_DUMPER, sort_keys=False,
                              default_flow_style=None)
        return text


class _InferredNodes:
    """Whether a node-level cell's children are exactly those parsing infers when they are
    left out (then ``to_dict(compact=True)`` leaves them out)."""

    __slots__ = ("_children", "_types")

    def __init__(self, types: Mapping[str, CellTypeSpec]) -> None:
        self._types = types
        self._children: dict[str, tuple[PhysicalCellSpec, ...]] = {}

    def matches(self, spec: PhysicalCellSpec) -> bool:
        type_spec = self._types.get(spec.cell_type)
        if type_spec is None or not type_spec.is_node_level:
            return False
        children = self._children.get(spec.cell_type)
        if children is None:
            builder = _CellBuilder(self._types)
            children = builder.top({"cellType": spec.cell_type, "cellAddress": "n"}, 0).children
            self._children[spec.cell_type] = children
        return spec.children == children


# --------------------------------------------------------------------------- parsing


def load_config(path: str | Path) -> ClusterConfig:
    """Read and validate a HiveD-format YAML file."""
    return parse_config(Path(path).read_text())


def parse_config(source: str | Mapping[str, Any]) -> ClusterConfig:
    """Validate a HiveD-format configuration given as YAML text or as the parsed mapping."""
    if isinstance(source, str):
        key = hashlib.sha256(source.encode()).digest()
        cached = _parsed.get(key)
        if cached is not None:
            _parsed.move_to_end(key)
            return cached
        config = _parse_text(source)
        _parsed[key] = config
        while len(_parsed) > _PARSED_CACHE_SIZE:
            _parsed.popitem(last=False)
        return config
    return _parse_mapping(source)


def _parse_text(source: str) -> ClusterConfig:
    raw: object = None
    if source.lstrip().startswith("{"):
        # JSON is YAML too, and the json module reads it tens of times faster than libyaml
        # (generated 100k-GPU files may be written as JSON); anything else goes to YAML.
        with contextlib.suppress(ValueError):
            raw = json.loads(source)
    if raw is None:
        try:
            # libyaml's loader when present: a reconfiguration parses the text in the apply
            # path, and the pure-Python loader takes seconds for a 1000-node file.
            raw = yaml.load(source, Loader=_YAML_LOADER)  # a safe loader, C or Python
        except yaml.YAMLError as exc:
            raise GpuConfigError(f"configuration is not valid YAML: {exc}") from None
    return _parse_mapping(raw)


#: the keys each mapping of a configuration may hold: the store's, and those HiveD's
#: ``pkg/api`` reads that the store ignores (the scheduler's own settings, OpenPAI's
#: ``skuTypes``), so a HiveD file loads as it is
_ROOT_KEYS: Final = frozenset({
    "physicalCluster", "virtualClusters", "storeOptions",
    "kubeApiServerAddress", "kubeConfigFilePath", "webServerAddress",
    "waitingPodSchedulingBlockMilliSec", "forcePodBindThreshold",
})
_PHYSICAL_KEYS: Final = frozenset({"cellTypes", "physicalCells", "skuTypes"})
_CELL_TYPE_KEYS: Final = frozenset({"childCellType", "childCellNumber", "isNodeLevel"})
_CELL_KEYS: Final = frozenset({"cellType", "cellAddress", "cellChildren", "pinnedCellId"})
_VC_KEYS: Final = frozenset({"virtualCells", "pinnedCells"})
_VIRTUAL_CELL_KEYS: Final = frozenset({"cellType", "cellNumber"})
_PINNED_KEYS: Final = frozenset({"pinnedCellId"})


def _parse_mapping(source: object) -> ClusterConfig:
    root = _mapping(source, "configuration", _ROOT_KEYS)
    physical = _mapping(root.get("physicalCluster"), "physicalCluster", _PHYSICAL_KEYS)
    types = _parse_cell_types(physical.get("cellTypes"))
    levels = _check_forest(types)
    raw_cells = physical.get("physicalCells")
    if not isinstance(raw_cells, list) or not raw_cells:
        raise GpuConfigError("physicalCluster.physicalCells must be a non-empty list")
    for index, top_raw in enumerate(raw_cells):  # check each chain before building its cells
        top_type = _mapping(top_raw, f"physicalCells[{index}]").get("cellType")
        if isinstance(top_type, str) and top_type in types:
            _check_node_level(top_type, types)
    builder = _CellBuilder(types)
    cells = tuple(builder.top(raw, index) for index, raw in enumerate(raw_cells))
    chains = sorted({c.cell_type for c in cells})
    vcs = _parse_vcs(root.get("virtualClusters"), types, set(chains), builder.pinned)
    config = ClusterConfig(
        cell_types=tuple(types[name] for name in sorted(types)),
        physical_cells=cells,
        virtual_clusters=vcs,
        options=_parse_options(root.get("storeOptions")),
    )
    for chain in chains:
        _check_fit(config, chain, types, levels)
    return config


def _parse_options(raw: object) -> StoreOptions:
    table = _mapping({} if raw is None else raw, "storeOptions")
    known = {"reservations", "initialNodeHealth"}
    unknown = sorted(str(k) for k in table if k not in known)
    if unknown:  # a typo here would silently change how the store behaves
        raise GpuConfigError(f"storeOptions: unknown option(s) {', '.join(unknown)}")
    reservations = table.get("reservations", RESERVE_UNTIL_CONFIRMED)
    if reservations not in (RESERVE_UNTIL_CONFIRMED, RESERVE_PLACE_AT_ONCE):
        raise GpuConfigError(
            f"storeOptions.reservations must be {RESERVE_UNTIL_CONFIRMED} or "
            f"{RESERVE_PLACE_AT_ONCE}, not {reservations!r}"
        )
    health = table.get("initialNodeHealth", NODES_START_HEALTHY)
    if health not in (NODES_START_HEALTHY, NODES_START_BAD):
        raise GpuConfigError(
            f"storeOptions.initialNodeHealth must be {NODES_START_HEALTHY} or "
            f"{NODES_START_BAD}, not {health!r}"
        )
    return StoreOptions(reservations=reservations, initial_node_health=health)


def _mapping(value: object, where: str, keys: frozenset[str] | None = None
             ) -> Mapping[str, Any]:
    """``value`` as a mapping holding only ``keys`` (any, when None)."""
    if not isinstance(value, Mapping):
        raise GpuConfigError(f"{where} must be a mapping")
    if keys is not None and not keys.issuperset(value):
        unknown = sorted(str(key) for key in value if key not in keys)
        near = difflib.get_close_matches(unknown[0], sorted(keys), n=1)
        raise GpuConfigError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)}"
                             + (f" (did you mean {near[0]}?)" if near else "")
                             + f"; known: {', '.join(sorted(keys))}")
    return value


def _int(value: object, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise GpuConfigError(f"{where} must be an integer >= {minimum}, not {value!r}")
    return value


def _name(value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float) or value == "":
        raise GpuConfigError(f"{where} must be a non-empty name, not {value!r}")
    return str(value)


def _parse_cell_types(raw: object) -> dict[str, CellTypeSpec]:
    table = _mapping(raw, "physicalCluster.cellTypes")
    types: dict[str, CellTypeSpec] = {}
    for name_raw, spec_raw in table.items():
        name = _name(name_raw, "a cell type name")
        where = f"cell type {name}"
        spec = _mapping(spec_raw, where, _CELL_TYPE_KEYS)
        node = spec.get("isNodeLevel", False)
        if not isinstance(node, bool):
            raise GpuConfigError(f"{where}: isNodeLevel must be true or false")
        types[name] = CellTypeSpec(
            name=name,
            child_type=_name(spec.get("childCellType"), f"{where}: childCellType"),
            child_number=_int(spec.get("childCellNumber"), f"{where}: childCellNumber", 1),
            is_node_level=node,
        )
    return types


def _check_forest(types: Mapping[str, CellTypeSpec]) -> dict[str, int]:
    """Every type must reach a leaf type by following child types: no cycles. Returns the
    level of every type (leaf types are level 1)."""
    levels: dict[str, int] = {}
    for name in sorted(types):
        path = [name]
        current = name
        while current in types and current not in levels:
            current = types[current].child_type
            if current in path:
                cycle = " -> ".join([*path[path.index(current):], current])
                raise GpuConfigError(f"cell types are not a forest: cycle {cycle}")
            path.append(current)
        level = levels.get(current, 1)  # a leaf type, or a type already measured
        for t in reversed(path[:-1]):
            level += 1
            levels[t] = level
    return levels


def _chain_path(chain: str, types: Mapping[str, CellTypeSpec]) -> list[str]:
    path = [chain]
    while path[-1] in types:
        path.append(types[path[-1]].child_type)
    return path


def _check_node_level(chain: str, types: Mapping[str, CellTypeSpec]) -> None:
    path = _chain_path(chain, types)
    nodes = [t for t in path if t in types and types[t].is_node_level]
    if len(nodes) != 1:
        raise GpuConfigError(
            f"physical cell chain {chain}: {len(nodes)} node-level types on "
            f"{' -> '.join(path)} (need exactly one isNodeLevel type)"
        )


class _CellBuilder:
    """Infers omitted children and addresses, and checks addresses and pinned ids."""

    def __init__(self, types: Mapping[str, CellTypeSpec]) -> None:
        self.types = types
        self.pinned: dict[str, tuple[str, str]] = {}  # pinned id -> (chain, full address)
        self.nodes: dict[tuple[str, str], str] = {}  # (leaf type, node name) -> full address
        self.addresses: set[str] = set()
        # Cells inside a node with nothing given (``{}``) are the same subtree on every node of
        # a type (addresses restart at the node), and specs are immutable: built once, shared.
        # 12,288 nodes x 8 GPUs is 170k such cells; this keeps parsing proportional to nodes.
        self.inferred: dict[tuple[str, int], PhysicalCellSpec] = {}
        #: the leaf type of each node-level type (looked up once per node)
        self.leaf_types: dict[str, str] = {}
        #: the children (by the ids of their spec objects) of nodes whose device indices were
        #: checked: nodes of shared inferred children have the same ones
        self.devices_checked: set[tuple[int, ...]] = set()

    def top(self, raw: object, index: int) -> PhysicalCellSpec:
        where = f"physicalCells[{index}]"
        spec = _mapping(raw, where, _CELL_KEYS)
        cell_type = spec.get("cellType")
        if cell_type is None:
            raise GpuConfigError(f"{where}: cellType is required for a top-level physical cell")
        cell_type = _name(cell_type, f"{where}: cellType")
        if cell_type not in self.types:
            raise GpuConfigError(f"{where}: unknown cell type {cell_type!r}")
        return self._cell(spec, cell_type, cell_type, index, (), where, below_node=False)

    def _cell(
        self,
        spec: Mapping[str, Any],
        cell_type: str,
        chain: str,
        default: int,
        parents: tuple[str, ...],
        where: str,
        below_node: bool,
    ) -> PhysicalCellSpec:
        if below_node and not spec:
            shared = self.inferred.get((cell_type, default))
            if shared is not None:
                # Its own full address still counts (a sibling may name it explicitly); the
                # ones below it are unique by construction (siblings' addresses are checked).
                full = "/".join((*parents, shared.address))
                if full in self.addresses:
                    raise GpuConfigError(
                        f"physical cell {full} ({cell_type}): duplicate cell address {full}"
                    )
                self.addresses.add(full)
                return shared
        raw_address = spec.get("cellAddress")
        address = (
            str(default) if raw_address is None else _name(raw_address, f"{where}: cellAddress")
        )
        if "/" in address:
            raise GpuConfigError(f"{where}: cellAddress {address!r} must not contain '/'")
        path = (*parents, address)
        full = "/".join(path)
        declared = spec.get("cellType")
        if declared is not None and str(declared) != cell_type:
            raise GpuConfigError(
                f"physical cell {full}: cellType {declared!r} is not the child type "
                f"{cell_type!r} of its parent (unknown child type)"
            )
        where = f"physical cell {full} ({cell_type})"
        if full in self.addresses:
            raise GpuConfigError(f"{where}: duplicate cell address {full}")
        self.addresses.add(full)
        pinned = spec.get("pinnedCellId")
        pinned_id = "" if pinned is None else _name(pinned, f"{where}: pinnedCellId")
        if pinned_id:
            if pinned_id in self.pinned:
                raise GpuConfigError(
                    f"{where}: duplicate pinnedCellId {pinned_id!r} "
                    f"(also on {self.pinned[pinned_id][1]})"
                )
            self.pinned[pinned_id] = (chain, full)
        children_raw = spec.get("cellChildren")
        if cell_type not in self.types:  # a leaf: one device; its address is the device index
            if children_raw:
                raise GpuConfigError(f"{where}: a leaf cell has no cellChildren")
            if not address.isdigit():
                raise GpuConfigError(f"{where}: a leaf cell's address must be its device index")
            leaf_cell = PhysicalCellSpec(cell_type=cell_type, address=address,
                                         pinned_id=pinned_id)
            if below_node and not spec:
                self.inferred[(cell_type, default)] = leaf_cell
            return leaf_cell
        type_spec = self.types[cell_type]
        if type_spec.is_node_level:
            if raw_address is None:
                raise GpuConfigError(
                    f"{where}: a node-level cell needs a cellAddress (its node name)")
            leaf = self.leaf_types.get(cell_type, "")
            if not leaf:
                leaf = self.leaf_types[cell_type] = _chain_path(cell_type, self.types)[-1]
            key = (leaf, address)
            if key in self.nodes:
                raise GpuConfigError(
                    f"{where}: duplicate node address {address} for leaf type {leaf} "
                    f"(also {self.nodes[key]})"
                )
            self.nodes[key] = full
        number = type_spec.child_number
        if not children_raw:  # omitted (or empty, as HiveD reads it): every child inferred
            children_raw = [{}] * number
        # Fewer children than childCellNumber is a partly filled cell (a rack with two of its
        # three nodes), as HiveD accepts; see ``Topology.complete`` for what it may hold.
        if not isinstance(children_raw, list) or len(children_raw) > number:
            raise GpuConfigError(
                f"{where}: cellChildren must list at most {number} cells "
                f"(childCellNumber of {cell_type})"
            )
        # Default child addresses restart at the node; above it they go on from the
        # top-level cell's index (HiveD's inferPhysicalCellSpec).
        base = 0 if type_spec.is_node_level else default
        children = []
        seen: set[str] = set()
        for i, child_raw in enumerate(children_raw):
            child_spec = _mapping({} if child_raw is None else child_raw, f"{where}: child {i}",
                                  _CELL_KEYS)
            child = self._cell(
                child_spec,
                type_spec.child_type,
                chain,
                base * number + i,
                path,
                f"{where}: child {i}",
                below_node or type_spec.is_node_level,
            )
            if child.address in seen:
                raise GpuConfigError(f"{where}: duplicate child address {child.address}")
            seen.add(child.address)
            children.append(child)
        cell = PhysicalCellSpec(
            cell_type=cell_type, address=address, pinned_id=pinned_id, children=tuple(children)
        )
        shared_children = tuple(map(id, cell.children))
        if type_spec.is_node_level and shared_children not in self.devices_checked:
            # a leaf's address is its device index on the node
            devices = [int(a) for a in _leaf_addresses(cell)]
            twice = sorted({d for d in devices if devices.count(d) > 1})
            if twice:
                raise GpuConfigError(f"{where}: device index {twice[0]} used twice")
            # (the child specs stay alive in the configuration: their ids stay theirs)
            self.devices_checked.add(shared_children)
        if below_node and not spec:
            self.inferred[(cell_type, default)] = cell
        return cell


def _leaf_addresses(cell: PhysicalCellSpec) -> list[str]:
    if not cell.children:
        return [cell.address]
    return [a for child in cell.children for a in _leaf_addresses(child)]


def _parse_vcs(
    raw: object,
    types: Mapping[str, CellTypeSpec],
    chains: set[str],
    pinned: Mapping[str, tuple[str, str]],
) -> tuple[VirtualClusterSpec, ...]:
    table = _mapping({} if raw is None else raw, "virtualClusters")
    owner: dict[str, str] = {}
    out = []
    for name_raw in table:
        name = _name(name_raw, "a virtual cluster name")
        where = f"virtual cluster {name}"
        spec = _mapping(table[name_raw] if table[name_raw] is not None else {}, where,
                        _VC_KEYS)
        merged: dict[tuple[str, ...], int] = {}
        cells_raw = spec.get("virtualCells") or []
        if not isinstance(cells_raw, list):
            raise GpuConfigError(f"{where}: virtualCells must be a list")
        for i, cell_raw in enumerate(cells_raw):
            cell = _mapping(cell_raw, f"{where}: virtualCells[{i}]", _VIRTUAL_CELL_KEYS)
            type_name = _name(cell.get("cellType"), f"{where}: virtualCells[{i}].cellType")
            path = tuple(type_name.split("."))
            if path[0] not in chains:
                raise GpuConfigError(
                    f"{where}: virtual cell type {type_name!r} must begin with a chain "
                    f"(a top-level physical cell type: {', '.join(sorted(chains))})"
                )
            for parent, child in itertools.pairwise(path):
                if parent not in types or types[parent].child_type != child:
                    raise GpuConfigError(
                        f"{where}: virtual cell type {type_name!r} is not a path of the cell "
                        f"hierarchy ({child} is not the child type of {parent})"
                    )
            number = _int(cell.get("cellNumber"), f"{where}: {type_name} cellNumber", 0)
            if number:
                merged[path] = merged.get(path, 0) + number
        pins_raw = spec.get("pinnedCells") or []
        if not isinstance(pins_raw, list):
            raise GpuConfigError(f"{where}: pinnedCells must be a list")
        pins = []
        for i, pin_raw in enumerate(pins_raw):
            pin = _name(
                _mapping(pin_raw, f"{where}: pinnedCells[{i}]", _PINNED_KEYS).get("pinnedCellId"),
                f"{where}: pinnedCells[{i}].pinnedCellId",
            )
            if pin not in pinned:
                raise GpuConfigError(f"{where}: unknown pinnedCellId {pin!r}")
            if pin in owner:
                raise GpuConfigError(
                    f"{where}: pinnedCellId {pin!r} is already used by virtual cluster {owner[pin]}"
                )
            owner[pin] = name
            pins.append(pin)
        cells = tuple(
            VirtualCellSpec(path=path, number=number) for path, number in sorted(merged.items())
        )
        out.append(
            VirtualClusterSpec(name=name, virtual_cells=cells, pinned_cells=tuple(sorted(pins)))
        )
    return tuple(sorted(out, key=lambda vc: vc.name))


def is_complete(cell: PhysicalCellSpec, types: Mapping[str, CellTypeSpec]) -> bool:
    """Whether ``cell`` holds every child its type calls for, all the way down (a partly
    filled cell does not)."""
    spec = types.get(cell.cell_type)
    if spec is None:
        return True
    return len(cell.children) == spec.child_number and all(
        is_complete(child, types) for child in cell.children
    )


def _check_fit(
    config: ClusterConfig, chain: str, types: Mapping[str, CellTypeSpec], levels: Mapping[str, int]
) -> None:
    """HiveD's initial feasibility check (``initCellNums``), after binding pinned cells:
    going down the chain, the cells left over at a level are split for the levels below.
    A partly filled cell cannot be handed out whole, so it counts as split from the start:
    only its complete pieces are obtainable (HiveD counts it as whole, which can overpromise)."""
    top = levels[chain]
    free = [0] * (top + 1)  # free[l]: maximal complete cells at level l that hold no pinned cell
    pinned_ids = {p for vc in config.virtual_clusters for p in vc.pinned_cells}
    # Cells (by id) found whole: nothing counted under them, so a subtree shared by many
    # nodes (the parser's inferred cells) is walked once.
    whole_cells: set[int] = set()

    def walk(cell: PhysicalCellSpec, level: int) -> bool:
        """Counts the maximal free pieces under ``cell``; True if ``cell`` is not one (it
        holds a pinned cell or is partly filled)."""
        if id(cell) in whole_cells:
            return False
        if cell.pinned_id in pinned_ids:
            if not is_complete(cell, types):
                raise GpuConfigError(
                    f"pinned cell {cell.pinned_id} ({cell.cell_type}) is partly filled: a "
                    f"pinned cell must list every child of its type"
                )
            return True
        whole = [not walk(child, level - 1) for child in cell.children]
        spec = types.get(cell.cell_type)
        if all(whole) and (spec is None or len(whole) == spec.child_number):
            whole_cells.add(id(cell))
            return False
        free[level - 1] += whole.count(True)
        return True

    for cell in config.physical_cells:
        if cell.cell_type == chain and not walk(cell, top):
            free[top] += 1
    demand = [0] * (top + 1)
    claims: dict[str, dict[int, int]] = {}  # vc -> level -> cells
    for vc in config.virtual_clusters:
        for v in vc.virtual_cells:
            if v.chain == chain:
                level = levels.get(v.cell_type, 1)
                demand[level] += v.number
                mine = claims.setdefault(vc.name, {})
                mine[level] = mine.get(level, 0) + v.number
    path = _chain_path(chain, types)  # path[i] has level top - i
    surplus = 0
    for level in range(top, 0, -1):
        child_number = types[path[top - level - 1]].child_number if level < top else 0
        available = free[level] + surplus * child_number
        surplus = available - demand[level]
        if surplus < 0:
            # Every claim at this level or above competes for these cells: name them all.
            who = "; ".join(
                f"{vc} " + ", ".join(f"{n} x {path[top - lv]}" for lv, n in sorted(mine.items()))
                for vc, mine in sorted(claims.items())
                if any(lv >= level for lv in mine)
            )
            raise GpuConfigError(
                f"virtual clusters do not fit in chain {chain} at level {level} "
                f"({path[top - level]}): they claim {demand[level]} cells, "
                f"{available} are obtainable; the VCs claiming this level or above: {who}"
            )


# --------------------------------------------------------------------------- synthetic


def synthetic_config(
    *,
    nodes: int = 1024,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 8,
    vcs: int = 16,
    pinned: int = 0,
    leaf_type: str = "V100",
) -> ClusterConfig:
    """A DGX-like cluster: ``nodes`` nodes of ``gpus_per_node`` leaves in racks of
    ``nodes_per_rack``, one chain ``<leaf>-RACK``, shared by ``vcs`` virtual clusters.

    Inside a node the leaves are paired up level by level while the count stays even (8 GPUs:
    2-GPU switches, 4-GPU sockets, node). Each VC is promised an equal share of the nodes
    (``nodes // vcs``): about half of it as whole racks, the rest as single nodes, one of which
    is given as two half-node cells where the hierarchy has them. The first ``pinned`` VCs get
    one node of their share as a pinned cell ``<vc>-PIN`` (taken from the last racks).
    """
    if min(nodes, gpus_per_node, nodes_per_rack, vcs) < 1 or pinned < 0:
        raise GpuConfigError("synthetic_config: sizes must be positive")
    if nodes % nodes_per_rack:
        raise GpuConfigError(
            f"synthetic_config: {nodes} nodes do not fill racks of {nodes_per_rack}")
    share = nodes // vcs
    if share < 1 or pinned > vcs or pinned > share * vcs:
        raise GpuConfigError(f"synthetic_config: {nodes} nodes cannot be shared by {vcs} VCs")
    types: dict[str, Any] = {}
    child, size, half = leaf_type, 1, ""
    while gpus_per_node % (size * 2) == 0 and size * 2 < gpus_per_node:
        name = f"{leaf_type}-{size * 2}GPU"
        types[name] = {"childCellType": child, "childCellNumber": 2}
        child, size = name, size * 2
    if size * 2 == gpus_per_node:
        half = child
    node_type, rack_type = f"{leaf_type}-NODE", f"{leaf_type}-RACK"
    types[node_type] = {
        "childCellType": child,
        "childCellNumber": gpus_per_node // size,
        "isNodeLevel": True,
    }
    types[rack_type] = {"childCellType": node_type, "childCellNumber": nodes_per_rack}
    names = [f"vc{k:02d}" for k in range(vcs)]
    pins = {nodes - 1 - k: names[k] for k in range(pinned)}
    racks = []
    for r in range(nodes // nodes_per_rack):
        children = []
        for i in range(nodes_per_rack):
            n = r * nodes_per_rack + i
            node: dict[str, Any] = {"cellAddress": f"node{n:04d}"}
            if n in pins:
                node["pinnedCellId"] = f"{pins[n]}-PIN"
            children.append(node)
        racks.append(
            {"cellType": rack_type, "cellAddress": f"rack{r:03d}", "cellChildren": children}
        )
    virtual: dict[str, Any] = {}
    for k, name in enumerate(names):
        remaining = share - (1 if k < pinned else 0)
        whole_racks = remaining // nodes_per_rack // 2
        remaining -= whole_racks * nodes_per_rack
        halves = 2 if half and remaining >= 2 else 0
        remaining -= halves // 2
        cells = []
        if whole_racks:
            cells.append({"cellType": rack_type, "cellNumber": whole_racks})
        if remaining:
            cells.append({"cellType": f"{rack_type}.{node_type}", "cellNumber": remaining})
        if halves:
            cells.append({"cellType": f"{rack_type}.{node_type}.{half}", "cellNumber": halves})
        entry: dict[str, Any] = {"virtualCells": cells}
        if k < pinned:
            entry["pinnedCells"] = [{"pinnedCellId": f"{name}-PIN"}]
        virtual[name] = entry
    return parse_config(
        {
            "physicalCluster": {"cellTypes": types, "physicalCells": racks},
            "virtualClusters": virtual,
        }
    )
