"""Claims (which pod holds which member pod of a placed group) and incarnation-conditional
releases, as logged commands of the store: the compare-and-set rules one by one, then a
Hypothesis state machine that races claims of many pods (random slots, random "previous"
holders, stale incarnations) against submits, releases and re-submits of the same names,
checking against a model that a member pod is never held by two pods, that every answer is
the one the rules give, and that a replica fed the same log — or restored from a snapshot —
holds the same claims."""

from __future__ import annotations

from typing import Any

import msgpack
from cs_helpers import (
    MULTI_CHAIN_YAML,
    Driver,
    allocation_state,
    check_invariants,
    multi_chain_config,
)
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cluster_state import ClusterStore, reconfigure, release, submit
from cluster_state.events import ClaimedDetails
from cluster_state.ops import claim, get_group, inspect, release_if
from consensus.messages import Command

#: a gang of two 1-GPU pods (slots 0 and 1) and one 2-GPU pod (slot 2)
GANG = [(2, 1), (1, 2)]


def _store() -> tuple[ClusterStore, Driver]:
    store = ClusterStore(multi_chain_config())
    return store, Driver(store)


def _group(d: Driver, name: str) -> dict[str, Any]:
    info: dict[str, Any] = d.query(get_group(name))[2]
    return info


def _placed(d: Driver, name: str = "g") -> int:
    """Submit the gang ``name`` (placed); its incarnation."""
    assert d.apply(submit(name, "VC2", 10, GANG, leaf_type="V100"))[0] == "placed"
    incarnation: int = _group(d, name)["incarnation"]
    return incarnation


def test_claim_is_idempotent_for_its_pod_and_refused_for_another() -> None:
    store, d = _store()
    inc = _placed(d)
    assert d.apply(claim("g", inc, 0, "uid-a", "ns/a")) == ["claimed", "g", inc, 0, "uid-a"]
    before = store.snapshot()
    # the same pod again (a re-filter, a retried bind): the same answer, nothing changes
    assert d.apply(claim("g", inc, 0, "uid-a", "ns/a")) == ["claimed", "g", inc, 0, "uid-a"]
    assert store.allocator.groups["g"].claims == {0: ("uid-a", "ns/a")}
    # another pod for the same member: refused, whatever its scheduler saw
    refused = d.apply(claim("g", inc, 0, "uid-b", "ns/b"))
    assert refused[0] == "conflict" and "held by uid-a" in refused[2]
    # a pod that holds a member asks for another one: refused
    twice = d.apply(claim("g", inc, 1, "uid-a", "ns/a"))
    assert twice[0] == "conflict" and "holds member pod 0" in twice[2]
    assert store.allocator.groups["g"].claims == {0: ("uid-a", "ns/a")}
    assert msgpack.unpackb(store.snapshot())[4] == msgpack.unpackb(before)[4]
    assert d.apply(claim("g", inc, 1, "uid-b", "ns/b"))[0] == "claimed"
    info = _group(d, "g")
    assert info["claims"] == [[0, "uid-a", "ns/a"], [1, "uid-b", "ns/b"]]
    assert d.query(inspect("group", "g"))[2]["allocated_pods"] == ["uid-a", "uid-b"]
    check_invariants(store.allocator)


def test_a_held_member_changes_hands_only_from_the_named_holder() -> None:
    store, d = _store()
    inc = _placed(d)
    assert d.apply(claim("g", inc, 2, "uid-a", "ns/a"))[0] == "claimed"
    # naming the wrong previous holder, or none, is refused
    assert d.apply(claim("g", inc, 2, "uid-c", "ns/c", "uid-x"))[0] == "conflict"
    assert d.apply(claim("g", inc, 2, "uid-c", "ns/c"))[0] == "conflict"
    # a free member cannot be taken "from" someone either: the condition is exact
    assert d.apply(claim("g", inc, 1, "uid-c", "ns/c", "uid-a"))[0] == "conflict"
    assert d.apply(claim("g", inc, 2, "uid-c", "ns/c", "uid-a")) == [
        "claimed", "g", inc, 2, "uid-c"]
    assert store.allocator.groups["g"].claims == {2: ("uid-c", "ns/c")}
    # the watch stream has each claim that changed a holder (and nothing for the refusals)
    claimed = [e for e in store.events_since(-1) if e.kind == "claimed"]
    assert [(e.subject, e.details) for e in claimed] == [
        ("g", ClaimedDetails(inc, 2, "uid-a", "ns/a", "")),
        ("g", ClaimedDetails(inc, 2, "uid-c", "ns/c", "uid-a"))]
    assert d.apply(claim("g", inc, 2, "uid-c", "ns/c", "uid-a"))[0] == "claimed"  # a retry
    assert len([e for e in store.events_since(-1) if e.kind == "claimed"]) == 2
    check_invariants(store.allocator)


def test_claims_are_conditional_on_the_incarnation() -> None:
    store, d = _store()
    old = _placed(d)
    assert d.apply(claim("g", old, 0, "uid-a", "ns/a"))[0] == "claimed"
    assert d.apply(release("g"))[0] == "released"
    gone = d.apply(claim("g", old, 1, "uid-b", "ns/b"))
    assert gone[0] == "conflict" and "is gone" in gone[2]
    new = _placed(d)  # a new gang under the same name
    assert new != old and _group(d, "g")["claims"] == []  # the old claims went with it
    stale = d.apply(claim("g", old, 0, "uid-b", "ns/b"))
    assert stale[0] == "conflict" and f"is incarnation {new}" in stale[2]
    assert d.apply(claim("g", new, 0, "uid-b", "ns/b"))[0] == "claimed"
    check_invariants(store.allocator)


def test_a_preempting_group_takes_no_claims_and_bad_claims_are_errors() -> None:
    store, d = _store()
    assert d.apply(submit("low", "VC2", 1, [(4, 8)], leaf_type="V100"))[0] == "placed"
    assert d.apply(submit("high", "VC2", 900, [(4, 8)], leaf_type="V100"))[0] == "preempting"
    inc = _group(d, "high")["incarnation"]
    refused = d.apply(claim("high", inc, 0, "uid-a", "ns/a"))
    assert refused[0] == "conflict" and "preempting" in refused[2]
    low = _group(d, "low")["incarnation"]
    before = store.snapshot()
    assert d.apply(claim("low", low, 4, "uid-a", "ns/a"))[0] == "error"  # 4 pods: no slot 4
    for bad in (
        msgpack.packb(["claim", "low", low, 0, "", "ns/a", ""]),  # no uid
        msgpack.packb(["claim", "low", -1, 0, "uid-a", "ns/a", ""]),
        msgpack.packb(["claim", "low", low, -1, "uid-a", "ns/a", ""]),
        msgpack.packb(["claim", "low", low, 0, "uid-a", "", ""]),  # no pod key
        msgpack.packb(["claim", "low", low, 0, "uid-a", "ns/a", 7]),
        msgpack.packb(["claim", "low", low, 0, "uid-a"]),
        msgpack.packb(["release", "low", "x"]),
        msgpack.packb(["release", "low", -3]),
    ):
        assert d.apply(bad)[0] == "error", bad
    # only the remembered session results moved: no group, claim or cell changed
    assert msgpack.unpackb(store.snapshot())[4] == msgpack.unpackb(before)[4]
    check_invariants(store.allocator)


def test_release_if_spares_a_new_gang_of_the_same_name() -> None:
    store, d = _store()
    old = _placed(d)
    assert d.apply(release("g"))[0] == "released"
    new = _placed(d)
    before = allocation_state(store)
    refused = d.apply(release_if("g", old))
    assert refused[0] == "conflict" and f"incarnation {new}, not {old}" in refused[2]
    assert allocation_state(store) == before
    assert d.apply(release_if("g", new))[0] == "released"
    assert "g" not in store.allocator.groups
    assert d.apply(release_if("g", new))[0] == "error"  # released already: no group


def test_claims_survive_snapshots_and_reconfiguration() -> None:
    store, d = _store()
    inc = _placed(d)
    d.apply(claim("g", inc, 1, "uid-b", "ns/b"))
    twin = ClusterStore(multi_chain_config())
    twin.restore(store.snapshot())
    assert twin.snapshot() == store.snapshot()
    assert twin.allocator.groups["g"].claims == {1: ("uid-b", "ns/b")}
    assert twin.allocator.groups["g"].created == inc
    # an older snapshot (records without incarnation and claims) still loads: a placed
    # group's incarnation is then its token
    fields = msgpack.unpackb(store.snapshot())
    fields[4][0] = [record[:9] for record in fields[4][0]]
    old = ClusterStore(multi_chain_config())
    old.restore(msgpack.packb(fields))
    assert old.allocator.groups["g"].created == store.allocator.groups["g"].token
    # a reconfiguration that keeps the group (VC3 shrinks) keeps its claims and incarnation
    edited = MULTI_CHAIN_YAML.replace("V100-SOCKET, cellNumber: 2}", "V100-SOCKET, cellNumber: 1}")
    assert edited != MULTI_CHAIN_YAML
    changed = d.apply(reconfigure(edited))
    assert changed[0] == "reconfigured" and changed[2] is True
    assert changed[3]["groups"]["g"]["outcome"] == "kept"
    assert store.allocator.groups["g"].claims == {1: ("uid-b", "ns/b")}
    assert store.allocator.groups["g"].created == inc
    check_invariants(store.allocator)


# --------------------------------------------------------------------------- state machine

NAMES = ("ga", "gb")
UIDS = tuple(f"uid-{i}" for i in range(5))
SETTINGS = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


class ClaimMachine(RuleBasedStateMachine):
    """Two groups under reused names, five pods racing for their member pods."""

    def __init__(self) -> None:
        super().__init__()
        self.store = ClusterStore(multi_chain_config())
        self.twin = ClusterStore(multi_chain_config())
        self.position = 0
        # the model: name -> (incarnation, pods, slot -> uid); incarnations seen, ever
        self.model: dict[str, tuple[int, int, dict[int, str]]] = {}
        self.seen: dict[str, list[int]] = {name: [] for name in NAMES}

    def _apply(self, op: bytes) -> list[Any]:
        self.position += 1
        command = Command(client_id=self.position % 3, seq=self.position, op=op)
        out = self.store.apply(self.position, command)
        assert self.twin.apply(self.position, command) == out
        decoded: list[Any] = msgpack.unpackb(out)
        return decoded

    @precondition(lambda self: len(self.model) < len(NAMES))
    @rule(data=st.data(), priority=st.sampled_from([-1, 0, 10]),
          shape=st.sampled_from([[(1, 1)], [(3, 1)], [(2, 2), (1, 4)], [(2, 8)], [(4, 1)]]))
    def submit_group(self, data: st.DataObject, priority: int,
                     shape: list[tuple[int, int]]) -> None:
        name = data.draw(st.sampled_from([n for n in NAMES if n not in self.model]))
        result = self._apply(submit(name, "VC2", priority, shape, leaf_type="V100"))
        if result[0] != "placed":
            return  # waiting: nothing changed
        info = self.store.allocator.group_info(name)
        assert info is not None and info["claims"] == []
        assert info["incarnation"] == self.position  # a new incarnation: this command's
        assert all(info["incarnation"] > old for old in self.seen[name])
        self.seen[name].append(info["incarnation"])
        self.model[name] = (info["incarnation"], sum(p for p, _ in shape), {})

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def claim_member(self, data: st.DataObject) -> None:
        """A pod of a placed group claims a member pod, naming a holder it may have seen."""
        name = data.draw(st.sampled_from(sorted(self.model)))
        _, pods, claims = self.model[name]
        slot = data.draw(st.integers(0, pods))  # ``pods``: one past the last
        holder = claims.get(slot, "")
        uid = data.draw(st.sampled_from(sorted(set(UIDS) - set(claims.values())) or UIDS))
        previous = data.draw(st.sampled_from([holder, holder, "", UIDS[0]]))
        self.claim_slot(name, slot, uid, previous, 0)

    @rule(name=st.sampled_from(NAMES), slot=st.integers(0, 4), uid=st.sampled_from(UIDS),
          previous=st.sampled_from(("", "", *UIDS)), stale=st.integers(0, 2))
    def claim_slot(self, name: str, slot: int, uid: str, previous: str, stale: int) -> None:
        """Any claim, of a gone or older incarnation too."""
        incarnations = self.seen[name] or [0]
        incarnation = incarnations[-1 - min(stale, len(incarnations) - 1)]
        result = self._apply(claim(name, incarnation, slot, uid, f"ns/{uid}", previous))
        entry = self.model.get(name)
        if entry is None or entry[0] != incarnation:
            assert result[0] == "conflict", result
            return
        _, pods, claims = entry
        if slot >= pods:
            assert result[0] == "error", result
            return
        if claims.get(slot) == uid:
            assert result == ["claimed", name, incarnation, slot, uid]
        elif uid in claims.values() or claims.get(slot, "") != previous:
            assert result[0] == "conflict", result
        else:
            assert result == ["claimed", name, incarnation, slot, uid]
            claims[slot] = uid

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), stale=st.integers(0, 1), conditional=st.booleans())
    def release_group(self, data: st.DataObject, stale: int, conditional: bool) -> None:
        name = data.draw(st.sampled_from(sorted(self.model)))
        incarnations = self.seen[name] or [0]
        incarnation = incarnations[-1 - min(stale, len(incarnations) - 1)]
        op = release_if(name, incarnation) if conditional else release(name)
        result = self._apply(op)
        entry = self.model[name]
        if conditional and entry[0] != incarnation:
            assert result[0] == "conflict", result
        else:
            assert result[0] == "released", result
            del self.model[name]

    @precondition(lambda self: bool(self.model))
    @rule()
    def restore_twin(self) -> None:
        twin = ClusterStore(multi_chain_config())
        twin.restore(self.store.snapshot())
        self.twin = twin

    @invariant()
    def claims_match_the_model(self) -> None:
        check_invariants(self.store.allocator)
        assert self.store.snapshot() == self.twin.snapshot()
        for name in NAMES:
            info = self.store.allocator.group_info(name)
            entry = self.model.get(name)
            assert (info is None) == (entry is None)
            if info is None or entry is None:
                continue
            assert info["incarnation"] == entry[0]
            held = {slot: uid for slot, uid, _ in info["claims"]}
            assert held == entry[2]
            assert len(set(held.values())) == len(held)  # no pod holds two member pods


ClaimMachine.TestCase.settings = SETTINGS
TestClaims = ClaimMachine.TestCase


def test_a_scheduler_claims_and_releases_its_own_vcs_groups_only() -> None:
    from cluster_state.authz import AuthorizedStore
    from cluster_state.config import synthetic_config
    from consensus.auth import SCHEDULER, AuthorizingMachine, Denied, Principal, seal

    store = AuthorizedStore(synthetic_config(nodes=16, vcs=2))
    machine = AuthorizingMachine(store)
    mine = Principal("sched-a", SCHEDULER, ("vc00",))
    other = Principal("sched-b", SCHEDULER, ("vc01",))
    position = 0

    def run(who: Principal, op: bytes) -> list[Any] | Denied:
        nonlocal position
        position += 1
        out = machine.run(position, Command(client_id=1, seq=position, op=seal(who, op)))
        return out if isinstance(out, Denied) else msgpack.unpackb(out)

    assert run(mine, submit("j", "vc00", 10, [(2, 1)]))[0] == "placed"  # type: ignore[index]
    inc = store.allocator.groups["j"].created
    assert isinstance(run(other, claim("j", inc, 0, "uid-x", "ns/x")), Denied)
    assert isinstance(run(other, release_if("j", inc)), Denied)
    assert store.allocator.groups["j"].claims == {}
    assert run(mine, claim("j", inc, 0, "uid-x", "ns/x")) == ["claimed", "j", inc, 0, "uid-x"]
    assert run(mine, release_if("j", inc))[0] == "released"  # type: ignore[index]
