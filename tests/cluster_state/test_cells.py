import pytest
from cs_helpers import multi_chain_config
from reconfig_helpers import variant

from cluster_state import ClusterConfig, Topology, parse_config, synthetic_config


def test_cells_are_numbered_depth_first_with_parallel_facts() -> None:
    topo = Topology(multi_chain_config())
    v100 = topo.chains[topo.chain_index["V100-RACK"]]
    rack_a = v100.tops[0]
    assert topo.address[rack_a] == "rack-a" and topo.level[rack_a] == 5
    node = topo.nodes["dgx-a1"][0]
    assert topo.address[node] == "rack-a/dgx-a1" and topo.node_cell[node] == node
    assert topo.parent[node] == rack_a and node in topo.children[rack_a]
    leaves = topo.leaves[node]
    assert [topo.device[x] for x in leaves] == list(range(8))
    assert [topo.address[x] for x in leaves[:3]] == [
        "rack-a/dgx-a1/0/0/0",
        "rack-a/dgx-a1/0/0/1",
        "rack-a/dgx-a1/0/1/2",
    ]
    assert all(topo.node_name[x] == "dgx-a1" and topo.node_cell[x] == node for x in leaves)
    assert topo.node_cell[rack_a] == -1 and topo.node_name[rack_a] == ""
    assert topo.ancestors[leaves[0]][-1] == rack_a and topo.ancestors[leaves[0]][3] == node
    assert topo.desc[rack_a][3] == tuple(topo.nodes[f"dgx-a{i}"][0] for i in range(4))
    assert topo.desc[rack_a][0] == topo.leaves[rack_a]
    assert sorted(topo.leaves[rack_a]) == list(topo.leaves[rack_a])  # ids follow addresses
    assert topo.device_leaf[(node, 5)] == leaves[5]


def test_items_slots_and_keys() -> None:
    topo = Topology(multi_chain_config())
    assert topo.vcs == ("VC1", "VC2", "VC3")
    pin = topo.items[topo.vc_pinned["VC1"]["VC1-PIN"]]
    assert pin.pinned_cell == topo.nodes["dgx-b0"][0] and pin.slot == -1
    # a pinned cell has a placement key of its own; floating cells share one per VC and chain
    v100 = topo.chain_index["V100-RACK"]
    floating = topo.key_of[("VC1", v100)]
    assert pin.key != floating
    assert [topo.items[i].pinned_id for i in topo.key_items[floating]] == ["", ""]
    assert topo.item_label(pin.id) == "VC1-PIN"
    assert topo.item_label(topo.key_items[floating][1]) == "VC1/V100-NODE/1"
    slots = topo.vc_slots[("VC2", v100)]
    assert [topo.slots[s] for s in slots] == [("VC2", v100, 5)]
    assert topo.vc_chains["VC3"] == (v100,)


@pytest.mark.parametrize("config", [
    multi_chain_config(),
    parse_config(variant("without_a3")),  # a partly filled rack
    parse_config(variant("k80_2_moves_chain")),  # ... and a cell of one child
    synthetic_config(nodes=24, gpus_per_node=8, nodes_per_rack=4, vcs=3, pinned=1),
], ids=["multi-chain", "partly-filled", "only-child", "synthetic"])
def test_a_subtree_is_its_cells_counted_by_level(config: ClusterConfig) -> None:
    # ``subtree`` ends at the cell's last leaf (pre-order ids); what it stands for: the
    # cell and its descendants of every level, consecutive
    topo = Topology(config)
    for c in range(topo.size):
        assert topo.subtree(c) == range(c, c + sum(map(len, topo.desc[c])))
        assert sorted(d for level in topo.desc[c] for d in level) == list(topo.subtree(c))
