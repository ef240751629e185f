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
