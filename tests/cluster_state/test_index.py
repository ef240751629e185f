import random
from collections.abc import Callable

from cs_helpers import multi_chain_config

from cluster_state import Topology
from cluster_state.index import FREE, CellState


def test_counters_follow_leaf_changes_on_every_ancestor() -> None:
    topo = Topology(multi_chain_config())
    cells = CellState(topo)
    node = topo.nodes["dgx-a0"][0]
    rack = topo.parent[node]
    leaves = topo.leaves[node]
    cells.set_leaves(leaves[:3], [-1, 5, 5], 7)
    assert (cells.free_n[node], cells.free_n[rack]) == (5, 29)
    assert cells.hist[node] == {-1: 1, 5: 2} and cells.hist[rack] == {-1: 1, 5: 2}
    assert [cells.rev[x] for x in leaves[:4]] == [7, 7, 7, -1]
    cells.set_bad(list(leaves), True, 8)
    assert (cells.free_n[node], cells.bad_n[node], cells.hist[node]) == (0, 8, {})
    assert cells.avail(rack, 1000) == 24
    cells.set_leaves(leaves[:3], [FREE, FREE, FREE], 9)  # freed while bad: still not free
    cells.set_bad(list(leaves), False, 10)
    assert (cells.free_n[node], cells.bad_n[node], cells.hist[node]) == (8, 0, {})


def test_candidates_are_best_fit_then_lowest_id() -> None:
    topo = Topology(multi_chain_config())
    cells = CellState(topo)
    v100 = topo.chain_index["V100-RACK"]
    a0, a1, a2 = (topo.nodes[f"dgx-a{i}"][0] for i in range(3))
    cells.set_leaves(topo.leaves[a1][:6], [3] * 6, 0)  # 2 free
    cells.set_leaves(topo.leaves[a2][:4], [3] * 4, 0)  # 4 free
    assert list(cells.candidates(v100, 4, 2))[:3] == [a1, a2, a0]
    assert list(cells.candidates(v100, 4, 3))[:2] == [a2, a0]
    assert cells.region(v100) == cells.n_chains + cells.n_keys + v100


def _rebuilt(topo: Topology, cells: CellState, roots: dict[int, int]) -> CellState:
    """A state built in bulk from ``cells``' leaf facts alone, indexes made in one pass."""
    fresh = CellState(topo, bulk=True)
    leaves = [c for c in range(topo.size) if topo.level[c] == 1]
    fresh.set_leaves(leaves, [cells.eff[c] for c in leaves], 0)
    fresh.set_bad([c for c in leaves if cells.bad[c]], True, 0)
    for item, root in roots.items():
        fresh.mark_item(root, item)
    fresh.rebuild_indexes()
    return fresh


PRIORITIES = [FREE, FREE, -1, 5, 100]


def _changed_at_random(seed: int, change: Callable[[CellState, random.Random, list[int], int],
                                                   None]) -> None:
    """``change(cells, rng, leaves, rev)`` for 300 revisions of a state with two bound items,
    some leaves turned bad or healthy every 25; then the state is the one rebuilt from its
    leaves."""
    topo = Topology(multi_chain_config())
    cells = CellState(topo)
    rng = random.Random(seed)
    leaves = [c for c in range(topo.size) if topo.level[c] == 1]
    roots = {0: topo.nodes["dgx-a1"][0], 1: topo.parent[topo.nodes["dgx-b0"][0]]}
    for item, root in roots.items():
        cells.mark_item(root, item)
    for rev in range(300):
        change(cells, rng, leaves, rev)
        if rev % 25 == 0:
            cells.set_bad(rng.sample(leaves, 3), rng.random() < 0.6, rev)
    fresh = _rebuilt(topo, cells, roots)
    assert (cells.eff, cells.free_n, cells.bad_n, cells.hist) == (
        fresh.eff, fresh.free_n, fresh.bad_n, fresh.hist)
    assert cells.buckets == fresh.buckets


def test_mixed_changes_in_one_call_match_a_state_rebuilt_from_the_leaves() -> None:
    # set_leaves moves the counters and buckets once per kind of change ((old, new) pair,
    # several per call here: placements, releases, priority changes), some leaves bad
    def change(cells: CellState, rng: random.Random, leaves: list[int], rev: int) -> None:
        chosen = rng.sample(leaves, rng.randint(1, 12))
        cells.set_leaves(chosen, [rng.choice(PRIORITIES) for _ in chosen], rev)

    _changed_at_random(7, change)


def test_leaves_moved_to_one_priority_match_a_state_rebuilt_from_the_leaves() -> None:
    # set_leaves_to: one loop per leaf when the leaves move from one priority and none is
    # bad, set_leaves otherwise (mixed priorities, some bad); the same state either way
    def change(cells: CellState, rng: random.Random, leaves: list[int], rev: int) -> None:
        start = rng.randrange(len(leaves))
        chosen = leaves[start : start + rng.randint(1, 12)]
        if rng.random() < 0.7:  # a group's leaves: one priority before
            cells.set_leaves(chosen, [cells.eff[chosen[0]]] * len(chosen), rev)
        cells.set_leaves_to(chosen, rng.choice(PRIORITIES), rev)
        assert all(cells.rev[c] == rev for c in chosen)

    _changed_at_random(11, change)
