"""Shared fixtures for the cluster_state tests: a HiveD-style two-chain config, a store
driver, and an invariant checker that recomputes every derived structure from scratch."""

from __future__ import annotations

from bisect import insort
from typing import Any

import msgpack

from cluster_state import Allocator, ClusterStore, parse_config
from cluster_state.config import RESERVE_UNTIL_CONFIRMED, ClusterConfig
from cluster_state.index import FREE, CellState
from consensus.messages import Command

# Two chains, as in HiveD's design config: DGX-like 8-GPU V100 nodes (2 sockets x 2 PCIe
# switches x 2 GPUs) in racks of four, and 4-GPU K80 nodes in a 3-node cell. One V100 node
# is pinned for VC1. The assignment is tight at every level, so safety is exercised.
MULTI_CHAIN_YAML = """
physicalCluster:
  skuTypes: {V100: {gpu: 1, cpu: 8, memory: 64Gi}, K80: {gpu: 1, cpu: 4, memory: 32Gi}}
  cellTypes:
    V100-SWITCH: {childCellType: V100, childCellNumber: 2}
    V100-SOCKET: {childCellType: V100-SWITCH, childCellNumber: 2}
    V100-NODE:   {childCellType: V100-SOCKET, childCellNumber: 2, isNodeLevel: true}
    V100-RACK:   {childCellType: V100-NODE, childCellNumber: 4}
    K80-2GPU:    {childCellType: K80, childCellNumber: 2}
    K80-NODE:    {childCellType: K80-2GPU, childCellNumber: 2, isNodeLevel: true}
    3-K80-NODE:  {childCellType: K80-NODE, childCellNumber: 3}
  physicalCells:
  - cellType: V100-RACK
    cellAddress: rack-a
    cellChildren:
    - cellAddress: dgx-a0
    - cellAddress: dgx-a1
    - cellAddress: dgx-a2
    - cellAddress: dgx-a3
  - cellType: V100-RACK
    cellAddress: rack-b
    cellChildren:
    - {cellAddress: dgx-b0, pinnedCellId: VC1-PIN}
    - cellAddress: dgx-b1
    - cellAddress: dgx-b2
    - cellAddress: dgx-b3
  - cellType: 3-K80-NODE
    cellChildren:
    - cellAddress: k80-0
    - cellAddress: k80-1
    - cellAddress: k80-2
virtualClusters:
  VC1:
    virtualCells:
    - {cellType: V100-RACK.V100-NODE, cellNumber: 2}
    - {cellType: 3-K80-NODE.K80-NODE, cellNumber: 1}
    pinnedCells: [{pinnedCellId: VC1-PIN}]
  VC2:
    virtualCells:
    - {cellType: V100-RACK, cellNumber: 1}
    - {cellType: 3-K80-NODE.K80-NODE, cellNumber: 2}
  VC3:
    virtualCells:
    - {cellType: V100-RACK.V100-NODE.V100-SOCKET, cellNumber: 2}
"""


def multi_chain_config() -> ClusterConfig:
    return parse_config(MULTI_CHAIN_YAML)


class Driver:
    """Applies ops to a store at increasing positions, like a replica's apply loop."""

    def __init__(self, store: ClusterStore, client: int = 1) -> None:
        self.store = store
        self.client = client
        self.position = 0
        self.seq = 0

    def apply(self, op: bytes) -> list[Any]:
        self.position += 1
        self.seq += 1
        command = Command(client_id=self.client, seq=self.seq, op=op)
        decoded: list[Any] = msgpack.unpackb(self.store.apply(self.position, command))
        return decoded

    def query(self, op: bytes) -> list[Any]:
        decoded: list[Any] = msgpack.unpackb(self.store.query(op))
        return decoded


def devices(result: list[Any]) -> list[tuple[str, list[int]]]:
    """(node, devices) per pod of a placed result."""
    assert result[0] == "placed", result
    return [(node, devs) for _, node, devs in result[3]]


# --------------------------------------------------------------------------- invariants


def check_invariants(alloc: Allocator) -> None:
    """Recompute every derived structure from the groups, bindings and health, and compare;
    then check the allocation rules. Raises AssertionError with a description."""
    topo, cells, buddy = alloc.topo, alloc.cells, alloc.buddy
    groups = alloc.groups
    n = topo.size
    leaves_all = [c for c in range(n) if topo.level[c] == 1]

    # -- who holds what: no leaf used by two groups, reserved by two preemptors
    owner: dict[int, str] = {}
    reserver: dict[int, str] = {}
    for name, g in groups.items():
        held = g.leaves()
        assert len(held) == len(set(held)), f"{name} lists a leaf twice"
        # A reconfiguration may drop leaves that left the cluster: never more than asked.
        sizes = [len(p) for p in g.pods]
        assert len(sizes) == len(g.spec.pod_sizes), f"{name}: pod count"
        assert all(n <= m for n, m in zip(sizes, g.spec.pod_sizes, strict=True)), f"{name}: pods"
        assert any(sizes), f"{name} holds no leaf"
        for pod in g.pods:
            assert len({topo.node_cell[leaf] for leaf in pod}) <= 1, f"{name}: pod spans nodes"
            assert all(topo.chain_of[leaf] == g.chain for leaf in pod), f"{name}: chains"
        table = reserver if g.preempting else owner
        for leaf in held:
            assert leaf not in table, f"leaf {topo.address[leaf]} held by {table[leaf]} and {name}"
            table[leaf] = name
    for leaf in leaves_all:
        assert cells.owner[leaf] == owner.get(leaf), f"owner of {topo.address[leaf]}"
        assert cells.reserver[leaf] == reserver.get(leaf), f"reserver of {topo.address[leaf]}"

    # -- claims: only a placed group's member pods, each held by one pod, a pod holding one
    for name, g in groups.items():
        assert g.preempting or g.created <= g.token, f"{name} placed before it was created"
        if g.preempting:
            assert not g.claims, f"preempting {name} has claims"
        uids = [uid for uid, _ in g.claims.values()]
        assert all(0 <= slot < len(g.pods) for slot in g.claims), f"{name}: claimed slot"
        assert all(uids) and all(pod for _, pod in g.claims.values()), f"{name}: empty claim"
        assert len(set(uids)) == len(uids), f"{name}: a pod holds two member pods"

    # -- priorities and preemption rules
    def prio(name: str) -> int:
        g = groups[name]
        return -1 if g.downgraded else g.spec.priority

    for name, g in groups.items():
        if g.preempting:
            # HiveD: with every victim gone the preemptor stays reserved until confirmed
            confirm = alloc.options.reservations == RESERVE_UNTIL_CONFIRMED
            assert g.victims or confirm, f"preempting {name} has no victims"
            assert g.spec.priority >= 0, "only guaranteed groups preempt"
            for v in g.victims:
                assert v in groups and not groups[v].preempting, f"{name}: victim {v}"
                assert prio(v) < g.spec.priority, f"{name} preempts {v} without higher priority"
                assert name in groups[v].preemptors
                assert set(g.leaves()) & set(groups[v].leaves()), f"{name}/{v} do not overlap"
            # every user of a reserved leaf is a victim
            assert {owner[leaf] for leaf in g.leaves() if leaf in owner} == g.victims
            assert not any(cells.bad[leaf] for leaf in g.leaves()), f"{name} reserves bad leaves"
        else:
            assert not g.victims
            for p in g.preemptors:
                assert groups[p].preempting and g.spec.name in groups[p].victims
    for leaf in leaves_all:
        expected = FREE
        if leaf in owner:
            expected = prio(owner[leaf])
        if leaf in reserver:
            expected = max(expected, prio(reserver[leaf]))
            assert leaf not in owner or prio(reserver[leaf]) > prio(owner[leaf])
        assert cells.eff[leaf] == expected, f"eff of {topo.address[leaf]}"

    # -- guaranteed groups stay inside their VC's cells (the pinned one if they name it)
    used = [0] * len(topo.items)
    for name, g in groups.items():
        if g.spec.priority < 0 or g.downgraded:
            continue
        for leaf in g.leaves():
            item = cells.item_of[leaf]
            assert item >= 0, f"{name}: leaf {topo.address[leaf]} is in no bound VC cell"
            it = topo.items[item]
            assert it.vc == g.spec.vc, f"{name}: leaf in {it.vc}'s cell"
            assert it.pinned_id == g.spec.pinned, f"{name}: pinned cell mismatch"
            used[item] += 1
    assert used == buddy.item_used, "item usage counts"

    # -- bindings: isomorphic cover, pinned always bound, unused floating ones only if doomed
    bound = {}
    for it in topo.items:
        c = buddy.item_cell[it.id]
        if it.pinned_id:
            assert c == it.pinned_cell
        if c < 0:
            assert it.id in buddy.unbound[it.slot]
            assert not buddy.doomed[it.id]
            continue
        assert topo.level[c] == it.level and topo.chain_of[c] == it.chain
        assert not it.pinned_id or c == it.pinned_cell
        if not it.pinned_id and not used[it.id]:
            assert buddy.doomed[it.id], f"unused item {topo.item_label(it.id)} left bound"
        if buddy.doomed[it.id]:
            assert cells.bad_n[c] > 0 and not used[it.id], "a doomed cell must be bad and unused"
        bound[c] = it.id
    for c in range(n):
        inside = [a for a in topo.ancestors[c] if a in bound]
        assert len(inside) <= 1, "bound cells nest"
        assert cells.item_of[c] == (bound[inside[0]] if inside else -1), "item_of"

    # -- free lists: the maximal cells with nothing bound in, under or above them
    has_bound = [False] * n
    for c in sorted(range(n), key=lambda c: topo.level[c]):
        if c in bound:
            has_bound[c] = True
        if has_bound[c] and topo.parent[c] >= 0:
            has_bound[topo.parent[c]] = True
    free = [
        not has_bound[c] and not any(a in bound for a in topo.ancestors[c]) for c in range(n)
    ]
    for info in topo.chains:
        for level in range(1, info.top_level + 1):
            listed = sorted(
                c
                for c in range(n)
                if topo.chain_of[c] == info.index
                and topo.level[c] == level
                and free[c]
                and topo.complete[c]  # a partly filled cell is never listed whole
                and (
                    topo.parent[c] < 0
                    or not free[topo.parent[c]]
                    or not topo.complete[topo.parent[c]]
                )
            )
            assert buddy.free[info.index][level - 1] == listed, f"free list level {level}"
        # -- safety: per level, what is obtainable covers what the VCs may still claim
        demand = [0] * info.top_level
        for it in topo.items:
            if it.chain == info.index and not it.pinned_id and buddy.item_cell[it.id] < 0:
                demand[it.level - 1] += 1
        assert demand == buddy.demand[info.index]
        counts = [len(fl) for fl in buddy.free[info.index]]
        carry = 0
        total_left = 0
        for level in range(info.top_level, 0, -1):
            child = info.info(level + 1).child_number if level < info.top_level else 0
            carry = counts[level - 1] - demand[level - 1] + carry * child
            total_left = counts[level - 1] + total_left * child
            assert carry >= 0, f"safety broken in {info.name} at level {level}"
            assert total_left >= demand[level - 1]

    for info in topo.chains:
        doomed = sum(1 for it in topo.items if it.chain == info.index and buddy.doomed[it.id])
        assert buddy.n_doomed[info.index] == doomed, "doomed count"
        bad = sum(1 for leaf in leaves_all if topo.chain_of[leaf] == info.index and cells.bad[leaf])
        assert cells.chain_bad[info.index] == bad, "bad leaf count"

    # -- counters and indexes (the histograms as kept, their due changes made on a copy:
    # nothing settled, so what is due stays due from step to step as it does in a store)
    kept_hist = hist_with_due_changes(cells)
    for c in range(n):
        fr = sum(1 for x in topo.leaves[c] if not cells.bad[x] and cells.eff[x] == FREE)
        bad = sum(1 for x in topo.leaves[c] if cells.bad[x])
        hist: dict[int, int] = {}
        for x in topo.leaves[c]:
            if not cells.bad[x] and cells.eff[x] != FREE:
                hist[cells.eff[x]] = hist.get(cells.eff[x], 0) + 1
        assert (cells.free_n[c], cells.bad_n[c], kept_hist[c]) == (fr, bad, hist), "counters"
    expected_buckets: list[list[list[list[int]]]] = [
        [[[] for _ in b] for b in index] for index in cells.buckets
    ]
    for c in range(n):
        level, chain = topo.level[c], topo.chain_of[c]
        if cells.free_n[c]:
            if level >= 2:
                insort(expected_buckets[chain][level - 1][cells.free_n[c]], c)
                if free[c]:
                    insort(
                        expected_buckets[cells.region(chain)][level - 1][cells.free_n[c]], c
                    )
            item = cells.item_of[c]
            if item >= 0 and (level >= 2 or c in bound):
                key = cells.n_chains + topo.items[item].key
                insort(expected_buckets[key][level - 1][cells.free_n[c]], c)
    assert expected_buckets == cells.buckets, "free-capacity indexes"
    check_stale_notes(cells)


def hist_with_due_changes(cells: CellState) -> list[dict[int, int]]:
    """Every cell's histogram as ``cells`` keeps it with its due changes made, on copies
    (``CellState.hist`` would make them in place)."""
    hist = [dict(h) for h in cells._hist]
    for key, (under, prio, times) in cells._hist_due.items():
        assert key == (id(under), prio) and times, f"due histogram change {key}"
        for c, n in under.items():
            left = hist[c].get(prio, 0) + n * times
            if left:
                hist[c][prio] = left
            else:
                del hist[c][prio]
    return hist


def check_stale_notes(cells: CellState) -> None:
    """The cells' references to the stale notes of the index levels listing them, and the
    kept ancestor counts of moved leaves, are what their definitions say (``CellState``)."""
    topo, stale = cells.topo, cells._stale
    first_key, first_region = cells.n_chains, cells.n_chains + cells.n_keys
    for c in range(topo.size):
        level, chain, item = topo.level[c], topo.chain_of[c], cells.item_of[c]
        chain_notes = stale[chain][level - 1] if level >= 2 else None
        region_notes = stale[first_region + chain][level - 1] if level >= 2 else None
        key_notes = (stale[first_key + cells.key_of_item[item]][level - 1]
                     if item >= 0 and (level >= 2 or cells.item_root[item] == c) else None)
        assert cells._chain_stale_of[c] is chain_notes, f"chain notes of {topo.address[c]}"
        assert cells._region_stale_of[c] is region_notes, f"region notes of {topo.address[c]}"
        assert cells._key_stale_of[c] is key_notes, f"key notes of {topo.address[c]}"
    for moved, under in cells._under.items():
        counted: dict[int, int] = {}
        for leaf in moved:
            for a in topo.ancestors[leaf][1:]:
                counted[a] = counted.get(a, 0) + 1
        assert dict(under) == counted, f"kept ancestor counts of {moved}"


def allocation_state(store: ClusterStore) -> list[Any]:
    """Every piece of allocation state (derived included), without leaf revisions."""
    return store.allocator.debug_state()


#: where a store's snapshot holds its session table (``ClusterStore.snapshot``'s fields)
SESSIONS_FIELD = 6


def without_sessions(snapshot: bytes) -> list[Any]:
    """A store's snapshot without its session table: what a refused request leaves as it was
    (the session table remembers the refusal, so a later copy of the request is refused too)."""
    fields: list[Any] = msgpack.unpackb(snapshot)
    del fields[SESSIONS_FIELD]
    return fields
