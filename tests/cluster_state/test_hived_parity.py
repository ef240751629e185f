"""Scenarios from HiveD's documented behaviour (issue 24): reservations that stay until the
scheduler confirms them, partly filled cells, node health from reports, and the smaller
decisions (pinned cells too small, mixed gangs, overcommit errors); and HiveD's own unit
scenarios replayed (issue 36, ``hived_scenarios``)."""

from __future__ import annotations

from typing import Any

import hived_scenarios
import pytest
from cs_helpers import Driver, allocation_state, check_invariants, devices

from cluster_state import (
    ClusterStore,
    GpuConfigError,
    bind,
    parse_config,
    release,
    set_node_health,
    submit,
)
from cluster_state.ops import get_group

# HiveD's basic example (example/config/basic): one rack of three 4-GPU K80 nodes.
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
    - cellAddress: 10.151.41.22
virtualClusters:
  VC1: {virtualCells: [{cellType: 3-K80-NODE.K80-NODE, cellNumber: 2}]}
  VC2: {virtualCells: [{cellType: 3-K80-NODE.K80-NODE, cellNumber: 1}]}
"""


def driver(text: str = BASIC, options: str = "") -> Driver:
    return Driver(ClusterStore(parse_config(text + options)))


def group(d: Driver, name: str) -> dict[str, Any] | None:
    info: dict[str, Any] | None = d.query(get_group(name))[2]
    return info


def kinds(d: Driver) -> list[tuple[str, str]]:
    return [(e.kind, e.subject) for e in d.store.events_since(d.position - 1)]


# --------------------------------------------------------------------------- 2. reservations


def test_preemptor_stays_reserved_until_confirmed_by_a_second_submit() -> None:
    d = driver()
    for i in range(2):
        assert d.apply(submit(f"low{i}", "VC1", 1, [(1, 4)]))[0] == "placed"
    assert d.apply(submit("high", "VC1", 5, [(1, 4)])) == ["preempting", "high", ["low0"]]
    # the victim leaves: HiveD turns Reserving into Reserved, and nothing is placed yet
    assert d.apply(release("low0")) == ["released", "low0", []]
    assert ("reserved", "high") in kinds(d)
    info = group(d, "high")
    assert info is not None and info["state"] == "reserved" and info["victims"] == []
    # a lower priority takes neither the reserved cells nor low1's (equal priority)
    assert d.apply(submit("lower", "VC1", 1, [(1, 4)]))[0] == "waiting"
    assert d.apply(submit("opp", "VC2", -1, [(1, 4)]))[0] == "placed"  # the other free node
    check_invariants(d.store.allocator)
    # the scheduler schedules the preemptor again: placed where it reserved
    placed = d.apply(submit("high", "VC1", 5, [(1, 4)]))
    assert placed[0] == "placed" and placed[4] == d.position
    assert group(d, "high")["state"] == "placed"  # type: ignore[index]
    assert ("placed", "high") in kinds(d)
    check_invariants(d.store.allocator)


def test_a_later_higher_priority_group_cancels_the_reservation() -> None:
    d = driver()
    d.apply(submit("low0", "VC1", 1, [(1, 4)]))
    d.apply(submit("low1", "VC1", 1, [(1, 4)]))
    d.apply(submit("mid", "VC1", 5, [(1, 4)]))
    d.apply(release("low0"))
    assert group(d, "mid")["state"] == "reserved"  # type: ignore[index]
    # a higher group overlapping the reservation cancels it instead of preempting a placed
    # group (the old behaviour placed "mid" at once, and this would have preempted it)
    top = d.apply(submit("top", "VC1", 9, [(2, 4)]))
    assert top == ["preempting", "top", ["low1"]]
    assert ("cancelled", "mid") in kinds(d) and group(d, "mid") is None
    check_invariants(d.store.allocator)


def test_a_bind_confirms_exactly_the_reserved_placement() -> None:
    d = driver()
    d.apply(submit("low0", "VC1", 1, [(1, 4)]))
    d.apply(submit("low1", "VC1", 1, [(1, 4)]))
    d.apply(submit("high", "VC1", 5, [(1, 2)]))
    pods = group(d, "high")["pods"]  # type: ignore[index]
    node, reserved = pods[0][1], pods[0][2]
    # while a victim still runs, a bind cannot confirm
    still = d.apply(bind("high", "VC1", 5, [(1, 2)], [(node, reserved)], d.position))
    assert still[0] == "conflict" and "still preempting" in still[2]
    (victim,) = group(d, "high")["victims"]  # type: ignore[index]
    d.apply(release(victim))
    assert group(d, "high")["state"] == "reserved"  # type: ignore[index]
    other = [x for x in range(4) if x not in reserved][:2]
    wrong = d.apply(bind("high", "VC1", 5, [(1, 2)], [(node, other)], d.position))
    assert wrong[0] == "conflict" and "not the one reserved" in wrong[2]
    before = allocation_state(d.store)
    ok = d.apply(bind("high", "VC1", 5, [(1, 2)], [(node, reserved)], 0))
    assert ok[0] == "placed" and devices(ok) == [(node, reserved)]
    assert allocation_state(d.store) != before
    check_invariants(d.store.allocator)


def test_immediate_reservations_keep_the_old_behaviour() -> None:
    d = driver(options="storeOptions: {reservations: immediate}\n")
    d.apply(submit("low0", "VC1", 1, [(1, 4)]))
    d.apply(submit("low1", "VC1", 1, [(1, 4)]))
    d.apply(submit("high", "VC1", 5, [(1, 4)]))
    assert d.apply(release("low0")) == ["released", "low0", ["high"]]
    assert group(d, "high")["state"] == "placed"  # type: ignore[index]
    check_invariants(d.store.allocator)


def test_store_options_are_validated() -> None:
    with pytest.raises(GpuConfigError, match=r"storeOptions\.reservations"):
        parse_config(BASIC + "storeOptions: {reservations: sometimes}\n")
    with pytest.raises(GpuConfigError, match="unknown option"):
        parse_config(BASIC + "storeOptions: {reservation: immediate}\n")
    with pytest.raises(GpuConfigError, match="initialNodeHealth"):
        parse_config(BASIC + "storeOptions: {initialNodeHealth: maybe}\n")
    # the options are part of the configuration's identity (every replica runs the same)
    plain = ClusterStore(parse_config(BASIC)).topology.digest
    assert ClusterStore(parse_config(BASIC + "storeOptions: {}\n")).topology.digest == plain
    other = parse_config(BASIC + "storeOptions: {reservations: immediate}\n")
    assert ClusterStore(other).topology.digest != plain


# --------------------------------------------------------------------------- 3. partly filled

PARTIAL = """
physicalCluster:
  cellTypes:
    K80-2GPU:   {childCellType: K80, childCellNumber: 2}
    K80-NODE:   {childCellType: K80-2GPU, childCellNumber: 2, isNodeLevel: true}
    3-K80-NODE: {childCellType: K80-NODE, childCellNumber: 3}
  physicalCells:
  - cellType: 3-K80-NODE
    cellChildren:                       # a rack with two of its three nodes
    - cellAddress: n0
    - cellAddress: n1
  - cellType: 3-K80-NODE
    cellChildren:
    - cellAddress: m0
    - cellAddress: m1
      cellChildren:                     # a node with one of its two 2-GPU switches
      - cellChildren: [{cellAddress: 0}, {cellAddress: 1}]
    - cellAddress: m2
virtualClusters:
  VC1: {virtualCells: [{cellType: 3-K80-NODE.K80-NODE, cellNumber: 3}]}
  VC2: {virtualCells: [{cellType: 3-K80-NODE.K80-NODE.K80-2GPU, cellNumber: 1}]}
"""


def test_partly_filled_cells_load_and_only_complete_pieces_are_promised() -> None:
    config = parse_config(PARTIAL)
    d = Driver(ClusterStore(config))
    topo = d.store.topology
    assert topo.leaf_number(topo.chains[0].tops[0]) == 8  # 2 nodes of 4
    assert [topo.complete[t] for t in topo.chains[0].tops] == [False, False]
    alloc = d.store.allocator
    # nothing partly filled is free-listed: the complete nodes and m1's complete switch are
    assert [topo.address[c] for c in alloc.buddy.free[0][2]] == ["0/n0", "0/n1", "1/m0", "1/m2"]
    assert [topo.address[c] for c in alloc.buddy.free[0][1]] == ["1/m1/0"]
    check_invariants(alloc)
    # VC1's three nodes are whole nodes; a whole-node group never lands on the 2-GPU m1
    for i in range(3):
        placed = d.apply(submit(f"g{i}", "VC1", 1, [(1, 4)]))
        assert devices(placed)[0][0] != "m1", placed
        check_invariants(d.store.allocator)
    # VC2's 2-GPU cell may come from the partial node; opportunistic work may use m1 too
    assert d.apply(submit("small", "VC2", 1, [(1, 2)]))[0] == "placed"
    assert d.apply(submit("opp", "VC2", -1, [(1, 2)]))[0] in {"placed", "waiting"}
    check_invariants(d.store.allocator)
    for name in ("g0", "g1", "g2", "small"):
        d.apply(release(name))
    check_invariants(d.store.allocator)
    snap = d.store.snapshot()
    twin = ClusterStore(config)
    twin.restore(snap)
    assert twin.snapshot() == snap


def test_partly_filled_cells_cannot_cover_a_whole_cell_claim() -> None:
    # the same cluster cannot promise a whole 3-node rack: neither rack is complete
    text = PARTIAL.replace("cellType: 3-K80-NODE.K80-NODE, cellNumber: 3",
                           "cellType: 3-K80-NODE, cellNumber: 1")
    with pytest.raises(GpuConfigError, match="do not fit in chain 3-K80-NODE at level 4") as err:
        parse_config(text)
    assert "VC1 1 x 3-K80-NODE" in str(err.value)  # the overcommitting VC is named


# --------------------------------------------------------------------------- 4. node health


def test_nodes_start_bad_until_reported_healthy() -> None:
    d = driver(options="storeOptions: {initialNodeHealth: bad}\n")
    alloc = d.store.allocator
    assert alloc.bad_nodes == {"10.151.41.20", "10.151.41.21", "10.151.41.22"}
    check_invariants(alloc)
    assert d.apply(submit("g", "VC1", 1, [(1, 4)]))[0] == "waiting"
    assert d.apply(submit("o", "VC1", -1, [(1, 1)]))[0] == "waiting"
    result = d.apply(set_node_health("10.151.41.21", True))
    assert result[:4] == ["node_health", "10.151.41.21", True, True]
    placed = d.apply(submit("g", "VC1", 1, [(1, 4)]))
    assert devices(placed) == [("10.151.41.21", [0, 1, 2, 3])]
    check_invariants(d.store.allocator)
    # a restored store keeps the reported health (it does not start bad again)
    twin = ClusterStore(d.store.topology)
    twin.restore(d.store.snapshot())
    assert twin.allocator.bad_nodes == {"10.151.41.20", "10.151.41.22"}


# --------------------------------------------------------------------------- 6. smaller decisions


def test_a_gang_of_mixed_member_sizes_is_placed_at_once() -> None:
    # HiveD's topology-aware scheduler fills nodes smallest pod first and may leave such a
    # gang waiting for a whole node set; best-fit decreasing places it (2+1+1 on one node,
    # 4 on another) without preempting anybody.
    d = driver()
    placed = d.apply(submit("mixed", "VC1", 1, [(1, 4), (1, 2), (2, 1)]))
    pods = devices(placed)
    assert [len(devs) for _, devs in pods] == [4, 2, 1, 1]
    assert len({node for node, _ in pods}) == 2
    check_invariants(d.store.allocator)


def test_overcommit_error_names_every_competing_vc() -> None:
    text = BASIC.replace("VC2: {virtualCells: [{cellType: 3-K80-NODE.K80-NODE, cellNumber: 1}]}",
                         "VC2: {virtualCells: [{cellType: 3-K80-NODE.K80-NODE, cellNumber: 2}]}")
    with pytest.raises(GpuConfigError) as err:
        parse_config(text)
    assert "VC1 2 x K80-NODE" in str(err.value) and "VC2 2 x K80-NODE" in str(err.value)


# --------------------------------------------------------------------------- HiveD's own test
# HiveD's TestHivedAlgorithm replayed (``hived_scenarios``; the store's invariants are checked
# after every operation). Every check matches but these, which are pinned so that a change of
# behaviour shows here:
#
# * equivalent: a leaf type's chains are tried in name order, where HiveD's test sorts them the
#   other way round (HiveD itself takes a Go map's order), so pods 1-4 land in the 3-node
#   DGX-2 rack rather than on 0.0.1.0 / 0.0.5.0, group9 takes 1.0.0.2 and 1.0.0.1 and the two
#   CT1 pods swap nodes: the same shapes (leaf count and lowest common ancestor type);
# * differ: a group lazily preempted before a reconfiguration stays downgraded; HiveD's
#   recovery rebuilds it from its pods' bind info, which does not record the lazy preemption,
#   and makes it guaranteed again.
KNOWN_VERDICTS = {
    **dict.fromkeys(("N1", "N2", "N3", "N4", "N8", "N9", "N18", "N19"), hived_scenarios.EQUIVALENT),
    "C5": hived_scenarios.DIFFER,
}


def test_hived_unit_scenarios_replayed() -> None:
    checks = hived_scenarios.run_all()
    verdicts = {check.id: check.verdict for check in checks}
    assert len(verdicts) == len(checks), "scenario ids are unique"
    unexpected = [check for check in checks
                  if check.verdict != KNOWN_VERDICTS.get(check.id, hived_scenarios.MATCH)]
    assert not unexpected, "\n".join(f"{c.id} {c.verdict}: {c.what} — {c.detail}"
                                     for c in unexpected)
    assert hived_scenarios.tally(checks) == {"match": 59, "equivalent": 8, "differ": 1,
                                             "unsupported": 0}


@pytest.mark.parametrize("family", ["suggested_nodes", "safe_relaxed_buddy_alloc"])
def test_hived_suggested_node_scenarios_need_the_suggestion(family: str,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """The suggested-node scenarios depend on the suggestion: replayed with the nodes
    dropped (as a store without the parameter would run them), they do not match."""
    monkeypatch.setattr(hived_scenarios, "SUGGESTED", False)
    checks = getattr(hived_scenarios, family)()
    assert any(check.verdict == hived_scenarios.UNSUPPORTED for check in checks)
