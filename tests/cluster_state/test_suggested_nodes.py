"""Suggested nodes in ``submit`` / ``plan_submit`` (issue 36 point 5): the wire form and its
validation, placements inside the suggested nodes (other chains and leaf types, other VC
cells, backtracking buddy allocation), a preemption cancelled when its nodes leave the
suggested set (the preempting phase only), placed groups kept, and properties: a placement
always lies inside the suggested nodes, and suggesting every node changes nothing."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from cs_helpers import Driver, allocation_state, check_invariants, devices, multi_chain_config
from hived_scenarios import DESIGN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_state import ClusterStore, parse_config, release, set_node_health
from cluster_state.buddy import CLEAN, HEALTHY, SICK
from cluster_state.errors import RequestError
from cluster_state.ops import (
    MAX_SUGGESTED,
    PlanSubmit,
    Submit,
    decode_op,
    decode_query,
    get_group,
    plan_submit,
    submit,
)
from cluster_state.placement import NodeFilter


def design() -> Driver:
    return Driver(ClusterStore(parse_config(DESIGN)))


def multi() -> Driver:
    return Driver(ClusterStore(multi_chain_config()))


def plan(d: Driver, *args: Any, **kw: Any) -> list[Any]:
    answer = d.query(plan_submit(*args, **kw))
    assert answer[0] == "plan_submit", answer
    result: list[Any] = answer[2]
    return result


def nodes_of(result: list[Any]) -> set[str]:
    return {node for node, _ in devices(result)}


def group(d: Driver, name: str) -> dict[str, Any] | None:
    info: dict[str, Any] | None = d.query(get_group(name))[2]
    return info


# --------------------------------------------------------------------------- the wire


def test_suggested_nodes_travel_sorted_and_an_op_without_them_is_unchanged() -> None:
    plain = submit("g", "VC1", 1, [(1, 2)])
    assert msgpack.unpackb(plain) == ["submit", ["g", "VC1", 1, [[1, 2]], "", "", False]]
    assert decode_op(plain) == Submit(decode_op(plain).spec, None)  # type: ignore[union-attr]
    op = submit("g", "VC1", 1, [(1, 2)], suggested=["n2", "n1", "n2"])
    assert msgpack.unpackb(op)[2] == ["n1", "n2"]
    decoded = decode_op(op)
    assert isinstance(decoded, Submit) and decoded.suggested == frozenset({"n1", "n2"})
    assert decode_op(submit("g", "VC1", 1, [(1, 2)], suggested=[])) == Submit(
        decoded.spec, frozenset())
    query = decode_query(plan_submit("g", "VC1", 1, [(1, 2)], suggested=["n1"]))
    assert isinstance(query, PlanSubmit) and query.suggested == frozenset({"n1"})
    assert decode_query(plan_submit("g", "VC1", 1, [(1, 2)])) == PlanSubmit(query.spec, None)


@pytest.mark.parametrize("bad", ["n1", [1], [""], ["x" * 300], [["n1"]], None])
def test_malformed_suggested_nodes_are_refused(bad: object) -> None:
    spec = ["g", "VC1", 1, [[1, 2]], "", "", False]
    for verb, decode in (("submit", decode_op), ("plan_submit", decode_query)):
        with pytest.raises(RequestError, match="suggested node"):
            decode(msgpack.packb([verb, spec, bad]))


def test_too_many_suggested_nodes_are_refused_and_change_nothing() -> None:
    d = design()
    before = d.store.snapshot()
    raw = msgpack.packb(["submit", ["g", "VC1", 1, [[1, 2]], "", "", False],
                         [f"n{i}" for i in range(MAX_SUGGESTED + 1)]])
    assert d.apply(raw)[0] == "error"
    assert d.store.snapshot() == before


# --------------------------------------------------------------------------- placement


def test_a_new_group_is_placed_inside_the_suggested_nodes_only() -> None:
    d = multi()
    anywhere = plan(d, "g", "VC2", 5, [(2, 8)])
    assert anywhere[0] == "placed"
    others = sorted({"dgx-a0", "dgx-a1", "dgx-a2", "dgx-a3", "dgx-b1", "dgx-b2", "dgx-b3"}
                    - nodes_of(anywhere))[:2]
    placed = d.apply(submit("g", "VC2", 5, [(2, 8)], suggested=others))
    assert placed[0] == "placed" and nodes_of(placed) == set(others), placed
    check_invariants(d.store.allocator)


def test_nothing_inside_the_suggested_nodes_waits_and_says_so() -> None:
    d = multi()
    before = allocation_state(d.store)
    waiting = d.apply(submit("g", "VC1", 5, [(1, 8)], suggested=["k80-0", "no-such-node"]))
    assert waiting[0] == "waiting" and "within the 2 suggested nodes" in waiting[2]
    assert d.apply(submit("o", "VC1", -1, [(1, 8)], suggested=[]))[0] == "waiting"
    assert allocation_state(d.store) == before


def test_the_search_tries_the_other_chains_and_leaf_types() -> None:
    d = multi()
    # VC1 holds V100 nodes and a K80 node; only K80 nodes are suggested: the K80 chain
    placed = d.apply(submit("any", "VC1", 5, [(1, 2)], suggested=["k80-1"]))
    assert placed[0] == "placed" and placed[2] == "3-K80-NODE" and nodes_of(placed) == {"k80-1"}
    # opportunistic groups too (HiveD's pod36: any leaf type, one suggested node)
    d2 = design()
    opp = d2.apply(submit("opp", "VC1", -1, [(1, 1)], suggested=["0.0.1.0"]))
    assert devices(opp) == [("0.0.1.0", [0])]
    check_invariants(d.store.allocator)


def test_a_pinned_gang_inside_the_suggested_nodes() -> None:
    d = design()
    first = d.apply(submit("a", "VC1", 1, [(1, 1)], pinned="VC1-YQW-DGX2", leaf_type="DGX2-V100",
                           suggested=["0.0.3.0"]))
    assert devices(first) == [("0.0.3.0", [0])]
    # packing would put the next one beside it; the suggested node wins (HiveD's pod38)
    second = plan(d, "b", "VC1", 1, [(1, 1)], pinned="VC1-YQW-DGX2", leaf_type="DGX2-V100",
                  suggested=["0.0.3.1"])
    assert devices(second) == [("0.0.3.1", [0])]


def test_buddy_allocation_backtracks_past_cells_without_a_suggested_node() -> None:
    raw = DESIGN.replace("- {cellType: 4-DGX2-V100-NODE.2-DGX2-V100-NODE.DGX2-V100-NODE, "
                         "cellNumber: 2}", "").replace(
        "- {cellType: 4-DGX2-V100-NODE.2-DGX2-V100-NODE, cellNumber: 1}",
        "- {cellType: 4-DGX2-V100-NODE.2-DGX2-V100-NODE, cellNumber: 3}")
    d = Driver(ClusterStore(parse_config(raw)))
    spec = ("g", "VC1", 1, [(1, 16)])
    # the first free 2-node cell of the second rack (0.0.4.0/1) has no suggested node
    placed = d.apply(submit(*spec, leaf_type="DGX2-V100", suggested=["0.0.4.3"]))
    assert devices(placed) == [("0.0.4.3", list(range(16)))]
    check_invariants(d.store.allocator)
    # a cell with one suggested node is bound, the gang of two does not fit, the next is
    # tried (and the first binding is undone)
    d = Driver(ClusterStore(parse_config(raw)))
    pair = d.apply(submit("p", "VC1", 1, [(2, 16)], leaf_type="DGX2-V100",
                          suggested=["0.0.3.3", "0.0.4.2", "0.0.4.3"]))
    assert nodes_of(pair) == {"0.0.4.2", "0.0.4.3"}
    check_invariants(d.store.allocator)


def test_unknown_suggested_node_names_are_ignored() -> None:
    d = multi()
    # (rack-a is VC2's whole rack for safety's sake: VC3's sockets come from rack-b)
    placed = d.apply(submit("g", "VC3", 5, [(1, 4)], suggested=["ghost", "dgx-b2"]))
    assert nodes_of(placed) == {"dgx-b2"}


# --------------------------------------------------------------------------- existing groups


def _preempting(d: Driver) -> list[Any]:
    """VC2's whole rack held at priority 1, then a priority-9 group preempting part of it."""
    for i in range(4):
        assert d.apply(submit(f"low{i}", "VC2", 1, [(1, 8)]))[0] == "placed"
    result = d.apply(submit("high", "VC2", 9, [(1, 8)]))
    assert result[0] == "preempting"
    return result


def test_a_preemption_whose_nodes_leave_the_suggested_set_is_cancelled_and_redone() -> None:
    d = multi()
    _preempting(d)
    info = group(d, "high")
    assert info is not None
    (reserved,) = {node for _, node, _ in info["pods"]}
    rack = sorted(n for n in d.store.topology.nodes if n.startswith("dgx-"))
    elsewhere = [n for n in rack if n != reserved]
    # the filtering phase (a dry run) leaves the preemption alone
    dry = plan(d, "high", "VC2", 9, [(1, 8)], suggested=elsewhere)
    assert dry[0] == "preempting"
    assert group(d, "high") == info
    again = d.apply(submit("high", "VC2", 9, [(1, 8)], suggested=elsewhere))
    events = [(e.kind, e.subject, e.data) for e in d.store.events_since(d.position - 1)]
    assert ("cancelled", "high", (f"its placement left the suggested nodes: {reserved}",)
            ) in events
    assert again[0] == "preempting"
    now = group(d, "high")
    assert now is not None and {node for _, node, _ in now["pods"]} <= set(elsewhere)
    assert now["incarnation"] == d.position  # a new preemption
    check_invariants(d.store.allocator)
    # inside the suggested nodes it stays as it is
    assert d.apply(submit("high", "VC2", 9, [(1, 8)], suggested=rack))[0] == "preempting"
    assert group(d, "high") == now


def test_a_reserved_group_outside_the_suggested_set_is_cancelled_too() -> None:
    d = multi()
    _preempting(d)
    (victim,) = group(d, "high")["victims"]  # type: ignore[index]
    d.apply(release(victim))
    info = group(d, "high")
    assert info is not None and info["state"] == "reserved"
    (reserved,) = {node for _, node, _ in info["pods"]}
    waiting = d.apply(submit("high", "VC2", 9, [(1, 8)], suggested=["k80-0"]))
    assert waiting[0] == "waiting" and group(d, "high") is None
    check_invariants(d.store.allocator)
    assert reserved  # the reservation is gone with the group


def test_a_placed_group_keeps_its_placement_whatever_is_suggested() -> None:
    d = multi()
    placed = d.apply(submit("g", "VC3", 5, [(1, 4)]))
    again = d.apply(submit("g", "VC3", 5, [(1, 4)], suggested=["k80-0"]))
    assert again == placed


def test_a_bad_node_is_never_used_even_when_suggested() -> None:
    d = multi()
    d.apply(set_node_health("dgx-a0", False))
    assert d.apply(submit("g", "VC3", 5, [(1, 4)], suggested=["dgx-a0"]))[0] == "waiting"


def test_stores_fed_the_same_ops_with_suggested_nodes_stay_identical() -> None:
    ops_ = [submit("a", "VC1", 1, [(1, 1)], pinned="VC1-YQW-DGX2", leaf_type="DGX2-V100",
                   suggested=["0.0.3.1"]),
            submit("b", "VC1", 2, [(2, 16)], pinned="VC1-YQW-DGX2", leaf_type="DGX2-V100"),
            submit("b", "VC1", 2, [(2, 16)], pinned="VC1-YQW-DGX2", leaf_type="DGX2-V100",
                   suggested=["0.0.3.0"]),
            submit("c", "VC2", 1, [(1, 7), (1, 5)], suggested=["1.0.0.0", "1.0.0.1"])]
    one, two = design(), design()
    for op in ops_:
        assert one.apply(op) == two.apply(op)
    snap = one.store.snapshot()
    assert snap == two.store.snapshot()
    restored = ClusterStore(parse_config(DESIGN))
    restored.restore(snap)
    assert restored.snapshot() == snap
    check_invariants(one.store.allocator)


# --------------------------------------------------------------------------- properties

SHAPES = st.sampled_from([[(1, 1)], [(1, 4)], [(1, 8)], [(2, 8)], [(3, 2)], [(2, 4), (1, 2)]])
VCS = ("VC1", "VC2", "VC3")
PRIORITIES = st.sampled_from([-1, 1, 5, 9])


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, int, list[tuple[int, int]]]]:
    return draw(st.lists(st.tuples(st.sampled_from(VCS), PRIORITIES, SHAPES), max_size=8))


def _fill(d: Driver, history: list[tuple[str, int, list[tuple[int, int]]]]) -> None:
    for i, (vc, priority, shape) in enumerate(history):
        d.apply(submit(f"h{i}", vc, priority, shape))


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), vc=st.sampled_from(VCS), priority=PRIORITIES, shape=SHAPES,
       chosen=st.sets(st.integers(0, 10)))
def test_a_placement_always_lies_inside_the_suggested_nodes(
    history: list[tuple[str, int, list[tuple[int, int]]]], vc: str, priority: int,
    shape: list[tuple[int, int]], chosen: set[int],
) -> None:
    d = multi()
    _fill(d, history)
    names = sorted(d.store.topology.nodes)
    suggested = [names[i % len(names)] for i in chosen]
    result = d.apply(submit("new", vc, priority, shape, suggested=suggested))
    check_invariants(d.store.allocator)
    if result[0] in ("placed", "preempting"):
        info = group(d, "new")
        assert info is not None
        assert {node for _, node, _ in info["pods"]} <= set(suggested), (result, suggested)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), vc=st.sampled_from(VCS), priority=PRIORITIES, shape=SHAPES)
def test_suggesting_every_node_changes_nothing(
    history: list[tuple[str, int, list[tuple[int, int]]]], vc: str, priority: int,
    shape: list[tuple[int, int]],
) -> None:
    d = multi()
    _fill(d, history)
    every = sorted(d.store.topology.nodes)
    free = plan(d, "new", vc, priority, shape)
    confined = plan(d, "new", vc, priority, shape, suggested=every)
    if free[0] == "waiting":
        assert confined[0] == "waiting"
    else:
        assert confined == free


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), level=st.integers(1, 5), mode=st.sampled_from([CLEAN, HEALTHY, SICK]),
       bad=st.sets(st.integers(0, 10), max_size=3), chosen=st.sets(st.integers(0, 10)))
def test_the_cells_to_bind_begin_with_find_cells_choice(
    history: list[tuple[str, int, list[tuple[int, int]]]], level: int, mode: int,
    bad: set[int], chosen: set[int],
) -> None:
    d = multi()
    topo = d.store.topology
    names = sorted(topo.nodes)
    for i in bad:
        d.apply(set_node_health(names[i % len(names)], False))
    _fill(d, history)
    buddy = d.store.allocator.buddy
    only = NodeFilter(topo, {names[i % len(names)] for i in chosen})
    for info in topo.chains:
        if level > info.top_level:
            continue
        order = list(buddy.cells_to_bind(info.index, level, mode))
        assert (order[0] if order else -1) == buddy.find_cell(info.index, level, mode)
        assert len(order) == len(set(order))
        # pruning by a node filter is filtering the same order
        pruned = list(buddy.cells_to_bind(info.index, level, mode, only.holds))
        assert pruned == [c for c in order if only.holds(c)]
