"""The allocation state machine: affinity groups, priorities, preemption, node health.

Theory of operation
-------------------
Everything here is deterministic: no clock, no randomness, and every choice is made in a
sorted order, so replicas applying the same log end up byte-identical. The state that matters
is small — the groups (who holds which leaves, at what priority, who preempts whom), which VC
item is bound to which physical cell, node health — and everything else (free lists, counters,
indexes, doomed bindings) is a function of it (see ``buddy``), which is what snapshots store.

**Groups.** A group is *placed* (it uses its leaves) or *preempting* (it reserves them while
its victims wind down). Guaranteed groups (priority 0..1000) live inside their VC's items;
opportunistic ones (-1) take any free leaf of a chain and bind nothing.

**Submitting a guaranteed group** (HiveD's two passes, inside the VC's view):

1. *Free leaves only.* Levels are tried bottom-up from the smallest that can hold the whole
   gang; at each level, first the cells of items the VC already holds (fewest free leaves
   first: packing), then a fresh item bound by buddy allocation to an untouched physical cell.
   The first level that works gives the lowest common ancestor. A gang that fits in no single
   cell is spread over the VC's items (bound ones first). The gang never leaves one chain.
2. *Preemptible leaves too* (effective priority strictly below the group's). Victims are the
   users of the chosen leaves (whole gangs); lower preemptors holding reservations there are
   cancelled. With victims the group becomes *preempting* and reserves its leaves, so nobody
   but a still higher priority can take them. Once its last victim is released it is
   *reserved* (HiveD's Reserved cells of a Preempting group) until its scheduler confirms it
   with a second submit or a bind of exactly those leaves, which places it; a higher
   priority overlapping it meanwhile cancels the reservation rather than preempting a running
   group. ``storeOptions.reservations: immediate`` places it as its last victim leaves
   instead. Without victims it is placed at once.
3. *Lazy preemption*: victims that opted in are first downgraded to opportunistic (they keep
   running, their items are released) and the group is planned again; only a victim that the
   new plan still overlaps is preempted. If the new plan fails the downgrade is undone.

**Suggested nodes** (Kubernetes' filter or preemption candidates, HiveD's ``suggestedNodes``)
confine a new group to those nodes: every pass above packs on them only, a fresh item is
bound to the first cell (in buddy order) holding one of them where the gang fits, the next if
it does not (HiveD's backtracking buddy allocation), and the other chains and leaf types are
tried before the group waits. A placed group keeps its placement whatever is suggested (HiveD
insists on it); a preempting or reserved one whose leaves are not all on suggested nodes is
cancelled and planned again, except in a dry run (HiveD's filtering phase). Suggesting every
node places as suggesting none does (the cells a fresh item could be bound to differ in
nothing a healthy gang needs, so the first is as good as the next).

**Releasing** removes a group's leaves; items no guaranteed group uses any more are unbound,
so their physical cells return to the free lists and merge. Releasing a group that something
preempts may complete that preemption.

**Node health** marks leaves bad (used ones stay with their group: the decision is kept);
preempting groups touching the node are cancelled, and doomed bindings are recomputed. With
``storeOptions.initialNodeHealth: bad`` every node starts bad until reported healthy (as
HiveD trusts only what Kubernetes reports); a report about a node the configuration does not
know is ignored with a warning.

**Reconfiguration** builds the allocator of a new topology holding the same groups, keeping
their GPUs (``cluster_state.reconfiguration``, through ``mark_bad``, ``bind_tentatively``,
``bind_at`` and ``adopt`` here).

**What this module owns** is the write path: every change of the groups, the cells' holders
and priorities, the bindings and node health goes through an ``Allocator`` method, which keeps
the derived structures (``index``, ``buddy``) in step, and snapshots (``export_state``,
``import_state``). The read models computed from that state are ``cluster_state.reads`` (status
documents) and ``cluster_state.inspection`` (HiveD's inspect trees); the ``group_info`` &c.
methods here only call them.

**Smaller decisions.** A gang asking a pinned cell for more leaves than it holds is refused
(HiveD lets it wait for ever). A gang of mixed member sizes is packed best-fit decreasing and
may be placed where HiveD's smallest-pod-first scheduler would wait for a whole node set.

**Conditional bind** places a group at an explicit placement chosen by an outside scheduler,
provided none of its leaves changed after a revision the scheduler read.

**Incarnations and claims.** A group remembers the log position that created it (its
*incarnation*: a gang released and submitted again under the same name is another one), and a
placed group the pod that claimed each of its member pods (``claim``: slot -> pod UID, a
compare-and-set conditional on the incarnation; see ``cluster_state.ops``). Claims change no
cell: they are the schedulers' record of which pod runs on which member's GPUs, kept here so
that every scheduler sharing the store agrees on it.

Requests that are invalid raise ``RequestError`` before anything changes.
"""

from __future__ import annotations

import logging
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from types import MappingProxyType
from typing import Any

import msgpack

from cluster_state import inspection, reads
from cluster_state.buddy import CLEAN, HEALTHY, Buddy
from cluster_state.cells import Topology
from cluster_state.config import RESERVE_PLACE_AT_ONCE
from cluster_state.errors import RequestError
from cluster_state.index import C_LOOP_ITEMS, FREE, CellState
from cluster_state.ops import (
    OPPORTUNISTIC,
    Claimed,
    Conflict,
    GroupSpec,
    Member,
    NodeHealthSet,
    Placed,
    Pod,
    PodPlacement,
    Preempting,
    Released,
    Result,
    Waiting,
    new_placed,
    new_released,
)
from cluster_state.placement import NodeFilter, Picker, pick_free
from cluster_state.snapshot_encoding import pack, packed_array_header
from consensus.loop_share import give_way

__all__ = ["Allocator", "Group", "placed_data"]

#: a claim's holder: (pod UID, "namespace/name")
ClaimHolder = tuple[str, str]

_log = logging.getLogger(__name__)


#: the typecode of a snapshot's packed leaf revisions (signed 64-bit: -1 is "never changed")
_REV_TYPECODE = "q"
#: the fields of a group's snapshot record (``Group.record``)
_RECORD_FIELDS = 11
#: the attributes of a ``Group`` a snapshot does not record (setting them keeps its packed
#: record)
_OUTSIDE_RECORD = frozenset({"preemptors", "_spec_wire", "_packed"})


def _state_rest(topo: Topology, item_root: Mapping[int, int], doomed: Sequence[bool],
                bad_nodes: Iterable[str], rev: Sequence[int]) -> list[Any]:
    """A snapshot's state after the groups, from the allocator's ``cells.item_root``,
    ``buddy.doomed``, ``bad_nodes`` and ``cells.rev`` (or copies of them): the bindings,
    the bad nodes and the leaves' revisions."""
    # the bound items (``item_root``: a VC's items at 100k GPUs are tens of thousands, most
    # of them unbound)
    items = topo.items
    bindings = [
        [item, cell]
        for item, cell in sorted(item_root.items())
        if not doomed[item] and not items[item].pinned_id
    ]
    # Every leaf's revision as packed 64-bit integers: one C call instead of a pair per
    # changed leaf (100k leaves).
    leaf_ids = topo.leaf_ids
    revs = array(_REV_TYPECODE, itemgetter(*leaf_ids)(rev) if len(leaf_ids) > 1
                 else [rev[c] for c in leaf_ids]).tobytes()
    return [bindings, sorted(bad_nodes), revs]


_new_tuple = tuple.__new__
#: most ``Pod``s an allocator keeps (``Allocator._pod``; it starts again when full)
PODS_KEPT = 4096


def _order(sizes: list[int]) -> list[int]:
    """The pods of ``sizes`` in the order they are packed: largest first, then as given."""
    if len(sizes) == 1:
        return [0]
    return sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))


def _per_item(item_of: list[int], leaves: list[int]) -> Iterable[tuple[int, int]]:
    """(item, how many of ``leaves`` it holds) for each item holding some, in the order
    first met (a group's leaves are mostly in one item: counted in C)."""
    items = list(map(item_of.__getitem__, leaves))
    if items and items.count(items[0]) == len(items):
        return ((items[0], len(items)),)
    return Counter(items).items()


def placed_data(placed: Placed) -> list[Any]:
    """The data of a ``placed`` (or ``trimmed``) event: chain, pods, token."""
    return [placed.chain, [[n, node, list(d)] for n, node, d in placed.pods], placed.token]


class Group:
    """One affinity group the store knows: placed or preempting."""

    __slots__ = (
        "_packed",
        "_spec_wire",
        "chain",
        "claims",
        "created",
        "downgraded",
        "downgraded_at",
        "downgraded_by",
        "pods",
        "preempting",
        "preemptors",
        "spec",
        "token",
        "victims",
    )

    spec: GroupSpec
    chain: int
    pods: tuple[tuple[int, ...], ...]  # leaf ids per pod, pods in ``spec.pod_sizes`` order
    preempting: bool
    downgraded: bool  # lazily preempted: now runs as opportunistic
    downgraded_at: int  # ... at this log position
    downgraded_by: str  # ... for this preemptor ("" for a reconfiguration)
    token: int  # log position it was placed at
    # (The containers a snapshot records are immutable: a change is an assignment, which
    # ``__setattr__`` sees.)
    victims: frozenset[str]  # preempting: groups it waits for
    preemptors: set[str]  # placed: preempting groups waiting for it
    created: int  # log position that created it (its incarnation)
    claims: Mapping[int, ClaimHolder]  # placed: member pod slot -> the pod holding it
    _spec_wire: tuple[GroupSpec, list[Any]] | None
    _packed: bytes | None

    def __init__(self, spec: GroupSpec, chain: int, pods: tuple[tuple[int, ...], ...], *,
                 token: int = -1, created: int = -1) -> None:
        # set past ``__setattr__`` (nothing is packed yet), through the slots' descriptors
        # (``_group_setters``): a restore makes thousands, every placement one
        (set_spec, set_chain, set_pods, set_preempting, set_downgraded, set_downgraded_at,
         set_downgraded_by, set_token, set_victims, set_preemptors, set_created, set_claims,
         set_spec_wire, set_packed) = _group_setters
        set_spec(self, spec)
        set_chain(self, chain)
        set_pods(self, pods)
        set_preempting(self, False)
        set_downgraded(self, False)
        set_downgraded_at(self, -1)
        set_downgraded_by(self, "")
        set_token(self, token)
        set_victims(self, _NO_VICTIMS)
        set_preemptors(self, set())
        set_created(self, created)
        set_claims(self, _NO_CLAIMS)
        set_spec_wire(self, None)
        set_packed(self, None)

    def load(self, record: list[Any]) -> None:
        """Take the facts of a snapshot's ``record()`` of the group after its spec, chain
        and pods (older formats: fewer; past ``__setattr__``, like ``__init__``)."""
        init = object.__setattr__
        preempting, downgraded, _, token, victims = record[2:7]
        init(self, "preempting", preempting)
        init(self, "downgraded", downgraded)
        init(self, "token", token)
        init(self, "victims", frozenset(victims))
        if len(record) > 7:  # snapshot format 1 did not record when and by whom
            init(self, "downgraded_at", record[7])
            init(self, "downgraded_by", record[8])
        if len(record) > 9:  # incarnation and claims (older snapshots: none recorded)
            init(self, "created", int(record[9]))
            init(self, "claims", MappingProxyType(
                {int(s): (str(uid), str(pod)) for s, uid, pod in record[10]}))
        elif not preempting:
            init(self, "created", token)

    def __setattr__(self, name: str, value: Any) -> None:
        # Any change of what the snapshot records drops the record packed for it.
        object.__setattr__(self, name, value)
        if name not in _OUTSIDE_RECORD:
            object.__setattr__(self, "_packed", None)

    def spec_wire(self) -> list[Any]:
        """``spec.to_wire()``, kept (snapshots ask for it every time)."""
        kept = self._spec_wire
        if kept is None or kept[0] is not self.spec:
            kept = (self.spec, self.spec.to_wire())
            object.__setattr__(self, "_spec_wire", kept)  # (outside the record)
        return kept[1]

    def record(self) -> list[Any]:
        """What a snapshot records of the group (``Allocator.export_state``)."""
        return [
            self.spec_wire(),
            self.chain,
            self.preempting,
            self.downgraded,
            self.pods,
            self.token,
            sorted(self.victims) if self.victims else [],
            self.downgraded_at,
            self.downgraded_by,
            self.created,
            [[slot, uid, pod] for slot, (uid, pod) in sorted(self.claims.items())]
            if self.claims else [],
        ]

    def packed(self) -> bytes:
        """``record()`` packed, kept until the group changes (a snapshot packs only the
        groups that changed since the last one)."""
        packed = self._packed
        if packed is None:
            packed = pack(self.record())
            object.__setattr__(self, "_packed", packed)
        return packed

    def keep_packed(self, packed: bytes) -> None:
        """Take ``packed`` as ``packed()`` (a restore: the snapshot's own bytes of the record
        the group was made from)."""
        object.__setattr__(self, "_packed", packed)

    @property
    def priority(self) -> int:
        return OPPORTUNISTIC if self.downgraded else self.spec.priority

    @property
    def guaranteed(self) -> bool:
        return self.priority >= 0

    @property
    def reserved(self) -> bool:
        """A preemptor whose victims are all gone, waiting for the scheduler to confirm it."""
        return self.preempting and not self.victims

    @property
    def state(self) -> str:
        if not self.preempting:
            return "placed"
        return "preempting" if self.victims else "reserved"

    def leaves(self) -> list[int]:
        return [leaf for pod in self.pods for leaf in pod]


#: every slot of a ``Group`` in the order ``Group.__init__`` sets them, and their setters
_GROUP_FIELDS = ("spec", "chain", "pods", "preempting", "downgraded", "downgraded_at",
                 "downgraded_by", "token", "victims", "preemptors", "created", "claims",
                 "_spec_wire", "_packed")
if sorted(_GROUP_FIELDS) != sorted(Group.__slots__):
    raise TypeError("Group.__init__ must set every slot of a Group")
_group_setters = tuple(vars(Group)[name].__set__ for name in _GROUP_FIELDS)
#: (immutable: a group's are replaced, never changed in place)
_NO_VICTIMS: frozenset[str] = frozenset()
_NO_CLAIMS: Mapping[int, ClaimHolder] = MappingProxyType({})


@dataclass(slots=True)
class _Plan:
    chain: int
    pods: list[tuple[int, ...]]
    fresh: list[int] = field(default_factory=list)  # items bound while planning


class Allocator:
    """The allocation state of one store; see the module docstring."""

    def __init__(self, topo: Topology, *, bulk: bool = False) -> None:
        """``bulk``: for ``import_state`` only, which builds the indexes once at its end."""
        self.topo = topo
        self.options = topo.config.options
        self.cells = CellState(topo, bulk=bulk)
        self.buddy = Buddy(topo, self.cells)
        self.groups: dict[str, Group] = {}
        self.bad_nodes: set[str] = set()
        #: (kind, subject, data) of the changes made by the current operation
        self.events: list[tuple[str, str, list[Any]]] = []
        self._maybe_free: set[int] = set()  # items whose usage dropped to 0
        self._dirty: set[int] = set()  # chains touched by the current operation
        self._downgrader = ""  # the preemptor ``_downgrade`` records
        #: ``_chains_for``'s answers by kind of request (a few hundred kinds at most: VCs,
        #: leaf types, pinned cells, biggest pods; refusals are not kept)
        self._chains_kept: dict[tuple[str, str, str, bool, int, int], tuple[int, ...]] = {}
        #: ``placed``'s ``Pod`` per pod's leaves (``_pod``)
        self._pods_kept: dict[tuple[int, ...], Pod] = {}

    # ================================================================== validation
    def _chains_for(self, spec: GroupSpec) -> tuple[int, ...]:
        """The chains ``spec`` may be placed in, in order (static checks raise). Kept per
        kind of request (what the answer depends on: the topology's alone)."""
        members = spec.members
        biggest = members[0].leaves if len(members) == 1 else max([m.leaves for m in members])
        kind = (spec.vc, spec.leaf_type, spec.pinned, spec.priority == OPPORTUNISTIC, biggest,
                sum([m.pods * m.leaves for m in spec.members]) if spec.pinned else 0)
        chains = self._chains_kept.get(kind)
        if chains is None:
            chains = self._chains_kept[kind] = self._find_chains(spec)
        return chains

    def _find_chains(self, spec: GroupSpec) -> tuple[int, ...]:
        """``_chains_for``, worked out."""
        topo = self.topo
        if spec.vc not in topo.vc_pinned:
            raise RequestError(f"unknown virtual cluster {spec.vc!r}")
        if spec.leaf_type and spec.leaf_type not in topo.chains_for_leaf:
            raise RequestError(f"unknown leaf cell type {spec.leaf_type!r}")
        if spec.pinned:
            item = topo.vc_pinned[spec.vc].get(spec.pinned)
            if item is None:
                raise RequestError(f"pinned cell {spec.pinned!r} is not one of {spec.vc}'s")
            chains: tuple[int, ...] = (topo.items[item].chain,)
        elif spec.priority == OPPORTUNISTIC:
            chains = tuple(sorted(range(len(topo.chains)), key=lambda c: topo.chains[c].name))
        else:
            chains = tuple(c for c in topo.vc_chains[spec.vc] if (spec.vc, c) in topo.key_of)
        if spec.leaf_type:
            chains = tuple(c for c in chains if topo.chains[c].leaf_type == spec.leaf_type)
        if not chains:
            what = f"leaf type {spec.leaf_type}" if spec.leaf_type else "floating cells"
            raise RequestError(f"virtual cluster {spec.vc} has no {what}")
        biggest = max(spec.pod_sizes)
        if spec.pinned:
            # HiveD lets such a group wait for ever; it can never fit (until a reconfiguration
            # grows the cell), so the store says so at once.
            held = topo.leaf_number(topo.pinned_cells[spec.pinned])
            if sum(spec.pod_sizes) > held:
                raise RequestError(
                    f"the group needs {sum(spec.pod_sizes)} leaf cells, pinned cell "
                    f"{spec.pinned} holds {held}: it can never fit"
                )
        fits = tuple(c for c in chains if self._unit_size(spec, c) >= biggest)
        if not fits:
            raise RequestError(
                f"a pod of {biggest} leaf cells does not fit in one node of "
                + ", ".join(topo.chains[c].name for c in chains)
            )
        return fits

    def _unit_size(self, spec: GroupSpec, chain: int) -> int:
        """The most leaves one pod can get in ``chain`` (a node, or a smaller pinned cell)."""
        info = self.topo.chains[chain]
        size = info.info(info.node_level).leaf_number
        if spec.pinned:
            cell = self.topo.pinned_cells[spec.pinned]
            size = min(size, self.topo.leaf_number(cell))
        return size

    def _existing(self, spec: GroupSpec) -> Group | None:
        group = self.groups.get(spec.name)
        if group is not None and group.spec != spec:
            raise RequestError(
                f"group {spec.name!r} already exists with a different spec", static=False
            )
        return group

    # ================================================================== submit
    def submit(self, spec: GroupSpec, position: int, suggested: AbstractSet[str] | None = None,
               *, filtering: bool = False) -> Result:
        """Place ``spec`` (see the module documentation), inside the ``suggested`` nodes
        when given; ``filtering``: HiveD's filtering phase (``plan_submit``), which leaves a
        preempting group whose placement is outside them alone."""
        chains = self._chains_for(spec)
        group = self._existing(spec)
        if group is not None and group.preempting and suggested is not None and not filtering:
            outside = sorted({self.topo.node_name[leaf] for leaf in group.leaves()} - suggested)
            if outside:  # HiveD: placed again inside the nodes Kubernetes suggests now
                self._cancel(group, position, "its placement left the suggested nodes: "
                             + ", ".join(outside))
                group = None
        if group is not None:
            if group.reserved:  # the scheduler confirms the reservation: HiveD binds it now
                self._promote(group, position)
            return self._status(group)
        only = None if suggested is None else NodeFilter(self.topo, suggested)
        within = "" if suggested is None else f" within the {len(suggested)} suggested nodes"
        sizes = spec.pod_sizes
        if spec.priority == OPPORTUNISTIC:
            plan = self._plan_opportunistic(chains, sizes, only)
            if plan is None:
                reason = "no free leaf cells for the group in " + self._names(chains)
                return Waiting(spec.name, reason + within)
            return self._place(spec, plan, position)
        plan = self._plan_guaranteed(spec, chains, sizes, None, only)
        if plan is not None:
            return self._place(spec, plan, position)
        plan = self._plan_guaranteed(spec, chains, sizes, spec.priority, only)
        if plan is None:
            return Waiting(
                spec.name,
                f"virtual cluster {spec.vc} has no room for {sum(sizes)} leaf cells "
                f"at priority {spec.priority} in {self._names(chains)}{within}",
            )
        lazy = sorted(
            {
                owner
                for leaf in (leaf for pod in plan.pods for leaf in pod)
                if (owner := self.cells.owner[leaf]) is not None
                and self.groups[owner].spec.lazy
                and self.groups[owner].guaranteed
            }
        )
        if lazy:
            self._rollback(plan)
            self._downgrader = spec.name
            undo = [self._downgrade(self.groups[name], position) for name in lazy]
            plan = self._plan_guaranteed(
                spec, chains, sizes, None, only
            ) or self._plan_guaranteed(spec, chains, sizes, spec.priority, only)
            if plan is None:  # give the victims their guarantee back; preempt them normally
                for name, items in zip(reversed(lazy), reversed(undo), strict=True):
                    self._upgrade(self.groups[name], items, position)
                plan = self._plan_guaranteed(spec, chains, sizes, spec.priority, only)
                assert plan is not None, "the plan found before the downgrade must come back"
            else:
                for name in lazy:
                    self.events.append(("downgraded", name, [spec.name]))
        return self._preempt_or_place(spec, plan, position)

    def _names(self, chains: tuple[int, ...]) -> str:
        return ", ".join(self.topo.chains[c].name for c in chains)

    def _status(self, group: Group) -> Result:
        if group.preempting:
            return Preempting(group.spec.name, tuple(sorted(group.victims)))
        return self.placed(group)

    def placed(self, group: Group) -> Placed:
        """``group``'s placement as a ``Placed`` answer (nodes and devices per pod)."""
        topo = self.topo
        kept = self._pods_kept
        pods = tuple([kept.get(pod) or self._pod(pod) for pod in group.pods])
        return new_placed(group.spec.name, topo.chains[group.chain].name, pods, group.token)

    def _pod(self, leaves: tuple[int, ...]) -> Pod:
        """The ``Pod`` of a pod on ``leaves`` (kept: its node and devices are the topology's
        alone, and a mostly free cluster places pods on the same leaves again and again)."""
        topo = self.topo
        # A pod whose node left the configuration has no leaves ("" node) until released.
        # (made as the tuple it is: ``Pod(...)`` is a call in Python)
        pod = _new_tuple(Pod, (len(leaves), topo.node_name[leaves[0]] if leaves else "",
                               tuple(map(topo.device.__getitem__, leaves))))
        kept = self._pods_kept
        if len(kept) >= PODS_KEPT:
            kept.clear()
        kept[leaves] = pod
        return pod

    # ------------------------------------------------------------------ planning
    def _plan_guaranteed(
        self, spec: GroupSpec, chains: tuple[int, ...], sizes: list[int], threshold: int | None,
        only: NodeFilter | None,
    ) -> _Plan | None:
        for chain in chains:
            if spec.pinned:
                key = self.topo.items[self.topo.vc_pinned[spec.vc][spec.pinned]].key
                plan = self._search(key, "", chain, sizes, threshold, only)
            else:
                key = self.topo.key_of[(spec.vc, chain)]
                plan = self._search(key, spec.vc, chain, sizes, threshold, only)
            if plan is not None:
                return plan
        return None

    def _search(
        self, key: int, vc: str, chain: int, sizes: list[int], threshold: int | None,
        only: NodeFilter | None,
    ) -> _Plan | None:
        """Place ``sizes`` inside the items of placement key ``key`` (binding more of
        ``vc``'s items if ``vc`` is given): lowest common ancestor first, then packing;
        on the nodes ``only`` allows (None: any)."""
        topo, buddy = self.topo, self.buddy
        info = topo.chains[chain]
        order = _order(sizes)
        total = sum(sizes)
        top = info.node_level if len(sizes) == 1 else info.top_level
        low = next((i.level for i in info.levels if i.leaf_number >= total), top + 1)
        index = self.cells.n_chains + key
        alone = threshold is None and only is None and len(sizes) == 1
        # Cells the VC already holds come first (packing), lowest level first (affinity) ...
        for level in range(low, top + 1):
            candidates = (
                self.cells.candidates(index, level, total)
                if threshold is None
                else self._scan(key, level, total, threshold)
            )
            for c in candidates:
                if alone and level <= info.node_level:
                    return _Plan(chain, [self._one_pod(c, total)])
                if only is not None and not only.holds(c):
                    continue
                picker = Picker(topo, self.cells, threshold, only)
                pods = picker.pack(picker.nodes([c], info.node_level), sizes, order,
                                   final=True)
                if pods is not None:
                    return _Plan(chain, pods)
        if not vc:
            return None
        # ... then a fresh item, the smallest that gives the lowest common ancestor ...
        for level in range(low, top + 1):
            for slot in topo.vc_slots[(vc, chain)]:
                if topo.slots[slot][2] < level or not buddy.unbound[slot]:
                    continue
                plan = self._fresh(buddy.unbound[slot][0], chain, level, sizes, order, threshold,
                                   only)
                if plan is not None:
                    return plan
        # ... and a gang that fits in no single cell is spread over several.
        if len(sizes) > 1:
            return self._spread(key, vc, chain, sizes, order, threshold, only)
        return None

    def _one_pod(self, c: int, need: int) -> tuple[int, ...]:
        """The leaves a first pass of one pod on any node takes in ``c``, a cell at or below
        the node level with at least ``need`` free leaves: ``Picker.pack``'s answer (``c``
        is the pod's only node, and it holds the pod), without working out the nodes."""
        return pick_free(self.topo, self.cells, c, need)

    def _cells_to_bind(self, chain: int, level: int, mode: int,
                       only: NodeFilter | None) -> Iterator[int]:
        """The cells an item of ``level`` may be bound to, best first: ``find_cell``'s
        choice alone, or, on the nodes ``only`` allows, every cell holding one of them in
        ``find_cell``'s order (HiveD's backtracking buddy allocation passes over a cell of
        no suggested node and tries the next)."""
        if only is None:
            c = self.buddy.find_cell(chain, level, mode)
            if c >= 0:
                yield c
            return
        yield from self.buddy.cells_to_bind(chain, level, mode, only.holds)

    def _scan(self, key: int, level: int, need: int, threshold: int) -> list[int]:
        """Second-pass candidates: cells at ``level`` in the key's bound items that have
        ``need`` leaves at priority below ``threshold``; fewest preemptions, then best fit."""
        topo, cells = self.topo, self.cells
        found = []
        for item in topo.key_items[key]:
            c = self.buddy.item_cell[item]
            if c < 0 or topo.level[c] < level:
                continue
            for d in topo.desc[c][level - 1]:
                a = cells.avail(d, threshold)
                if a >= need:
                    found.append((max(0, need - cells.free_n[d]), a, d))
        found.sort()
        return [d for _, _, d in found]

    def _fresh(
        self,
        item: int,
        chain: int,
        level: int,
        sizes: list[int],
        order: list[int],
        threshold: int | None,
        only: NodeFilter | None,
    ) -> _Plan | None:
        """Bind ``item`` to a new physical cell and place the gang in one of its cells at
        ``level``; unbind again if that does not work (and, on the nodes ``only`` allows,
        try the next cell)."""
        topo, cells = self.topo, self.cells
        item_level = topo.items[item].level
        total = sum(sizes)
        node_level = topo.chains[chain].node_level
        mode = CLEAN if threshold is None else HEALTHY
        alone = threshold is None and only is None and len(sizes) == 1 and level <= node_level
        for c in self._cells_to_bind(chain, item_level, mode, only):
            self.buddy.bind(item, c)
            if threshold is None:  # (free leaves only: no call per cell)
                free_n = cells.free_n
                inner = [(0, a, d) for d in topo.desc[c][level - 1] if (a := free_n[d]) >= total]
            else:
                inner = [
                    (max(0, total - cells.free_n[d]), a, d)
                    for d in topo.desc[c][level - 1]
                    if (a := cells.avail(d, threshold)) >= total
                ]
            for _, _, d in sorted(inner):
                if alone:
                    return _Plan(chain, [self._one_pod(d, total)], [item])
                picker = Picker(topo, cells, threshold, only)
                pods = picker.pack(picker.nodes([d], node_level), sizes, order,
                                   final=True)
                if pods is not None:
                    return _Plan(chain, pods, [item])
            self.buddy.unbind(item)
        return None

    def _spread(
        self,
        key: int,
        vc: str,
        chain: int,
        sizes: list[int],
        order: list[int],
        threshold: int | None,
        only: NodeFilter | None,
    ) -> _Plan | None:
        """A gang no single cell holds: best-fit its pods over all the VC's units (items it
        holds first), binding more items as needed."""
        topo, buddy = self.topo, self.buddy
        node_level = topo.chains[chain].node_level
        picker = Picker(topo, self.cells, threshold, only)
        held = [buddy.item_cell[i] for i in topo.key_items[key] if buddy.item_cell[i] >= 0]
        nodes = picker.nodes(sorted(held), node_level)
        fresh: list[int] = []
        out: list[tuple[int, ...]] = [() for _ in sizes]
        mode = CLEAN if threshold is None else HEALTHY
        for i in order:
            need = sizes[i]
            node = picker.best_node(nodes, need)
            while node < 0:
                for slot in topo.vc_slots[(vc, chain)]:
                    level = topo.slots[slot][2]
                    unit = topo.chains[chain].info(min(level, node_level)).leaf_number
                    if unit < need or not buddy.unbound[slot]:
                        continue
                    c = next(self._cells_to_bind(chain, level, mode, only), -1)
                    if c >= 0:
                        item = buddy.unbound[slot][0]
                        buddy.bind(item, c)
                        fresh.append(item)
                        nodes.extend(picker.nodes([c], node_level))
                        break
                else:
                    for item in reversed(fresh):
                        buddy.unbind(item)
                    return None
                node = picker.best_node(nodes, need)
            out[i] = picker.pick(node, need)
        return _Plan(chain, out, fresh)

    def _plan_opportunistic(self, chains: tuple[int, ...], sizes: list[int],
                            only: NodeFilter | None) -> _Plan | None:
        """Free leaves anywhere in one chain (on the nodes ``only`` allows); cells no VC
        holds are preferred so the group is less likely to be preempted (HiveD keeps
        opportunistic work away from guaranteed)."""
        topo, cells = self.topo, self.cells
        order = _order(sizes)
        total = sum(sizes)
        for chain in chains:
            info = topo.chains[chain]
            if info.info(info.node_level).leaf_number < max(sizes):
                continue
            top = info.node_level if len(sizes) == 1 else info.top_level
            low = next((i.level for i in info.levels if i.leaf_number >= total), top + 1)
            for index in (cells.region(chain), chain):
                for level in range(low, top + 1):
                    for c in cells.candidates(index, level, total):
                        if only is not None and not only.holds(c):
                            continue
                        picker = Picker(topo, cells, None, only)
                        pods = picker.pack(picker.nodes([c], info.node_level), sizes, order,
                                           final=True)
                        if pods is not None:
                            return _Plan(chain, pods)
            if len(sizes) > 1:
                picker = Picker(topo, cells, None, only)
                out: list[tuple[int, ...]] = [() for _ in sizes]
                for i in order:
                    node = next(
                        (
                            n
                            for n in cells.candidates(chain, info.node_level, sizes[i])
                            if picker.avail(n) >= sizes[i] and (only is None or only.holds(n))
                        ),
                        -1,
                    )
                    if node < 0:
                        break
                    out[i] = picker.pick(node, sizes[i])
                else:
                    return _Plan(chain, out)
        return None

    def _rollback(self, plan: _Plan) -> None:
        for item in reversed(plan.fresh):
            self.buddy.unbind(item)

    # ------------------------------------------------------------------ committing
    def _place(self, spec: GroupSpec, plan: _Plan, position: int) -> Placed:
        group = Group(spec, plan.chain, tuple(plan.pods), token=position, created=position)
        self.adopt(group, position)
        placed = self.placed(group)
        self.events.append(("placed", spec.name, placed_data(placed)))
        return placed

    def adopt(self, group: Group, position: int) -> None:
        """Hold ``group`` as placed: its leaves become its own (a new placement, or a group
        a reconfiguration carries over)."""
        name = group.spec.name
        self.groups[name] = group
        leaves = group.leaves()
        owner = self.cells.owner
        for leaf in leaves:
            owner[leaf] = name
        self._hold(group, leaves, position)

    def _hold(self, group: Group, leaves: list[int], position: int) -> None:
        """Count ``leaves`` as held by ``group`` (used or reserved) and update priorities."""
        self._dirty.add(group.chain)
        if group.guaranteed:
            buddy, item_used = self.buddy, self.buddy.item_used
            for item, n in _per_item(self.cells.item_of, leaves):
                item_used[item] += n
                buddy.mark_used(item)
        self._reprioritize(leaves, position)

    def _unhold(self, group: Group, leaves: list[int], position: int) -> None:
        """Inverse of ``_hold`` after the caller cleared owner/reserver."""
        self._dirty.add(group.chain)
        if group.guaranteed:
            item_used = self.buddy.item_used
            for item, n in _per_item(self.cells.item_of, leaves):
                item_used[item] -= n
                if not item_used[item]:
                    self._maybe_free.add(item)
        self._reprioritize(leaves, position)

    def _reprioritize(self, leaves: list[int], position: int) -> None:
        """Give ``leaves`` the effective priority their owner and reserver give them now
        (``_eff``), stamped ``position``: all at once when they have one owner and one
        reserver (a group's own leaves, the commonest case: looked at in C)."""
        cells = self.cells
        owners = set(map(cells.owner.__getitem__, leaves))
        reservers = set(map(cells.reserver.__getitem__, leaves))
        if len(owners) != 1 or len(reservers) != 1:
            cells.set_leaves(leaves, [self._eff(leaf) for leaf in leaves], position)
            return
        owner, reserver = owners.pop(), reservers.pop()
        eff = FREE if owner is None else self.groups[owner].priority
        if reserver is not None:
            eff = max(eff, self.groups[reserver].priority)
        cells.set_leaves_to(leaves, eff, position)

    def _eff(self, leaf: int) -> int:
        eff = FREE
        owner, reserver = self.cells.owner[leaf], self.cells.reserver[leaf]
        if owner is not None:
            eff = self.groups[owner].priority
        if reserver is not None:
            eff = max(eff, self.groups[reserver].priority)
        return eff

    def _preempt_or_place(self, spec: GroupSpec, plan: _Plan, position: int) -> Result:
        """Commit a second-pass plan: reserve its leaves, cancel lower preemptors that held
        reservations there, and either wait for the victims or, with none, be placed."""
        cells = self.cells
        leaves = [leaf for pod in plan.pods for leaf in pod]
        lower = sorted({r for leaf in leaves if (r := cells.reserver[leaf]) is not None})
        group = Group(spec, plan.chain, tuple(plan.pods))
        group.preempting = True
        group.created = position
        self.groups[spec.name] = group
        for leaf in leaves:
            cells.reserver[leaf] = spec.name
        # Hold our leaves' items before cancelling, so that cannot unbind what we stand on.
        self._hold(group, leaves, position)
        for name in lower:
            self._cancel(self.groups[name], position, f"preempted by {spec.name}")
        victims = sorted({o for leaf in leaves if (o := cells.owner[leaf]) is not None})
        if not victims:
            self._promote(group, position)
            return self.placed(group)
        group.victims = frozenset(victims)
        for name in victims:
            self.groups[name].preemptors.add(spec.name)
        self.events.append(("preempting", spec.name, victims))
        return Preempting(spec.name, tuple(victims))

    def _cancel(self, group: Group, position: int, reason: str) -> None:
        """Drop preempting ``group`` and its reservations (leaves a higher preemptor took
        over already carry that preemptor's name and stay reserved)."""
        cells = self.cells
        name = group.spec.name
        leaves = group.leaves()
        for leaf in leaves:
            if cells.reserver[leaf] == name:
                cells.reserver[leaf] = None
        for victim in sorted(group.victims):
            self.groups[victim].preemptors.discard(name)
        self._unhold(group, leaves, position)
        del self.groups[name]
        self.events.append(("cancelled", name, [reason]))

    def _downgrade(self, group: Group, position: int) -> dict[int, int]:
        """Lazy preemption: ``group`` keeps its leaves at priority -1 and its VC items are
        released. Returns item -> cell so ``_upgrade`` can bind exactly the same again."""
        buddy, item_of = self.buddy, self.cells.item_of
        leaves = group.leaves()
        items = {item_of[leaf]: buddy.item_cell[item_of[leaf]] for leaf in leaves}
        for leaf in leaves:
            buddy.item_used[item_of[leaf]] -= 1
        group.downgraded = True
        group.downgraded_at = position
        group.downgraded_by = self._downgrader
        self._reprioritize(leaves, position)
        for item in sorted(items):
            if not buddy.item_used[item] and not self.topo.items[item].pinned_id:
                buddy.unbind(item)
        self._dirty.add(group.chain)
        return items

    def _upgrade(self, group: Group, items: dict[int, int], position: int) -> None:
        buddy = self.buddy
        for item, cell in sorted(items.items()):
            if buddy.item_cell[item] < 0:
                buddy.bind(item, cell)
        group.downgraded = False
        group.downgraded_at, group.downgraded_by = -1, ""
        self._hold(group, group.leaves(), position)

    # ================================================================== bind
    def bind(
        self, spec: GroupSpec, pods: tuple[PodPlacement, ...], since: int, position: int
    ) -> Result:
        topo, cells, buddy = self.topo, self.cells, self.buddy
        chains = self._chains_for(spec)
        sizes = spec.pod_sizes
        if len(pods) != len(sizes):
            raise RequestError(f"placement lists {len(pods)} pods, the members have {len(sizes)}")
        chain = -1
        resolved: list[tuple[int, ...]] = []
        for i, (pod, size) in enumerate(zip(pods, sizes, strict=True)):
            if len(pod.devices) != size:
                raise RequestError(
                    f"placement pod {i} has {len(pod.devices)} leaf cells, its member needs {size}"
                )
            node_cells = [n for n in topo.nodes.get(pod.node, ()) if topo.chain_of[n] in chains]
            if not node_cells:
                raise RequestError(f"node {pod.node!r} has no leaf cells this group may use")
            if chain < 0:
                if len(node_cells) > 1:
                    raise RequestError(f"node {pod.node} has several leaf types: name leaf_type")
                chain = topo.chain_of[node_cells[0]]
            node = next((n for n in node_cells if topo.chain_of[n] == chain), -1)
            if node < 0:
                raise RequestError("a group's pods must all be in one chain")
            leaves = []
            for device in pod.devices:
                leaf = topo.device_leaf.get((node, device), -1)
                if leaf < 0:
                    raise RequestError(f"node {pod.node} has no device {device}")
                leaves.append(leaf)
            resolved.append(tuple(sorted(leaves)))
        every = sorted(leaf for pod in resolved for leaf in pod)
        if len(set(every)) != len(every):
            raise RequestError("placement names a leaf cell twice")
        group = self._existing(spec)
        if group is not None:
            return self._confirm(group, resolved, position)
        for leaf in every:
            if cells.rev[leaf] > since:
                return Conflict(
                    spec.name,
                    f"{topo.address[leaf]} changed at revision {cells.rev[leaf]} > {since}",
                )
            if cells.bad[leaf] or cells.eff[leaf] != FREE:
                state = "bad" if cells.bad[leaf] else "not free"
                return Conflict(spec.name, f"{topo.address[leaf]} is {state}")
        fresh: list[int] = []
        if spec.priority != OPPORTUNISTIC:
            key = (
                topo.items[topo.vc_pinned[spec.vc][spec.pinned]].key
                if spec.pinned
                else topo.key_of.get((spec.vc, chain), -1)
            )
            for leaf in every:
                item = cells.item_of[leaf]
                if item >= 0 and cells.key_of_item[item] == key:
                    continue
                if item < 0 and not spec.pinned and self._bind_around(spec.vc, chain, leaf, fresh):
                    continue
                for item in reversed(fresh):
                    buddy.unbind(item)
                return Conflict(
                    spec.name, f"{topo.address[leaf]} is outside what {spec.vc} can hold there"
                )
        return self._place(spec, _Plan(chain, resolved, fresh), position)

    def _confirm(self, group: Group, pods: list[tuple[int, ...]], position: int) -> Result:
        """A bind of a group that exists: it confirms a reservation when it names exactly the
        reserved leaves (HiveD's scheduler binding a Preempting group)."""
        name = group.spec.name
        if not group.preempting:
            raise RequestError(f"group {name!r} already exists", static=False)
        if group.victims:
            return Conflict(name, "still preempting " + ", ".join(sorted(group.victims)))
        if tuple(pods) != group.pods:
            return Conflict(name, "the placement is not the one reserved for the group")
        self._promote(group, position)
        return self.placed(group)

    def _bind_around(self, vc: str, chain: int, leaf: int, fresh: list[int]) -> bool:
        """Bind one of ``vc``'s unbound items (lowest level first) to the free cell of that
        level around ``leaf``, if safety allows."""
        topo = self.topo
        return any(self.bind_at(vc, chain, leaf, topo.slots[slot][2], fresh)
                   for slot in topo.vc_slots.get((vc, chain), ()))

    def bind_at(self, vc: str, chain: int, leaf: int, level: int, fresh: list[int]) -> bool:
        """Bind an unbound item of ``vc``'s at ``level`` to the free cell of that level
        around ``leaf`` (appended to ``fresh``), if there is one and safety allows."""
        topo, buddy = self.topo, self.buddy
        slot = topo.slot_of.get((vc, chain, level))
        if slot is None or not buddy.unbound[slot]:
            return False
        cell = topo.ancestors[leaf][level - 1]
        root = buddy.region_root(cell)
        if root < 0 or not buddy.safe_take(chain, level, topo.level[root]):
            return False
        item = buddy.unbound[slot][0]
        buddy.bind(item, cell)
        fresh.append(item)
        return True

    # ================================================================== release
    def release(self, name: str, position: int) -> Result:
        group = self.groups.get(name)
        if group is None:
            raise RequestError(f"no group {name!r}", static=False)
        if group.preempting:
            self._cancel(group, position, "released")
            return Released(name, ())
        cells = self.cells
        leaves = group.leaves()
        for leaf in leaves:
            cells.owner[leaf] = None
        self._unhold(group, leaves, position)
        del self.groups[name]
        self.events.append(("released", name, []))
        promoted = []
        for preemptor_name in sorted(group.preemptors):
            preemptor = self.groups[preemptor_name]
            preemptor.victims = preemptor.victims - {name}
            if preemptor.victims:
                continue
            if self.options.reservations == RESERVE_PLACE_AT_ONCE:
                self._promote(preemptor, position)
                promoted.append(preemptor_name)
            else:  # HiveD: Reserving -> Reserved; the scheduler confirms (submit or bind)
                self.events.append(("reserved", preemptor_name, []))
        return new_released(name, tuple(promoted))

    def release_if(self, name: str, incarnation: int, position: int) -> Result:
        """``release`` provided ``name`` is still incarnation ``incarnation``."""
        group = self.groups.get(name)
        if group is None:
            raise RequestError(f"no group {name!r}", static=False)
        if group.created != incarnation:
            return Conflict(
                name, f"group {name} is incarnation {group.created}, not {incarnation}"
            )
        return self.release(name, position)

    # ================================================================== claims
    def claim(self, name: str, incarnation: int, slot: int, holder: ClaimHolder,
              previous: str) -> Result:
        """Give member pod ``slot`` of ``name`` to ``holder`` if ``previous`` ("" for nobody)
        holds it now (see the module documentation); nothing changes unless it answers a new
        ``Claimed``."""
        group = self.groups.get(name)
        if group is None or group.created != incarnation:
            now = "gone" if group is None else f"incarnation {group.created}"
            return Conflict(name, f"group {name} incarnation {incarnation} is {now}")
        if group.preempting:
            return Conflict(name, f"group {name} is {group.state}, not placed")
        if slot >= len(group.pods):
            raise RequestError(
                f"group {name} has {len(group.pods)} member pods, no slot {slot}", static=False
            )
        uid = holder[0]
        held = group.claims.get(slot)
        if held is not None and held[0] == uid:
            return Claimed(name, incarnation, slot, uid)  # a retry, or a re-filter
        other = next((s for s, h in sorted(group.claims.items()) if h[0] == uid), None)
        if other is not None:
            return Conflict(name, f"pod {uid} holds member pod {other} of {name}")
        current = "" if held is None else held[0]
        if current != previous:
            return Conflict(
                name, f"member pod {slot} of {name} is held by {current or 'nobody'}, "
                f"not {previous or 'nobody'}"
            )
        group.claims = MappingProxyType({**group.claims, slot: holder})
        self.events.append(("claimed", name, [incarnation, slot, uid, holder[1], previous]))
        return Claimed(name, incarnation, slot, uid)

    def _promote(self, group: Group, position: int) -> None:
        """Every victim is gone: the reserved leaves become used."""
        cells = self.cells
        leaves = group.leaves()
        for leaf in leaves:
            cells.reserver[leaf] = None
            cells.owner[leaf] = group.spec.name
        self._reprioritize(leaves, position)
        group.preempting = False
        group.token = position
        self.events.append(("placed", group.spec.name, placed_data(self.placed(group))))

    # ================================================================== node health
    def set_node_health(self, node: str, healthy: bool, position: int) -> Result:
        node_cells = self.topo.nodes.get(node)
        if node_cells is None:
            # HiveD ignores informer events for nodes its configuration does not know.
            warning = f"unknown node {node!r}: the health report is ignored"
            _log.warning("%s", warning)
            return NodeHealthSet(node, healthy, False, (), warning)
        changed = (node in self.bad_nodes) == healthy
        cancelled: list[str] = []
        if changed:
            leaves = [leaf for n in node_cells for leaf in self.topo.leaves[n]]
            self.cells.set_bad(leaves, not healthy, position)
            if healthy:
                self.bad_nodes.discard(node)
            else:
                self.bad_nodes.add(node)
                on_node = set(leaves)
                cancelled = sorted(
                    name
                    for name, g in self.groups.items()
                    if g.preempting and not on_node.isdisjoint(g.leaves())
                )
                for name in cancelled:
                    self._cancel(self.groups[name], position, f"node {node} is bad")
            self._dirty.update(self.topo.chain_of[n] for n in node_cells)
            self.events.append(("node_health", node, [healthy]))
        return NodeHealthSet(node, healthy, changed, tuple(cancelled))

    # ================================================================== end of an op
    def bind_tentatively(self, item: int, cell: int) -> None:
        """Bind ``item`` to ``cell`` for groups this operation places; ``finish`` unbinds it
        again if none of them uses it."""
        self.buddy.bind(item, cell)
        self._maybe_free.add(item)

    def settle_every_chain(self) -> None:
        """Have ``finish`` recompute the doomed bindings of every chain (after a change of
        everything: a restore, a reconfiguration, every node marked bad at start)."""
        self._dirty.update(range(len(self.topo.chains)))

    def finish(self) -> list[tuple[str, str, list[Any]]]:
        """Settle the operation: unbind items nobody uses, recompute doomed bindings of the
        chains it touched; return (and forget) its events."""
        buddy, items = self.buddy, self.topo.items
        for item in sorted(self._maybe_free):
            if (
                buddy.item_cell[item] >= 0
                and not buddy.item_used[item]
                and not buddy.doomed[item]
                and not items[item].pinned_id
            ):
                buddy.unbind(item)
        self._maybe_free.clear()
        for chain in sorted(self._dirty):
            buddy.reconcile_doomed(chain)
        self._dirty.clear()
        events, self.events = self.events, []
        # The groups the operation changed are packed for the next snapshot now, a few
        # microseconds each, rather than all at once by the snapshot on the replica's event
        # loop (a group changed without an event is packed then; see ``Group.packed``).
        groups = self.groups
        for _, subject, _ in events:
            group = groups.get(subject)
            if group is not None:
                group.packed()
        return events

    # ================================================================== reads
    # The read models are computed in ``cluster_state.reads`` (status documents) and
    # ``cluster_state.inspection`` (HiveD's inspect trees) from this state.
    def group_info(self, name: str) -> dict[str, Any] | None:
        return reads.group_info(self, name)


    def list_groups(self, vc: str = "") -> list[dict[str, Any]]:
        return reads.list_groups(self, vc)

    def vc_info(self, vc: str) -> dict[str, Any]:
        return reads.vc_info(self, vc)

    def summary(self) -> dict[str, Any]:
        return reads.summary(self)

    def inspect_physical(self, chain: str = "") -> list[dict[str, Any]]:
        return inspection.inspect_physical(self, chain)

    def inspect_vc(self, vc: str) -> dict[str, Any]:
        return inspection.inspect_vc(self, vc)

    def inspect_group(self, name: str) -> dict[str, Any] | None:
        return inspection.inspect_group(self, name)

    # ================================================================== state transfer
    def export_state(self) -> list[Any]:
        """The facts everything else is derived from, canonically ordered."""
        # Tuples pack as arrays: the pods go out as they are; the spec's wire form is cached.
        groups = [g.record() for _, g in sorted(self.groups.items())]
        return [groups, *self._state_rest()]

    def export_packed(self) -> bytes:
        """``msgpack.packb(export_state())``, the groups' records packed only where they
        changed since the last time (``Group.packed``)."""
        return self.capture_packed()()

    def capture_packed(self) -> Callable[[], bytes]:
        """``export_packed`` in two parts: what must be read now (each group's packed record,
        packed here if it changed without an event; copies of the bindings, the doomed flags,
        the bad nodes and the cells' revisions: about 2 ms at 100k GPUs), and the function
        that makes the bytes from those copies alone, later and in any thread (sorting and
        packing the rest took ~15 ms on the replica's event loop)."""
        groups = self.groups
        pieces = [groups[name].packed() for name in sorted(groups)]
        rest = partial(_state_rest, self.topo, dict(self.cells.item_root),
                       list(self.buddy.doomed), list(self.bad_nodes), list(self.cells.rev))
        header = packed_array_header(4) + packed_array_header(len(pieces))
        return lambda: b"".join([header, *pieces, *map(msgpack.packb, rest())])

    def _state_rest(self) -> list[Any]:
        """``export_state`` after the groups: bindings, bad nodes, leaf revisions."""
        return _state_rest(self.topo, self.cells.item_root, self.buddy.doomed, self.bad_nodes,
                           self.cells.rev)

    def keep_packed(self, records: list[Any], packed: list[bytes]) -> None:
        """After ``import_state``: take ``packed[i]`` as the packed record of the group of
        ``records[i]`` (the snapshot's own bytes for it), if it is a record of this build's
        (an older, shorter one is packed anew)."""
        groups = self.groups
        for record, piece in zip(records, packed, strict=True):
            if len(record) == _RECORD_FIELDS:
                groups[record[0][0]].keep_packed(piece)

    def import_state(self, state: list[Any]) -> None:
        """Rebuild from ``export_state`` output (on a fresh allocator of the same topology)."""
        groups_raw, bindings, bad_nodes, revs = state
        topo, cells, buddy = self.topo, self.cells, self.buddy
        cells.bulk = True  # the indexes are rebuilt once at the end
        for item, cell in bindings:  # (here and below: in a replica's worker, giving way)
            give_way()
            buddy.bind(int(item), int(cell))
        for node in bad_nodes:
            self.set_node_health(str(node), False, -1)
        held: list[tuple[Group, list[int]]] = []
        for record in groups_raw:
            give_way()
            spec_raw, chain, preempting, _, pods = record[:5]
            name, vc, priority, members, leaf_type, pinned, lazy = spec_raw
            spec = GroupSpec(
                name=name,
                vc=vc,
                priority=priority,
                members=tuple(Member(p, n) for p, n in members),
                leaf_type=leaf_type,
                pinned=pinned,
                lazy=lazy,
            )
            group = Group(spec, chain, tuple(tuple(p) for p in pods))
            group.load(record)
            self.groups[name] = group
            leaves = group.leaves()
            holders = cells.reserver if preempting else cells.owner
            for leaf in leaves:
                holders[leaf] = name
            held.append((group, leaves))
        for group in self.groups.values():
            for victim in group.victims:
                self.groups[victim].preemptors.add(group.spec.name)
        # What ``_hold`` does per group, for all of them at once: the indexes then move each
        # cell once rather than once per group under it (a 100k-GPU restore's main cost).
        every_leaf: list[int] = []
        guaranteed: list[int] = []
        for group, leaves in held:
            self._dirty.add(group.chain)
            if group.guaranteed:
                guaranteed.extend(leaves)
            every_leaf.extend(leaves)
        buddy_item_used = buddy.item_used
        # the leaves each item's guaranteed groups use, counted in C (per item, not per leaf;
        # C_LOOP_ITEMS at once)
        per_item: Counter[int] = Counter()
        for start in range(0, len(guaranteed), C_LOOP_ITEMS):
            give_way()
            per_item.update(map(cells.item_of.__getitem__,
                                guaranteed[start : start + C_LOOP_ITEMS]))
        for item, used in per_item.items():
            buddy_item_used[item] += used
            buddy.mark_used(item)
        # ``_eff`` of every leaf, by C loops (a Python call per leaf was a tenth of a restore)
        prio_of: dict[str | None, int] = {name: g.priority for name, g in self.groups.items()}
        prio_of[None] = FREE  # no owner / no reserver
        effs: list[int] = []
        for start in range(0, len(every_leaf), C_LOOP_ITEMS):
            give_way()
            leaves = every_leaf[start : start + C_LOOP_ITEMS]
            effs += map(max, map(prio_of.__getitem__, map(cells.owner.__getitem__, leaves)),
                        map(prio_of.__getitem__, map(cells.reserver.__getitem__, leaves)))
        cells.set_leaves(every_leaf, effs, -1)
        cells.rebuild_indexes()
        if isinstance(revs, bytes):  # snapshot format 3: every leaf's revision, packed
            packed = array(_REV_TYPECODE, revs)
            if len(packed) != len(topo.leaf_ids):
                raise ValueError(f"{len(packed)} leaf revisions for {len(topo.leaf_ids)} leaves")
            rev = cells.rev
            for leaf, value in zip(topo.leaf_ids, packed, strict=True):
                rev[leaf] = value
        else:
            for leaf, rev in revs:
                cells.rev[leaf] = rev
        self.settle_every_chain()
        self.finish()

    def debug_state(self, *, revisions: bool = False) -> list[Any]:
        """Every piece of state, derived or not, canonically ordered (for tests)."""
        buddy, cells = self.buddy, self.cells
        state = self.export_state()
        if not revisions:
            state[-1] = []
        return [
            state,
            [[list(fl) for fl in chain] for chain in buddy.free],
            list(buddy.item_cell),
            list(buddy.item_used),
            list(buddy.doomed),
            [list(u) for u in buddy.unbound],
            [list(d) for d in buddy.demand],
            list(cells.free_n),
            [sorted(h.items()) for h in cells.hist],
            list(cells.bad_n),
            list(cells.item_of),
            list(cells.owner),
            list(cells.reserver),
            list(cells.eff),
            [[[list(b) for b in level] for level in index] for index in cells.buckets],
        ]

    # ================================================================== node health at start
    def start_all_bad(self) -> None:
        """``initialNodeHealth: bad``: every node is bad until a report says it is healthy
        (HiveD marks every configured node bad until Kubernetes reports it)."""
        for node in sorted(self.topo.nodes):
            self.mark_bad(node, -1)
        self.settle_every_chain()
        self.finish()

    def mark_bad(self, node: str, position: int) -> None:
        """Mark ``node`` bad from the start (nothing it holds is cancelled: a restore or a
        reconfiguration, before any group)."""
        leaves = [leaf for n in self.topo.nodes[node] for leaf in self.topo.leaves[n]]
        self.cells.set_bad(leaves, True, position)
        self.bad_nodes.add(node)
