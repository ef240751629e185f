import itertools

import pytest
from cs_helpers import check_invariants

from cluster_state import ClusterStore, GroupSpec, Member, Topology, parse_config
from cluster_state.buddy import CLEAN, HEALTHY, SICK, Buddy
from cluster_state.index import CellState

# One chain: 2 racks x 2 nodes x 4 GPUs (node -> 2 pairs -> 2 GPUs). VC "R" is promised a
# whole rack, VC "N" two nodes: exactly what the cluster has, so order matters for safety.
SMALL = """
physicalCluster:
  cellTypes:
    PAIR: {childCellType: G, childCellNumber: 2}
    NODE: {childCellType: PAIR, childCellNumber: 2, isNodeLevel: true}
    RACK: {childCellType: NODE, childCellNumber: 2}
  physicalCells:
  - {cellType: RACK, cellAddress: r0, cellChildren: [{cellAddress: n0}, {cellAddress: n1}]}
  - {cellType: RACK, cellAddress: r1, cellChildren: [{cellAddress: n2}, {cellAddress: n3}]}
virtualClusters:
  R: {virtualCells: [{cellType: RACK, cellNumber: 1}]}
  N: {virtualCells: [{cellType: RACK.NODE, cellNumber: 2}]}
"""


def setup() -> tuple[Topology, CellState, Buddy]:
    topo = Topology(parse_config(SMALL))
    cells = CellState(topo)
    return topo, cells, Buddy(topo, cells)


def node(topo: Topology, name: str) -> int:
    return topo.nodes[name][0]


def items(topo: Topology, vc: str) -> list[int]:
    return [it.id for it in topo.items if it.vc == vc]


def test_binding_splits_and_unbinding_merges_buddies() -> None:
    topo, cells, buddy = setup()
    r0, r1 = topo.chains[0].tops
    assert buddy.free[0] == [[], [], [], [r0, r1]]
    n_items = items(topo, "N")
    buddy.bind(n_items[0], node(topo, "n0"))
    assert buddy.free[0][3] == [r1] and buddy.free[0][2] == [node(topo, "n1")]
    assert buddy.demand[0] == [0, 0, 1, 1]
    assert cells.item_of[topo.leaves[node(topo, "n0")][0]] == n_items[0]
    buddy.unbind(n_items[0])
    assert buddy.free[0] == [[], [], [], [r0, r1]]
    assert cells.item_of == [-1] * topo.size
    assert buddy.unbound[topo.items[n_items[0]].slot] == n_items


def test_free_lists_depend_only_on_what_is_bound() -> None:
    topo, _, _ = setup()
    n0, n1 = node(topo, "n0"), node(topo, "n1")
    results = set()
    for order in itertools.permutations([0, 1]):
        _, _, buddy = setup()
        a, b = items(topo, "N")
        buddy.bind(a, n0)
        buddy.bind(b, n1)
        for i in order:
            buddy.unbind((a, b)[i])
        buddy.bind(a, n1)
        results.add(repr(buddy.free) + repr(buddy.item_cell))
    assert len(results) == 1


def test_safety_forbids_splitting_the_rack_another_vc_needs() -> None:
    topo, _, buddy = setup()
    (rack_item,) = items(topo, "R")
    a, b = items(topo, "N")
    # N's first node may split a rack (one rack stays for R) ...
    assert buddy.safe_take(0, 3, 4)
    assert buddy.find_cell(0, 3, CLEAN) == node(topo, "n0")
    buddy.bind(a, node(topo, "n0"))
    # ... its second must come from the same, already split rack
    assert buddy.find_cell(0, 3, CLEAN) == node(topo, "n1")
    assert not buddy.safe_take(0, 3, 4)
    buddy.bind(b, node(topo, "n1"))
    assert min(buddy.surplus(0)) == 0
    assert buddy.find_cell(0, 4, CLEAN) == topo.chains[0].tops[1]
    buddy.bind(rack_item, topo.chains[0].tops[1])
    assert buddy.find_cell(0, 3, HEALTHY) == -1  # nothing left


def test_find_cell_modes() -> None:
    topo, cells, buddy = setup()
    n0 = node(topo, "n0")
    leaf = topo.leaves[n0][0]
    cells.set_leaves([leaf], [-1], 0)  # an opportunistic user on n0
    assert buddy.find_cell(0, 3, CLEAN) == node(topo, "n1")
    # HEALTHY takes the fewest used leaves: n1 is untouched
    assert buddy.find_cell(0, 3, HEALTHY) == node(topo, "n1")
    cells.set_bad(list(topo.leaves[node(topo, "n1")]), True, 0)
    assert buddy.find_cell(0, 3, CLEAN) == node(topo, "n2")
    assert buddy.find_cell(0, 3, SICK) == node(topo, "n1")
    assert buddy.healthy_obtainable(0, 3) == 3 and buddy.healthy_obtainable(0, 4) == 1


def test_doomed_bindings_follow_health() -> None:
    topo, cells, buddy = setup()
    (rack_item,) = items(topo, "R")
    r0 = topo.chains[0].tops[0]
    cells.set_bad(list(topo.leaves[node(topo, "n0")]), True, 0)
    buddy.reconcile_doomed(0)
    assert buddy.item_cell[rack_item] == -1  # r1 is still healthy: nothing doomed
    cells.set_bad(list(topo.leaves[node(topo, "n3")]), True, 0)
    buddy.reconcile_doomed(0)
    # no healthy rack is left: R's rack cell is doomed to the first bad one
    assert buddy.item_cell[rack_item] == r0 and buddy.doomed[rack_item]
    # n1 went with r0, so N's two nodes have one healthy node left (n2): one is doomed (n3)
    doomed = [buddy.item_cell[i] for i in items(topo, "N") if buddy.doomed[i]]
    assert doomed == [node(topo, "n3")]
    assert buddy.healthy_obtainable(0, 3) == 1
    cells.set_bad(list(topo.leaves[node(topo, "n0")]), False, 0)
    buddy.reconcile_doomed(0)
    assert buddy.item_cell[rack_item] == -1 and not buddy.doomed[rack_item]


def test_take_refuses_a_cell_that_is_not_free() -> None:
    topo, _, buddy = setup()
    a, b = items(topo, "N")
    buddy.bind(a, node(topo, "n0"))
    with pytest.raises(AssertionError):
        buddy.bind(b, node(topo, "n0"))


# A node of one pair (an only child: nothing to list beside it) in racks of three nodes (a
# middle node's siblings lie on both sides of it)
ONLY_CHILD = """
physicalCluster:
  cellTypes: {PAIR: {childCellType: G, childCellNumber: 2},
              NODE: {childCellType: PAIR, childCellNumber: 1, isNodeLevel: true},
              RACK: {childCellType: NODE, childCellNumber: 3}}
  physicalCells:
  - {cellType: RACK, cellAddress: r0,
     cellChildren: [{cellAddress: n0}, {cellAddress: n1}, {cellAddress: n2}]}
  - {cellType: RACK, cellAddress: r1,
     cellChildren: [{cellAddress: n3}, {cellAddress: n4}, {cellAddress: n5}]}
virtualClusters: {P: {virtualCells: [{cellType: RACK.NODE.PAIR, cellNumber: 3}]},
                  R: {virtualCells: [{cellType: RACK, cellNumber: 1}]}}
"""


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_splits_and_merges_past_only_children_and_middle_cells(order: tuple[int, ...]) -> None:
    # every item bound by a placement (a rack split down to a pair, beside only children),
    # then the placements released in every order (merging back past them): the free lists
    # stay what their plain definition says (check_invariants) and come back as they began
    store = ClusterStore(parse_config(ONLY_CHILD))
    alloc = store.allocator
    start = repr(alloc.buddy.free)
    for i in range(3):
        alloc.submit(GroupSpec(name=f"g{i}", vc="P", priority=1, members=(Member(1, 2),)), i)
        alloc.finish()
        check_invariants(alloc)
    # (R's rack is kept whole: every pair comes from the first rack)
    bound = sorted(alloc.buddy.item_cell[it] for it in items(alloc.topo, "P"))
    assert bound == list(alloc.topo.desc[alloc.topo.chains[0].tops[0]][1])
    for step, i in enumerate(order):
        alloc.release(f"g{i}", 3 + step)
        alloc.finish()
        check_invariants(alloc)
    assert repr(alloc.buddy.free) == start
