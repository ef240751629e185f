from cs_helpers import multi_chain_config

from cluster_state import Topology
from cluster_state.index import CellState
from cluster_state.placement import Picker


def setup() -> tuple[Topology, CellState]:
    topo = Topology(multi_chain_config())
    return topo, CellState(topo)


def node(topo: Topology, name: str) -> int:
    return topo.nodes[name][0]


def devices(topo: Topology, leaves: tuple[int, ...]) -> list[int]:
    return [topo.device[leaf] for leaf in leaves]


def test_pick_takes_the_lowest_common_ancestor() -> None:
    topo, cells = setup()
    n = node(topo, "dgx-a0")
    leaves = topo.leaves[n]
    cells.set_leaves([leaves[0]], [5], 0)  # GPU 0 is busy
    picker = Picker(topo, cells, None)
    # 2 GPUs: the free switch [2, 3], not [1, 2] across switches
    assert devices(topo, picker.pick(n, 2)) == [2, 3]
    # 1 GPU: best fit, the lone free GPU of the first switch
    assert devices(topo, picker.pick(n, 1)) == [1]
    # 4 GPUs: socket 0 is full now, socket 1 holds them all
    assert devices(topo, picker.pick(n, 4)) == [4, 5, 6, 7]


def test_pick_spans_children_fullest_first_when_none_holds_the_pod() -> None:
    topo, cells = setup()
    n = node(topo, "dgx-a0")
    leaves = topo.leaves[n]
    cells.set_leaves([leaves[0], leaves[4], leaves[5]], [5, 5, 5], 0)
    # free: 1,2,3 (socket 0) and 6,7 (socket 1); 5 GPUs need both sockets, 3 + 2
    assert devices(topo, Picker(topo, cells, None).pick(n, 5)) == [1, 2, 3, 6, 7]


def test_pack_is_best_fit_decreasing_over_nodes() -> None:
    topo, cells = setup()
    a0, a1 = node(topo, "dgx-a0"), node(topo, "dgx-a1")
    cells.set_leaves(list(topo.leaves[a1][:4]), [5] * 4, 0)  # a1 has 4 free, a0 has 8
    picker = Picker(topo, cells, None)
    pods = picker.pack([a0, a1], [2, 8, 2], [1, 0, 2])
    assert pods is not None
    # the 8-GPU pod can only go to a0; the small ones fill the fuller a1
    assert [topo.node_name[p[0]] for p in pods] == ["dgx-a1", "dgx-a0", "dgx-a1"]
    assert devices(topo, pods[0]) == [4, 5] and devices(topo, pods[2]) == [6, 7]
    # nothing left for one more GPU in these nodes
    assert picker.pack([a0, a1], [1], [0]) is None


def test_second_pass_takes_lower_priority_leaves_preferring_free_ones() -> None:
    topo, cells = setup()
    n = node(topo, "dgx-a0")
    leaves = topo.leaves[n]
    cells.set_leaves(list(leaves[:6]), [3, 3, 3, 3, 9, 9], 0)
    assert Picker(topo, cells, None).pack([n], [3], [0]) is None
    # At priority 5 the leaves of priority 3 count too. Where the common ancestor is the same
    # (2 GPUs fit in either socket) the free ones win ...
    assert devices(topo, Picker(topo, cells, 5).pick(n, 2)) == [6, 7]
    # ... but a lower common ancestor comes first: socket 0, rather than 6, 7 and one more
    assert devices(topo, Picker(topo, cells, 5).pick(n, 3)) == [0, 1, 2]
    assert cells.avail(n, 5) == 6 and cells.avail(n, 10) == 8 and cells.avail(n, 3) == 2
