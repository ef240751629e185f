import copy
from typing import Any

import pytest
import yaml
from cs_helpers import MULTI_CHAIN_YAML, multi_chain_config

from cluster_state import GpuConfigError, Topology, parse_config, synthetic_config
from cluster_state.config import load_config

# HiveD's example/config/basic/hivedscheduler.yaml, as summarised in the reference.
BASIC = """
physicalCluster:
  cellTypes:
    K80-2GPU:   {childCellType: K80, childCellNumber: 2}
    K80-NODE:   {childCellType: K80-2GPU, childCellNumber: 2, isNodeLevel: true}
    3-K80-NODE: {childCellType: K80-NODE, childCellNumber: 3}
  physicalCells:
  - cellType: 3-K80-NODE
    cellChildren:
    - cellAddress: 10.151.41.20
    - cellAddress: 10.151.41.21
      pinnedCellId: VC2-K80
    - cellAddress: 10.151.41.22
virtualClusters:
  VC1: {virtualCells: [{cellType: 3-K80-NODE.K80-NODE, cellNumber: 1}]}
  VC2:
    virtualCells: [{cellType: 3-K80-NODE.K80-NODE, cellNumber: 1}]
    pinnedCells: [{pinnedCellId: VC2-K80}]
"""


def raw() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(MULTI_CHAIN_YAML)
    return copy.deepcopy(loaded)


def test_basic_hived_example_parses_with_inferred_children_and_addresses() -> None:
    config = parse_config(BASIC)
    (top,) = config.physical_cells
    assert top.cell_type == "3-K80-NODE" and top.address == "0"  # index in physicalCells
    node = top.children[1]
    assert node.address == "10.151.41.21" and node.pinned_id == "VC2-K80"
    # Below the node: switch addresses 0,1; GPUs numbered parent*2+i from 0 at the node.
    assert [c.address for c in node.children] == ["0", "1"]
    assert [g.address for c in node.children for g in c.children] == ["0", "1", "2", "3"]
    assert [vc.name for vc in config.virtual_clusters] == ["VC1", "VC2"]
    assert config.virtual_clusters[1].pinned_cells == ("VC2-K80",)
    topo = Topology(config)
    assert topo.address[topo.device_leaf[(topo.nodes["10.151.41.22"][0], 3)]] == (
        "0/10.151.41.22/1/3"
    )


def test_explicit_non_standard_device_indices_are_kept() -> None:
    text = BASIC.replace(
        "    - cellAddress: 10.151.41.22\n",
        "    - cellAddress: 10.151.41.22\n"
        "      cellChildren:\n"
        "      - cellChildren: [{cellAddress: 1}, {cellAddress: 3}]\n"
        "      - cellChildren: [{cellAddress: 0}, {cellAddress: 2}]\n",
    )
    topo = Topology(parse_config(text))
    node = topo.nodes["10.151.41.22"][0]
    assert [topo.device[leaf] for leaf in topo.leaves[node]] == [1, 3, 0, 2]


def test_multi_chain_config_levels_and_chains() -> None:
    topo = Topology(multi_chain_config())
    names = [c.name for c in topo.chains]
    assert names == ["3-K80-NODE", "V100-RACK"]
    v100 = topo.chains[topo.chain_index["V100-RACK"]]
    assert (v100.leaf_type, v100.node_level, v100.top_level) == ("V100", 4, 5)
    assert [i.leaf_number for i in v100.levels] == [1, 2, 4, 8, 32]
    assert topo.chains_for_leaf == {"K80": (0,), "V100": (1,)}
    assert set(topo.nodes) == {f"dgx-{r}{i}" for r in "ab" for i in range(4)} | {
        "k80-0",
        "k80-1",
        "k80-2",
    }
    # VC1: 2 floating V100 nodes, 1 K80 node and its pinned node
    vc1 = [it for it in topo.items if it.vc == "VC1"]
    assert sorted((topo.chains[it.chain].name, it.level, it.pinned_id) for it in vc1) == [
        ("3-K80-NODE", 3, ""),
        ("V100-RACK", 4, ""),
        ("V100-RACK", 4, ""),
        ("V100-RACK", 4, "VC1-PIN"),
    ]


def test_to_yaml_round_trips() -> None:
    config = multi_chain_config()
    again = parse_config(config.to_yaml())
    assert again == config
    assert Topology(again).digest == Topology(config).digest


def test_load_config_reads_a_file(tmp_path: Any) -> None:
    path = tmp_path / "hived.yaml"
    path.write_text(BASIC)
    assert load_config(path) == parse_config(BASIC)


def _error(config: dict[str, Any] | str) -> str:
    with pytest.raises(GpuConfigError) as info:
        parse_config(config)
    return str(info.value)


def test_cycle_in_cell_types_is_named() -> None:
    config = raw()
    config["physicalCluster"]["cellTypes"]["V100"] = {
        "childCellType": "V100-RACK",
        "childCellNumber": 1,
    }
    message = _error(config)
    assert "not a forest" in message and "cycle" in message and "V100-RACK" in message


def test_child_of_the_wrong_type_is_named() -> None:
    config = raw()
    config["physicalCluster"]["physicalCells"][0]["cellChildren"][1]["cellType"] = "K80-NODE"
    message = _error(config)
    assert "rack-a/dgx-a1" in message and "unknown child type" in message


@pytest.mark.parametrize(("where", "key", "fragment"), [
    ([], "virtualCluster", "configuration: unknown key virtualCluster (did you mean "
     "virtualClusters?)"),
    (["physicalCluster"], "celltypes", "physicalCluster: unknown key celltypes (did you mean "
     "cellTypes?)"),
    (["physicalCluster", "cellTypes", "V100-NODE"], "isNodelevel", "cell type V100-NODE: "
     "unknown key isNodelevel (did you mean isNodeLevel?)"),
    (["physicalCluster", "physicalCells", 0], "cellAdress", "physicalCells[0]: unknown key "
     "cellAdress (did you mean cellAddress?)"),
    (["physicalCluster", "physicalCells", 0, "cellChildren", 1], "pinnedCellID",
     "physical cell rack-a (V100-RACK): child 1: unknown key pinnedCellID (did you mean "
     "pinnedCellId?)"),
    (["virtualClusters", "VC1"], "virtualcells", "virtual cluster VC1: unknown key "
     "virtualcells (did you mean virtualCells?)"),
    (["virtualClusters", "VC1", "virtualCells", 0], "number", "virtualCells[0]: unknown key "
     "number"),
])
def test_unknown_keys_are_refused_naming_the_nearest_known_one(
    where: list[Any], key: str, fragment: str
) -> None:
    # issue 34: a misspelled top-level virtualCluster: loaded as zero VCs without a word
    config = raw()
    table = config
    for step in where:
        table = table[step]
    table[key] = table.pop("virtualClusters") if key == "virtualCluster" else 1
    assert fragment in _error(config)


def test_the_keys_hived_reads_and_the_store_ignores_are_accepted() -> None:
    config = raw()
    config.update(webServerAddress=":9096", waitingPodSchedulingBlockMilliSec=50,
                  kubeApiServerAddress="http://k8s:8080", forcePodBindThreshold=3)
    assert "skuTypes" in config["physicalCluster"]  # OpenPAI's, in the shared fixture
    assert parse_config(config) == parse_config(raw())


def test_unknown_top_level_type_is_named() -> None:
    config = raw()
    config["physicalCluster"]["physicalCells"][2]["cellType"] = "P100-NODE"
    assert "unknown cell type 'P100-NODE'" in _error(config)


def test_duplicate_node_address_is_named() -> None:
    config = raw()
    config["physicalCluster"]["physicalCells"][1]["cellChildren"][2]["cellAddress"] = "dgx-a2"
    message = _error(config)
    assert "duplicate node address dgx-a2" in message and "rack-a/dgx-a2" in message


def test_duplicate_sibling_address_is_named() -> None:
    config = raw()
    config["physicalCluster"]["physicalCells"][1]["cellAddress"] = "rack-a"
    assert "duplicate cell address rack-a" in _error(config)


def test_duplicate_pinned_id_is_named() -> None:
    config = raw()
    config["physicalCluster"]["physicalCells"][0]["cellChildren"][3]["pinnedCellId"] = "VC1-PIN"
    message = _error(config)
    assert "duplicate pinnedCellId 'VC1-PIN'" in message and "rack-b/dgx-b0" in message


def test_pinned_id_used_by_two_vcs_is_named() -> None:
    config = raw()
    config["virtualClusters"]["VC2"]["pinnedCells"] = [{"pinnedCellId": "VC1-PIN"}]
    assert "'VC1-PIN' is already used by virtual cluster VC1" in _error(config)


def test_unknown_pinned_id_is_named() -> None:
    config = raw()
    config["virtualClusters"]["VC3"]["pinnedCells"] = [{"pinnedCellId": "NOPE"}]
    assert "virtual cluster VC3: unknown pinnedCellId 'NOPE'" in _error(config)


def test_chain_without_a_node_level_is_named() -> None:
    config = raw()
    config["physicalCluster"]["cellTypes"]["K80-NODE"]["isNodeLevel"] = False
    message = _error(config)
    assert "chain 3-K80-NODE: 0 node-level types" in message


def test_chain_with_two_node_levels_is_named() -> None:
    config = raw()
    config["physicalCluster"]["cellTypes"]["V100-SOCKET"]["isNodeLevel"] = True
    assert "chain V100-RACK: 2 node-level types" in _error(config)


def test_node_without_an_address_is_named() -> None:
    config = raw()
    del config["physicalCluster"]["physicalCells"][0]["cellChildren"][0]["cellAddress"]
    assert "needs a cellAddress (its node name)" in _error(config)


def test_too_many_children_are_named() -> None:
    config = raw()
    config["physicalCluster"]["physicalCells"][2]["cellChildren"].append({"cellAddress": "x"})
    assert "must list at most 3 cells" in _error(config)


def test_vc_assignment_that_does_not_fit_names_chain_and_level() -> None:
    config = raw()
    config["virtualClusters"]["VC3"]["virtualCells"][0]["cellNumber"] = 3
    message = _error(config)
    assert "do not fit in chain V100-RACK at level 3 (V100-SOCKET)" in message
    assert "claim 3 cells, 2 are obtainable" in message
    config = raw()
    config["virtualClusters"]["VC2"]["virtualCells"][1]["cellNumber"] = 3
    assert "chain 3-K80-NODE at level 3 (K80-NODE): they claim 4 cells, 3" in _error(config)
    config = raw()
    config["virtualClusters"]["VC3"]["virtualCells"].append(
        {"cellType": "V100-RACK", "cellNumber": 1}
    )
    # rack-b is split by the pinned node, so only rack-a is a whole rack
    assert "chain V100-RACK at level 5 (V100-RACK): they claim 2 cells" in _error(config)


def test_vc_cell_type_must_be_a_path_from_a_chain() -> None:
    config = raw()
    config["virtualClusters"]["VC3"]["virtualCells"][0]["cellType"] = "V100-NODE"
    assert "must begin with a chain" in _error(config)
    config["virtualClusters"]["VC3"]["virtualCells"][0]["cellType"] = "V100-RACK.V100-SOCKET"
    assert "V100-SOCKET is not the child type of V100-RACK" in _error(config)


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda c: c.pop("physicalCluster"), "physicalCluster must be a mapping"),
        (
            lambda c: c["physicalCluster"]["cellTypes"]["K80-NODE"].update(childCellNumber=0),
            "childCellNumber must be an integer >= 1",
        ),
        (
            lambda c: c["physicalCluster"]["cellTypes"]["K80-NODE"].update(isNodeLevel="yes"),
            "isNodeLevel must be true or false",
        ),
        (
            lambda c: c["virtualClusters"]["VC1"]["virtualCells"][0].update(cellNumber=-1),
            "cellNumber must be an integer >= 0",
        ),
        (lambda c: c["physicalCluster"].update(physicalCells=[]), "non-empty list"),
    ],
)
def test_malformed_values_are_named(mutate: Any, fragment: str) -> None:
    config = raw()
    mutate(config)
    assert fragment in _error(config)


def test_yaml_syntax_error_is_a_config_error() -> None:
    assert "not valid YAML" in _error("physicalCluster: [unclosed")


def test_synthetic_config_shapes_and_fits() -> None:
    config = synthetic_config(nodes=64, gpus_per_node=8, nodes_per_rack=8, vcs=4, pinned=2)
    topo = Topology(config)
    (chain,) = topo.chains
    assert [i.cell_type for i in chain.levels] == [
        "V100",
        "V100-2GPU",
        "V100-4GPU",
        "V100-NODE",
        "V100-RACK",
    ]
    assert len(topo.nodes) == 64 and len(chain.tops) == 8
    assert sorted(topo.pinned_cells) == ["vc00-PIN", "vc01-PIN"]
    # every VC is promised its equal share of nodes (pinned node included)
    for vc in config.virtual_clusters:
        leaves = sum(
            n.number * chain.levels[len(chain.levels) - len(n.path)].leaf_number
            for n in vc.virtual_cells
        )
        assert leaves + 8 * len(vc.pinned_cells) == 16 * 8
    assert synthetic_config(nodes=6, gpus_per_node=3, nodes_per_rack=3, vcs=2).cell_types[0].name
    with pytest.raises(GpuConfigError):
        synthetic_config(nodes=10, nodes_per_rack=8)
