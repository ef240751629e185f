"""Scenario tests on a HiveD-style two-chain cluster (see cs_helpers.MULTI_CHAIN_YAML):

* V100-RACK chain: rack-a (dgx-a0..a3) and rack-b (dgx-b0..b3), 8-GPU DGX-like nodes
  (node -> 2 sockets -> 2 PCIe switches -> 2 GPUs); dgx-b0 is pinned for VC1.
* 3-K80-NODE chain: k80-0..2, 4-GPU nodes.
* VC1: 2 V100 nodes + 1 K80 node + the pinned node; VC2: 1 V100 rack + 2 K80 nodes;
  VC3: 2 V100 sockets. The assignment is tight at every level.

Every operation goes through a ``ClusterStore`` and is followed by a full invariant check.
"""

from typing import Any

import pytest
from cs_helpers import Driver, allocation_state, check_invariants, devices, multi_chain_config

from cluster_state import (
    ClusterStore,
    bind,
    get_group,
    get_summary,
    get_vc,
    release,
    set_node_health,
    submit,
)


class Env(Driver):
    def apply(self, op: bytes) -> list[Any]:
        result = super().apply(op)
        check_invariants(self.store.allocator)
        return result

    def group(self, name: str) -> dict[str, Any] | None:
        info: dict[str, Any] | None = self.query(get_group(name))[2]
        return info

    def vc(self, name: str) -> dict[str, Any]:
        info: dict[str, Any] = self.query(get_vc(name))[2]
        return info

    def level(self, vc: str, cell_type: str) -> dict[str, Any]:
        return next(c for c in self.vc(vc)["cells"] if c["cell_type"] == cell_type)

    def kinds(self) -> list[tuple[str, str]]:
        return [(e.kind, e.subject) for e in self.store.events_since(self.position - 1)]


@pytest.fixture
def env() -> Env:
    return Env(ClusterStore(multi_chain_config()))


def test_pods_pack_into_held_nodes_with_the_lowest_common_ancestor(env: Env) -> None:
    one = env.apply(submit("one", "VC1", 10, [(1, 1)], leaf_type="V100"))
    # the first V100 node VC1 binds: rack-a is whole, so buddy allocation splits rack-b first
    assert devices(one) == [("dgx-b1", [0])]
    pair = env.apply(submit("pair", "VC1", 10, [(1, 2)], leaf_type="V100"))
    assert devices(pair) == [("dgx-b1", [2, 3])]  # a whole PCIe switch, not [1, 2]
    quad = env.apply(submit("quad", "VC1", 10, [(1, 4)], leaf_type="V100"))
    assert devices(quad) == [("dgx-b1", [4, 5, 6, 7])]  # a whole socket
    fill = env.apply(submit("fill", "VC1", 10, [(1, 1)], leaf_type="V100"))
    assert devices(fill) == [("dgx-b1", [1])]  # the hole in the held node, no new binding
    assert env.level("VC1", "V100-NODE")["bound"] == 1
    env.apply(release("pair"))
    again = env.apply(submit("again", "VC1", 10, [(2, 1)], leaf_type="V100"))
    assert devices(again) == [("dgx-b1", [2]), ("dgx-b1", [3])]


def test_gang_with_members_of_different_sizes_is_placed_at_once_in_one_chain(env: Env) -> None:
    result = env.apply(submit("gang", "VC2", 10, [(2, 8), (1, 4)], leaf_type="V100"))
    assert result[0] == "placed" and result[2] == "V100-RACK" and result[4] == env.position
    assert [(n, node) for n, node, _ in result[3]] == [(8, "dgx-a0"), (8, "dgx-a1"), (4, "dgx-a2")]
    info = env.group("gang")
    assert info is not None and info["state"] == "placed" and info["members"] == [[2, 8], [1, 4]]
    # VC2's only V100 cell is one rack: 32 leaves. A 5-node gang never fits and changes nothing.
    before = allocation_state(env.store)
    waiting = env.apply(submit("huge", "VC2", 10, [(5, 8)], leaf_type="V100"))
    assert waiting[0] == "waiting" and "VC2 has no room for 40 leaf cells" in waiting[2]
    assert allocation_state(env.store) == before
    # an opportunistic gang too big for one chain's free cells waits as well
    assert env.apply(submit("opp", "VC3", -1, [(7, 8)]))[0] == "waiting"


def test_leaf_type_and_chain_order(env: Env) -> None:
    k80 = env.apply(submit("k", "VC1", 10, [(1, 2)]))
    assert k80[2] == "3-K80-NODE"  # chains are tried in name order
    v100 = env.apply(submit("v", "VC1", 10, [(1, 2)], leaf_type="V100"))
    assert v100[2] == "V100-RACK"
    # a pod bigger than a K80 node still finds the V100 chain
    assert env.apply(submit("big", "VC1", 10, [(1, 8)]))[2] == "V100-RACK"
    assert env.apply(submit("x", "VC3", 10, [(1, 1)], leaf_type="K80"))[0] == "error"
    assert env.apply(submit("y", "VC1", 10, [(1, 16)]))[1].startswith("a pod of 16 leaf cells")


def test_opportunistic_uses_other_vcs_free_cells_and_is_preempted(env: Env) -> None:
    # VC3 owns only two sockets, but an opportunistic group may use any free leaf.
    opp = env.apply(submit("opp", "VC3", -1, [(3, 8)], leaf_type="V100"))
    assert sorted(node for node, _ in devices(opp)) == ["dgx-a0", "dgx-a1", "dgx-a2"]
    assert env.vc("VC3")["leaves"]["used"] == 0  # it binds nothing
    # VC2's rack can only be rack-a (rack-b is split by the pinned node). One node fits in
    # its free part without preempting anything ...
    alone = env.apply(submit("alone", "VC2", 0, [(1, 8)], leaf_type="V100"))
    assert devices(alone) == [("dgx-a3", list(range(8)))]
    env.apply(release("alone"))
    # ... two nodes preempt the opportunistic gang (the whole gang is the victim).
    result = env.apply(submit("g", "VC2", 0, [(2, 8)], leaf_type="V100"))
    assert result == ["preempting", "g", ["opp"]]
    assert env.group("opp")["preempted_by"] == ["g"]  # type: ignore[index]
    assert env.group("g")["state"] == "preempting"  # type: ignore[index]
    released = env.apply(release("opp"))
    # HiveD: the preemptor stays reserved until its scheduler confirms it (submit again)
    assert released == ["released", "opp", []]
    assert env.group("g")["state"] == "reserved"  # type: ignore[index]
    assert ("reserved", "g") in env.kinds()
    assert env.apply(submit("g", "VC2", 0, [(2, 8)], leaf_type="V100"))[0] == "placed"
    info = env.group("g")
    assert info is not None and info["state"] == "placed" and info["token"] == env.position
    assert ("placed", "g") in env.kinds()


def test_preemption_needs_strictly_higher_priority(env: Env) -> None:
    for i in range(4):
        assert env.apply(submit(f"low{i}", "VC2", 10, [(1, 8)], leaf_type="V100"))[0] == "placed"
    same = env.apply(submit("same", "VC2", 10, [(1, 8)], leaf_type="V100"))
    assert same[0] == "waiting"
    higher = env.apply(submit("higher", "VC2", 11, [(1, 8)], leaf_type="V100"))
    assert higher == ["preempting", "higher", ["low0"]]
    # other VCs' guaranteed groups are never preempted, whatever the priority
    top = env.apply(submit("top", "VC1", 1000, [(3, 8)], leaf_type="V100"))
    assert top[0] == "waiting"


def test_reservations_block_lower_groups_and_a_higher_preemptor_cancels(env: Env) -> None:
    env.apply(submit("v", "VC2", 10, [(4, 8)], leaf_type="V100"))
    p1 = env.apply(submit("p1", "VC2", 20, [(1, 8)], leaf_type="V100"))
    assert p1 == ["preempting", "p1", ["v"]]
    p1_node = env.group("p1")["pods"][0][1]  # type: ignore[index]
    # priority 15 may preempt v too, but not take what p1 reserved
    q = env.apply(submit("q", "VC2", 15, [(1, 8)], leaf_type="V100"))
    assert q == ["preempting", "q", ["v"]]
    assert env.group("q")["pods"][0][1] != p1_node  # type: ignore[index]
    # priority 20 takes over q's reservation (15 < 20) but not p1's (equal priority)
    r = env.apply(submit("r", "VC2", 20, [(3, 8)], leaf_type="V100"))
    assert r == ["preempting", "r", ["v"]]
    assert p1_node not in [pod[1] for pod in env.group("r")["pods"]]  # type: ignore[index]
    assert ("cancelled", "q") in env.kinds() and env.group("q") is None
    assert env.apply(submit("r2", "VC2", 20, [(1, 8)], leaf_type="V100"))[0] == "waiting"
    # a higher preemptor that needs the reserved cells cancels the lower preemptions
    top = env.apply(submit("top", "VC2", 30, [(4, 8)], leaf_type="V100"))
    assert top == ["preempting", "top", ["v"]]
    assert set(env.kinds()) >= {("cancelled", "p1"), ("cancelled", "r")}
    for name in ("p1", "r"):
        assert env.group(name) is None
    assert env.group("v")["preempted_by"] == ["top"]  # type: ignore[index]
    # the reserved leaves are still v's: used within the quota, the reservation apart
    assert {k: env.vc("VC2")["leaves"][k] for k in ("total", "used", "reserved")} == {
        "total": 40, "used": 32, "reserved": 32}  # (the old count: used 64 of 40)
    assert env.apply(release("v")) == ["released", "v", []]
    assert env.group("top")["state"] == "reserved"  # type: ignore[index]
    assert env.apply(submit("top", "VC2", 30, [(4, 8)], leaf_type="V100"))[0] == "placed"
    assert env.group("top")["state"] == "placed"  # type: ignore[index]
    assert (env.vc("VC2")["leaves"]["used"], env.vc("VC2")["leaves"]["reserved"]) == (32, 0)


def test_lazy_preemption_downgrades_the_victim_instead_of_killing_it(env: Env) -> None:
    lazy = env.apply(submit("lazy", "VC1", 10, [(1, 8)], leaf_type="V100", lazy=True))
    env.apply(submit("firm", "VC1", 10, [(1, 8)], leaf_type="V100"))
    # VC1's two V100 nodes are full; a higher group would preempt the lower one it lands on,
    # but that one opted for lazy preemption: it is downgraded and keeps running.
    result = env.apply(submit("urgent", "VC1", 20, [(1, 8)], leaf_type="V100"))
    assert result[0] == "placed"
    info = env.group("lazy")
    assert info is not None and info["downgraded"] and info["state"] == "placed"
    assert info["pods"] == lazy[3]  # same leaves
    assert ("downgraded", "lazy") in env.kinds()
    assert env.vc("VC1")["leaves"]["used"] == 16  # firm + urgent; lazy counts as opportunistic
    # now opportunistic, it is preempted by anything guaranteed that needs its node
    assert env.apply(submit("p", "VC2", 0, [(4, 8)], leaf_type="V100"))[0] == "placed"


def test_lazy_preemption_is_undone_when_it_does_not_help(env: Env) -> None:
    env.apply(set_node_health("dgx-a0", False))  # VC2's rack cell is doomed to rack-a
    env.apply(submit("v", "VC2", 10, [(3, 8)], leaf_type="V100", lazy=True))
    before = allocation_state(env.store)
    # Downgrading v would release VC2's rack, and no healthy rack could be bound again, so
    # the downgrade is reverted and v is preempted the ordinary way.
    result = env.apply(submit("top", "VC2", 20, [(1, 8)], leaf_type="V100"))
    assert result == ["preempting", "top", ["v"]]
    info = env.group("v")
    assert info is not None and not info["downgraded"]
    assert ("downgraded", "v") not in env.kinds()
    env.apply(release("top"))
    assert allocation_state(env.store) == before


def test_without_lazy_preemption_the_victim_is_preempted(env: Env) -> None:
    env.apply(submit("lazy", "VC1", 10, [(1, 8)], leaf_type="V100"))
    env.apply(submit("firm", "VC1", 10, [(1, 8)], leaf_type="V100"))
    result = env.apply(submit("urgent", "VC1", 20, [(1, 8)], leaf_type="V100"))
    assert result == ["preempting", "urgent", ["lazy"]]


def test_pinned_cells(env: Env) -> None:
    pinned = env.apply(submit("pin", "VC1", 5, [(1, 8)], pinned="VC1-PIN"))
    assert devices(pinned) == [("dgx-b0", list(range(8)))]
    env.apply(release("pin"))
    env.apply(submit("a", "VC1", 5, [(2, 8)], leaf_type="V100"))
    # the floating cells are full; the pinned node is free but only for pinned requests
    assert env.apply(submit("b", "VC1", 5, [(1, 1)], leaf_type="V100"))[0] == "waiting"
    assert env.vc("VC1")["pinned"][0]["used"] is False
    # opportunistic groups may use its free leaves (and are then preempted by a pinned group)
    opp = env.apply(submit("opp", "VC3", -1, [(1, 8)], leaf_type="V100"))
    assert devices(opp)[0][0] in {"dgx-a0", "dgx-b0"}
    err = env.apply(submit("c", "VC1", -1, [(1, 1)], pinned="VC1-PIN"))
    assert err == ["error", "an opportunistic group (priority -1) cannot use a pinned cell"]
    err = env.apply(submit("d", "VC2", 5, [(1, 1)], pinned="VC1-PIN"))
    assert err == ["error", "pinned cell 'VC1-PIN' is not one of VC2's"]
    # more than the pinned cell holds can never fit: an error (HiveD would wait for ever)
    err = env.apply(submit("e", "VC1", 5, [(2, 8)], pinned="VC1-PIN"))
    assert err[0] == "error" and "can never fit" in err[1]


def test_bad_node_dooms_a_vc_cell_until_it_recovers(env: Env) -> None:
    assert env.apply(set_node_health("dgx-a0", False)) == [
        "node_health",
        "dgx-a0",
        False,
        True,
        [],
        "",
    ]
    # VC2 is promised a whole rack; the only one (rack-a) now has a bad node: its rack cell
    # is doomed - bound to the bad rack so VC2 sees its degraded capacity.
    rack = env.level("VC2", "V100-RACK")
    assert (rack["bound"], rack["doomed"], rack["bad"]) == (1, 1, 1)
    summary = env.query(get_summary())[2]
    assert summary["bad_nodes"] == ["dgx-a0"]
    # its healthy nodes are still usable; the bad one never is
    gang = env.apply(submit("g", "VC2", 10, [(3, 8)], leaf_type="V100"))
    assert sorted(node for node, _ in devices(gang)) == ["dgx-a1", "dgx-a2", "dgx-a3"]
    assert env.level("VC2", "V100-RACK")["doomed"] == 0  # in use: an ordinary cell now
    assert env.apply(submit("h", "VC2", 10, [(1, 1)], leaf_type="V100"))[0] == "waiting"
    env.apply(release("g"))
    assert env.level("VC2", "V100-RACK")["doomed"] == 1
    assert env.apply(set_node_health("dgx-a0", True))[3] is True
    rack = env.level("VC2", "V100-RACK")
    assert (rack["bound"], rack["doomed"], rack["bad"]) == (0, 0, 0)
    assert env.apply(set_node_health("dgx-a0", True))[3] is False  # no change


def test_placements_avoid_bad_nodes_and_keep_existing_groups(env: Env) -> None:
    first = env.apply(submit("first", "VC1", 10, [(1, 8)], leaf_type="V100"))
    node = devices(first)[0][0]
    env.apply(set_node_health(node, False))
    info = env.group("first")
    assert info is not None and info["state"] == "placed"  # the decision is kept
    second = env.apply(submit("second", "VC1", 10, [(1, 8)], leaf_type="V100"))
    assert devices(second)[0][0] != node
    assert env.apply(submit("o", "VC3", -1, [(1, 1)], leaf_type="V100"))[0] == "placed"
    env.apply(release("first"))
    third = env.apply(submit("third", "VC1", 10, [(1, 1)], leaf_type="V100"))
    assert devices(third)[0][0] != node


def test_a_preempting_group_on_a_node_going_bad_is_cancelled(env: Env) -> None:
    env.apply(submit("v", "VC2", 10, [(4, 8)], leaf_type="V100"))
    env.apply(submit("p", "VC2", 20, [(1, 8)], leaf_type="V100"))
    node = env.group("p")["pods"][0][1]  # type: ignore[index]
    result = env.apply(set_node_health(node, False))
    assert result == ["node_health", node, False, True, ["p"], ""]
    assert env.group("p") is None and env.group("v")["preempted_by"] == []  # type: ignore[index]


def test_unknown_node_is_ignored_with_a_warning(env: Env) -> None:
    # HiveD ignores reports about nodes its configuration does not know
    before = allocation_state(env.store)
    result = env.apply(set_node_health("nope", False))
    assert result[:5] == ["node_health", "nope", False, False, []]
    assert "unknown node 'nope'" in result[5] and "ignored" in result[5]
    assert allocation_state(env.store) == before


@pytest.mark.parametrize(
    "ops",
    [
        [submit("x", "VC1", 10, [(1, 3)], leaf_type="V100")],
        [submit("x", "VC2", 10, [(2, 8), (1, 4)], leaf_type="V100")],  # binds a whole rack
        [submit("x", "VC1", 10, [(1, 8), (1, 4)], leaf_type="V100")],  # over two node cells
        [submit("x", "VC3", 10, [(1, 4), (2, 2)])],
        [submit("x", "VC2", 1, [(1, 2)])],  # K80
        [submit("x", "VC3", -1, [(2, 8)])],
        [submit("x", "VC1", 10, [(1, 8)], pinned="VC1-PIN")],
    ],
)
def test_release_restores_the_exact_previous_state(env: Env, ops: list[bytes]) -> None:
    env.apply(submit("base", "VC1", 3, [(1, 2)], leaf_type="V100"))
    env.apply(submit("opp", "VC3", -1, [(1, 4)], leaf_type="V100"))
    env.apply(set_node_health("dgx-b3", False))
    before = allocation_state(env.store)
    for op in ops:
        assert env.apply(op)[0] == "placed"
    assert allocation_state(env.store) != before
    env.apply(release("x"))
    assert allocation_state(env.store) == before


def test_cancelling_a_preemption_restores_the_exact_previous_state(env: Env) -> None:
    env.apply(submit("v", "VC2", 10, [(4, 8)], leaf_type="V100"))
    before = allocation_state(env.store)
    assert env.apply(submit("p", "VC2", 20, [(2, 8)], leaf_type="V100"))[0] == "preempting"
    env.apply(release("p"))
    assert allocation_state(env.store) == before


def _revision(env: Env) -> int:
    revision: int = env.query(get_summary())[1]
    return revision


def test_conditional_bind(env: Env) -> None:
    revision = _revision(env)
    # VC1 may not take a node of rack-a: VC2 is promised the only whole rack (safety)
    unsafe = env.apply(bind("b0", "VC1", 10, [(1, 1)], [("dgx-a1", [0])], revision))
    assert unsafe == ["conflict", "b0", "rack-a/dgx-a1/0/0/0 is outside what VC1 can hold there"]
    placed = env.apply(
        bind("b1", "VC1", 10, [(1, 4)], [("dgx-b1", [0, 1, 2, 3])], revision, leaf_type="V100")
    )
    assert placed == ["placed", "b1", "V100-RACK", [[4, "dgx-b1", [0, 1, 2, 3]]], env.position]
    assert env.level("VC1", "V100-NODE")["bound"] == 1  # it bound a node cell around them
    # a stale revision: those leaves changed since
    stale = env.apply(bind("b2", "VC1", 10, [(1, 2)], [("dgx-b1", [2, 3])], revision))
    assert stale[0] == "conflict" and "changed at revision" in stale[2]
    # a fresh revision but a leaf in use
    now = _revision(env)
    busy = env.apply(bind("b2", "VC1", 10, [(1, 2)], [("dgx-b1", [3, 4])], now))
    assert busy == ["conflict", "b2", "rack-b/dgx-b1/0/1/3 is not free"]
    ok = env.apply(bind("b2", "VC1", 10, [(1, 2)], [("dgx-b1", [4, 5])], now))
    assert ok[0] == "placed"
    # VC3 holds only sockets: a whole node takes both of them, a third socket is not there
    node = env.apply(bind("s", "VC3", 1, [(1, 8)], [("dgx-b2", list(range(8)))], _revision(env)))
    assert node[0] == "placed"
    out = env.apply(bind("s2", "VC3", 1, [(1, 1)], [("dgx-b3", [0])], _revision(env)))
    assert out[0] == "conflict" and "outside what VC3 can hold" in out[2]
    # opportunistic: any free leaf
    opp = env.apply(bind("o", "VC3", -1, [(1, 1)], [("k80-2", [3])], _revision(env)))
    assert opp[0] == "placed" and opp[2] == "3-K80-NODE"


@pytest.mark.parametrize(
    ("op", "reason"),
    [
        (bind("x", "VC1", 1, [(1, 2)], [("dgx-a1", [0])], 0), "placement pod 0 has 1 leaf cells"),
        (bind("x", "VC1", 1, [(2, 1)], [("dgx-a1", [0])], 0), "placement lists 1 pods"),
        (bind("x", "VC1", 1, [(1, 1)], [("dgx-a1", [9])], 0), "node dgx-a1 has no device 9"),
        (bind("x", "VC1", 1, [(1, 1)], [("zz", [0])], 0), "node 'zz' has no leaf cells"),
        (bind("x", "VC1", 1, [(2, 1)], [("dgx-a1", [0]), ("dgx-a1", [0])], 0), "a leaf cell twice"),
        (bind("x", "VC1", 1, [(2, 1)], [("dgx-a1", [0]), ("k80-0", [0])], 0), "in one chain"),
    ],
)
def test_invalid_binds_are_errors(env: Env, op: bytes, reason: str) -> None:
    result = env.apply(op)
    assert result[0] == "error" and reason in result[1]


def test_resubmitting_a_group_answers_its_state(env: Env) -> None:
    op = submit("g", "VC1", 10, [(1, 2)], leaf_type="V100")
    first = env.apply(op)
    assert env.apply(op) == first  # same spec, new command: the same answer, nothing new
    other = env.apply(submit("g", "VC1", 11, [(1, 2)], leaf_type="V100"))
    assert other == ["error", "group 'g' already exists with a different spec"]
    assert env.apply(release("nope")) == ["error", "no group 'nope'"]


def test_answers_are_the_same_when_the_kept_pods_are_dropped(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # the Pods an answer names are kept per pod's leaves (Allocator._pod); with room for one,
    # every other answer makes its Pods again: the answers are the same as when all are kept
    ops = [submit("a", "VC1", 1, [(1, 8)]), submit("b", "VC1", 1, [(2, 2), (1, 1)]),
           release("a"), submit("c", "VC1", 1, [(1, 8)]), submit("b", "VC1", 1, [(2, 2), (1, 1)])]
    kept = [env.apply(op) for op in ops]
    monkeypatch.setattr("cluster_state.allocator.PODS_KEPT", 1)
    again = Env(ClusterStore(multi_chain_config()))
    assert [again.apply(op) for op in ops] == kept
    assert len(again.store.allocator._pods_kept) == 1
    assert kept[3][3] == kept[0][3]  # c took a's leaves: the same Pod, from the kept ones
