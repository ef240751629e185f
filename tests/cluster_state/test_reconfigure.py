"""Work-preserving reconfiguration through the log (issue 24, point 1), scenario by scenario
from HiveD's documented behaviour (``createAllocatedAffinityGroup``/``findAllocatedLeafCell``):
running groups keep their GPUs, leaves that left are dropped and reported, a leaf that moved
chain is found in its new chain, a guaranteed group that no longer fits its VC is downgraded,
and the safety invariant holds afterwards (``check_invariants``)."""

from __future__ import annotations

from typing import Any

from cs_helpers import Driver, allocation_state, check_invariants, devices, multi_chain_config
from reconfig_helpers import variant

from cluster_state import ClusterStore, Topology, bind, parse_config, release, submit
from cluster_state.ledger import GpuLedger
from cluster_state.ops import get_group, inspect, plan_reconfigure, reconfigure


def fresh() -> Driver:
    return Driver(ClusterStore(multi_chain_config()))


def group(d: Driver, name: str) -> dict[str, Any] | None:
    info: dict[str, Any] | None = d.query(get_group(name))[2]
    return info


def test_same_configuration_changes_nothing() -> None:
    d = fresh()
    d.apply(submit("g", "VC1", 5, [(1, 8)], leaf_type="V100"))
    before = allocation_state(d.store)
    result = d.apply(reconfigure(variant("base")))
    assert result[0] == "reconfigured" and result[2] is False
    assert result[1] == d.store.topology.digest.hex()
    assert allocation_state(d.store) == before


def test_invalid_configuration_is_refused_and_changes_nothing() -> None:
    d = fresh()
    d.apply(submit("g", "VC1", 5, [(1, 8)], leaf_type="V100"))
    snap = d.store.snapshot()
    bad = variant("base").replace("cellNumber: 2", "cellNumber: 20", 1)
    result = d.apply(reconfigure(bad))
    assert result[0] == "error" and "invalid configuration" in result[1]
    assert "do not fit" in result[1]
    assert d.apply(reconfigure("{{{"))[0] == "error"
    assert d.store.snapshot() == snap


def test_a_removed_node_trims_its_groups_and_an_emptied_group_is_dropped() -> None:
    d = fresh()
    # dgx-a3 is rack-a's last node: fill rack-a so groups land there
    opp = d.apply(submit("opp", "VC3", -1, [(4, 8)], leaf_type="V100"))
    assert sorted(node for node, _ in devices(opp)) == ["dgx-a0", "dgx-a1", "dgx-a2", "dgx-a3"]
    ledger = GpuLedger()
    for event in d.store.events_since(-1):
        ledger.apply(event)
    result = d.apply(reconfigure(variant("without_a3")))
    assert result[0] == "reconfigured" and result[2] is True
    report = result[3]
    assert report["nodes_removed"] == ["dgx-a3"]
    entry = report["groups"]["opp"]
    assert entry["outcome"] == "trimmed"
    assert len(entry["dropped"]) == 8
    assert all(a.startswith("rack-a/dgx-a3/") for a in entry["dropped"])
    info = group(d, "opp")
    assert info is not None and [pod[1] for pod in info["pods"]] == [
        "dgx-a0", "dgx-a1", "dgx-a2", ""]  # the pod on the removed node holds nothing
    check_invariants(d.store.allocator)
    for event in d.store.events_since(d.position - 1):
        ledger.apply(event)
    assert ledger.violations == [] and ledger.in_use() == 24
    # a group entirely on a removed node is released and reported
    d2 = fresh()
    d2.apply(submit("x", "VC3", -1, [(3, 8)], leaf_type="V100"))
    solo = d2.apply(submit("solo", "VC3", -1, [(1, 8)], leaf_type="V100"))
    assert devices(solo)[0][0] == "dgx-a3"
    report = d2.apply(reconfigure(variant("without_a3")))[3]
    assert report["groups"]["solo"]["outcome"] == "dropped"
    assert group(d2, "solo") is None
    assert ("released", "solo") in [(e.kind, e.subject) for e in d2.store.events_since(0)]
    check_invariants(d2.store.allocator)


def test_a_node_that_moved_chain_is_found_in_its_new_chain() -> None:
    d = fresh()
    for name, vc in (("o", "VC1"), ("k0", "VC2"), ("k1", "VC2")):
        d.apply(submit(name, vc, 3, [(1, 4)], leaf_type="K80"))
    assert group(d, "k1")["pods"][0][1] == "k80-2"  # type: ignore[index]
    result = d.apply(reconfigure(variant("k80_2_moves_chain")))
    # k1's node is now the K80-SOLO chain, where VC2 has a cell: same GPUs, still guaranteed
    assert result[3]["groups"] == {
        "k0": {"outcome": "kept"},
        "k1": {"outcome": "kept", "moved": ["3-K80-NODE", "K80-SOLO"]},
        "o": {"outcome": "kept"},
    }
    info = group(d, "k1")
    assert info is not None and info["chain"] == "K80-SOLO" and not info["downgraded"]
    assert info["pods"] == [[4, "k80-2", [0, 1, 2, 3]]]
    check_invariants(d.store.allocator)


def test_groups_beyond_a_shrunk_quota_are_downgraded_oldest_kept() -> None:
    d = fresh()
    for name, vc in (("k0", "VC2"), ("k1", "VC2"), ("o", "VC1")):
        d.apply(submit(name, vc, 3, [(1, 4)], leaf_type="K80"))
    result = d.apply(reconfigure(variant("k80_2_moves_chain")))
    # VC2 now has one K80 node in 3-K80-NODE (k0, older, keeps it); VC1 none in K80-SOLO
    assert result[3]["groups"] == {
        "k0": {"outcome": "kept"},
        "k1": {"outcome": "downgraded",
               "reason": "2/k80-1/0/0 is outside what VC2 can hold now"},
        "o": {"outcome": "downgraded", "moved": ["3-K80-NODE", "K80-SOLO"],
              "reason": "VC1 has no cells in chain K80-SOLO"},
    }
    check_invariants(d.store.allocator)


def test_a_guaranteed_group_that_no_longer_fits_its_vc_is_downgraded() -> None:
    d = fresh()
    a = d.apply(submit("a", "VC1", 5, [(1, 8)], leaf_type="V100"))
    b = d.apply(submit("b", "VC1", 7, [(1, 8)], leaf_type="V100"))
    s = d.apply(submit("s", "VC3", 5, [(1, 4)], leaf_type="V100"))
    result = d.apply(reconfigure(variant("vc3_gone_vc1_shrunk")))
    groups = result[3]["groups"]
    # VC1 keeps one node: the higher priority keeps its guarantee, the other is downgraded
    assert groups["b"]["outcome"] == "kept"
    assert groups["a"]["outcome"] == "downgraded" and "outside" in groups["a"]["reason"]
    assert groups["s"]["outcome"] == "downgraded" and "VC3 is gone" in groups["s"]["reason"]
    assert result[3]["vcs_removed"] == ["VC3"]
    for name, before in (("a", a), ("b", b), ("s", s)):  # everybody keeps their GPUs
        info = group(d, name)
        assert info is not None and [(p[1], p[2]) for p in info["pods"]] == devices(before)
    info = group(d, "a")
    assert info is not None and info["downgraded"] is True
    assert info["lazy_preemption"] == {"preemptor": "", "position": d.position}
    check_invariants(d.store.allocator)
    assert d.store.allocator.groups["a"].priority == -1
    # downgraded, it is opportunistic now: another VC's guaranteed group may preempt it
    vc2 = d.apply(submit("r", "VC2", 0, [(4, 8)], leaf_type="V100"))
    assert vc2[0] in {"placed", "preempting"}
    check_invariants(d.store.allocator)


def test_preemptions_in_flight_are_cancelled() -> None:
    d = fresh()
    for i in range(2):
        d.apply(submit(f"low{i}", "VC1", 1, [(1, 8)], leaf_type="V100"))
    assert d.apply(submit("high", "VC1", 9, [(1, 8)], leaf_type="V100"))[0] == "preempting"
    report = d.apply(reconfigure(variant("rack_c_added")))[3]
    assert report["groups"]["high"]["outcome"] == "cancelled"
    assert group(d, "high") is None
    assert group(d, "low0")["preempted_by"] == []  # type: ignore[index]
    # new nodes start bad under initialNodeHealth: bad; the known ones keep their health
    assert d.store.allocator.bad_nodes == {f"dgx-c{i}" for i in range(4)}
    check_invariants(d.store.allocator)


def test_the_pinned_cell_moving_downgrades_the_groups_on_the_old_one() -> None:
    d = fresh()
    pin = d.apply(submit("pin", "VC1", 5, [(1, 8)], pinned="VC1-PIN"))
    assert devices(pin)[0][0] == "dgx-b0"
    result = d.apply(reconfigure(variant("pin_moves")))
    assert result[3]["groups"]["pin"]["outcome"] == "downgraded"
    check_invariants(d.store.allocator)
    pin2 = d.apply(submit("pin2", "VC1", 5, [(1, 8)], pinned="VC1-PIN"))
    assert devices(pin2)[0][0] == "dgx-b3"


def test_dry_run_reports_without_changing_anything() -> None:
    d = fresh()
    d.apply(submit("opp", "VC3", -1, [(4, 8)], leaf_type="V100"))
    d.apply(submit("a", "VC1", 5, [(1, 8)], leaf_type="V100"))
    snap = d.store.snapshot()
    plan = d.query(plan_reconfigure(variant("without_a3")))
    assert plan[0] == "plan" and plan[2]["changed"] is True
    assert d.store.snapshot() == snap
    done = d.apply(reconfigure(variant("without_a3")))
    assert {k: v for k, v in plan[2].items() if k != "changed"} == done[3]
    assert d.query(plan_reconfigure(variant("without_a3")))[2] == {"changed": False}


def test_replicas_agree_and_a_restart_with_the_new_file_catches_up_first() -> None:
    old, new_text = multi_chain_config(), variant("k80_2_moves_chain")
    one, two = Driver(ClusterStore(old)), Driver(ClusterStore(old))
    ops = [
        submit("a", "VC2", 3, [(2, 4)], leaf_type="K80"),
        submit("b", "VC1", 5, [(2, 8)], leaf_type="V100"),
        reconfigure(new_text),
        submit("c", "VC2", 3, [(1, 4)], leaf_type="K80"),
    ]
    snapshot_before = b""
    for op in ops:
        if op == ops[2]:
            snapshot_before = one.store.snapshot()
        assert one.apply(op) == two.apply(op)
    assert one.store.snapshot() == two.store.snapshot()
    # A replica restarted with the edited file: it adopts the snapshot's (old) configuration,
    # replays the rest of the log through the reconfiguration, and ends identical.
    restarted = ClusterStore(parse_config(new_text))
    restarted.restore(snapshot_before)
    assert restarted.topology.digest == Topology(old).digest
    assert restarted.needs_reconfiguration(parse_config(new_text))
    replay = Driver(restarted)
    replay.position, replay.seq = 2, 2
    for op in ops[2:]:
        replay.apply(op)
    assert restarted.snapshot() == one.store.snapshot()
    assert not restarted.needs_reconfiguration(parse_config(new_text))
    # and a snapshot taken after the change restores anywhere
    elsewhere = ClusterStore(old)
    elsewhere.restore(one.store.snapshot())
    assert elsewhere.snapshot() == one.store.snapshot()
    check_invariants(elsewhere.allocator)


def test_a_released_group_after_reconfiguration_frees_its_cells() -> None:
    d = fresh()
    d.apply(submit("g", "VC2", 3, [(2, 4)], leaf_type="K80"))
    d.apply(reconfigure(variant("k80_2_moves_chain")))
    d.apply(release("g"))
    check_invariants(d.store.allocator)
    assert all(n == 0 for n in d.store.allocator.buddy.item_used)
    tree = d.query(inspect("vc", "VC2"))[2]
    assert not any(cell["bound"] for cell in tree["cells"])


def test_an_untouched_cell_keeps_its_binding_and_its_leaves_their_revisions() -> None:
    d = fresh()
    d.apply(submit("a", "VC1", 5, [(1, 4)], leaf_type="V100"))
    d.apply(submit("b", "VC2", 5, [(2, 8)], leaf_type="V100"))
    d.apply(submit("k", "VC2", 5, [(1, 2)], leaf_type="K80"))
    alloc, topo = d.store.allocator, d.store.topology

    def bindings(alloc: Any) -> set[tuple[str, str]]:
        return {
            (it.vc, alloc.topo.address[alloc.buddy.item_cell[it.id]])
            for it in alloc.topo.items
            if alloc.buddy.item_cell[it.id] >= 0 and not alloc.buddy.doomed[it.id]
        }  # (rack-c starts bad: VC3's new cells there are doomed, a binding of its own)

    before = bindings(alloc)
    revision = d.store.revision
    node, free = next(
        (name, free)
        for name, cells in sorted(topo.nodes.items())
        if topo.chains[topo.chain_of[cells[0]]].leaf_type == "V100"
        and len(free := [x for x in topo.leaves[cells[0]] if alloc.cells.owner[x] is None]) >= 2
    )
    result = d.apply(reconfigure(variant("rack_c_added")))
    assert all(e == {"outcome": "kept"} for e in result[3]["groups"].values())
    assert bindings(d.store.allocator) == before  # the same cells, bound to the same VCs
    check_invariants(d.store.allocator)
    # the reconfiguration touched none of these leaves: a bind that read them before holds
    devs = [topo.device[leaf] for leaf in free[:2]]
    placed = d.apply(bind("o", "VC3", -1, [(1, 2)], [(node, devs)], revision, leaf_type="V100"))
    assert placed[0] == "placed", placed


def test_a_renamed_leaf_type_keeps_the_groups() -> None:
    d = fresh()
    d.apply(submit("k", "VC2", 3, [(1, 4)], leaf_type="K80"))
    d.apply(submit("v", "VC1", 3, [(1, 8)], leaf_type="V100"))
    renamed = variant("base").replace("childCellType: K80\n", "childCellType: K80-12G\n")
    assert "K80-12G" in renamed
    result = d.apply(reconfigure(renamed))
    assert result[3]["groups"] == {"k": {"outcome": "kept"}, "v": {"outcome": "kept"}}
    check_invariants(d.store.allocator)
    assert d.store.topology.chains_for_leaf.keys() == {"K80-12G", "V100"}


# --------------------------------------------------------------------------- HiveD's recovery
# (issue 36 point 6) A leaf is covered again only by a VC cell of the type that covered it
# before (HiveD's preassignedCellTypes), found by name in the leaf's chain now.

SOCKETS_AND_NODES = """
physicalCluster:
  cellTypes:
    SWITCH: {childCellType: P100, childCellNumber: 2}
    SOCKET: {childCellType: SWITCH, childCellNumber: 2}
    NODE: {childCellType: SOCKET, childCellNumber: 2, isNodeLevel: true}
    RACK: {childCellType: NODE, childCellNumber: 3}
  physicalCells:
  - cellType: RACK
    cellChildren: [{cellAddress: n0}, {cellAddress: n1}, {cellAddress: n2}]
virtualClusters:
  VC: {virtualCells: [{cellType: RACK.NODE, cellNumber: NODES},
                      {cellType: RACK.NODE.SOCKET, cellNumber: 2}]}
"""


def test_a_shrunk_quota_is_not_made_up_for_with_cells_of_another_type() -> None:
    """HiveD's testReconfiguration, group9: a 7 + 5 gang on two node cells of a VC left with
    one node cell and two socket cells is lazily preempted; covering the 5-GPU pod with the
    sockets (4 + 1) is a placement HiveD never makes."""
    d = Driver(ClusterStore(parse_config(SOCKETS_AND_NODES.replace("NODES", "2"))))
    placed = d.apply(submit("g", "VC", 1, [(1, 7), (1, 5)]))
    assert len({node for node, _ in devices(placed)}) == 2
    result = d.apply(reconfigure(SOCKETS_AND_NODES.replace("NODES", "1")))
    outcome = result[3]["groups"]["g"]
    assert outcome["outcome"] == "downgraded", outcome
    info = group(d, "g")
    assert info is not None and info["downgraded"] and info["lazy_preemption"]["preemptor"] == ""
    check_invariants(d.store.allocator)
    # a gang on socket cells keeps them whatever happens to the node cells
    d = Driver(ClusterStore(parse_config(SOCKETS_AND_NODES.replace("NODES", "2"))))
    for name in ("a", "b"):
        d.apply(submit(name, "VC", 1, [(1, 8)]))
    small = d.apply(submit("s", "VC", 1, [(1, 4)]))
    assert small[0] == "placed"
    d.apply(reconfigure(SOCKETS_AND_NODES.replace("NODES", "1")))
    kept = {name: (info := group(d, name)) is not None and not info["downgraded"]
            for name in ("a", "b", "s")}
    assert kept == {"a": True, "b": False, "s": True}, kept  # b: the newer node-cell group
    check_invariants(d.store.allocator)


SHORTENED = """
physicalCluster:
  cellTypes:
    PAIR: {childCellType: GPU, childCellNumber: 2}
    NODE: {childCellType: PAIR, childCellNumber: 2, isNodeLevel: true}
    RACK: {childCellType: NODE, childCellNumber: 2}
  physicalCells:
  - cellType: RACK
    cellChildren: [{cellAddress: n0}, {cellAddress: n1}]
virtualClusters:
  VC: {virtualCells: [{cellType: RACK.NODE, cellNumber: 1}]}
"""


def test_cell_types_are_found_by_name_in_a_changed_chain() -> None:
    """HiveD's testReconfiguration: a node whose cell type loses its sub-node levels keeps its
    group (the type is found at its new level); a group covered by a type the leaf's chain no
    longer has (group13: its nodes now top-level single nodes) is lazily preempted."""
    d = Driver(ClusterStore(parse_config(SHORTENED)))
    assert d.apply(submit("g", "VC", 1, [(1, 4)]))[0] == "placed"
    flat = SHORTENED.replace("NODE: {childCellType: PAIR, childCellNumber: 2, isNodeLevel: true}",
                        "NODE: {childCellType: GPU, childCellNumber: 4, isNodeLevel: true}")
    result = d.apply(reconfigure(flat))
    assert result[3]["groups"]["g"] == {"outcome": "kept"}, result[3]
    check_invariants(d.store.allocator)
    # a whole rack for the VC; the rack is then split into two single nodes
    rack = SHORTENED.replace("cellType: RACK.NODE, cellNumber: 1", "cellType: RACK, cellNumber: 1")
    d = Driver(ClusterStore(parse_config(rack)))
    assert d.apply(submit("r", "VC", 1, [(2, 4)]))[0] == "placed"
    old_rack = "  - cellType: RACK\n    cellChildren: [{cellAddress: n0}, {cellAddress: n1}]"
    new_cells = ("  - {cellType: NODE, cellAddress: n0}\n  - {cellType: NODE, cellAddress: n1}\n"
                 "  - cellType: RACK\n    cellChildren: [{cellAddress: m0}, {cellAddress: m1}]")
    split = rack.replace(old_rack, new_cells).replace(
        "cellType: RACK, cellNumber: 1", "cellType: RACK, cellNumber: 1}, "
        "{cellType: NODE, cellNumber: 2")
    result = d.apply(reconfigure(split))
    outcome = result[3]["groups"]["r"]
    assert outcome["outcome"] == "downgraded" and "RACK cell" in outcome["reason"], outcome
    check_invariants(d.store.allocator)
