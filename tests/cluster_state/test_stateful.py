"""Hypothesis drives random operation sequences through two stores fed the same log; after
every step the invariants hold (cs_helpers.check_invariants: no leaf used by two groups,
guaranteed groups inside their VC's cells, the safety invariant, preemption only by strictly
higher priority, exact counters and indexes) and the two snapshots are byte-identical.
A rule replaces the twin by a store restored from the snapshot, so restored stores must keep
behaving identically. Submit-then-release must restore the exact previous allocation state,
and invalid or waiting requests must change nothing."""

from typing import Any

import msgpack
from cs_helpers import allocation_state, check_invariants, multi_chain_config
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cluster_state import (
    ClusterStore,
    Topology,
    bind,
    release,
    set_node_health,
    submit,
    synthetic_config,
)
from cluster_state.index import FREE
from consensus.messages import Command

PRIORITIES = st.sampled_from([-1, 0, 1, 5, 10, 500, 1000])
SHAPES = st.sampled_from(
    [
        [(1, 1)],
        [(1, 2)],
        [(1, 3)],
        [(1, 4)],
        [(1, 8)],
        [(2, 8)],
        [(3, 1)],
        [(2, 4), (1, 2)],
        [(2, 8), (1, 4)],
    ]
)
SETTINGS = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


class AllocationMachine(RuleBasedStateMachine):
    topo: Topology
    pins: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.store = ClusterStore(self.topo)
        self.twin = ClusterStore(self.topo)
        self.position = 0
        self.counter = 0

    def _apply(self, op: bytes) -> list[Any]:
        self.position += 1
        command = Command(client_id=self.position % 3, seq=self.position, op=op)
        out = self.store.apply(self.position, command)
        assert self.twin.apply(self.position, command) == out
        decoded: list[Any] = msgpack.unpackb(out)
        return decoded

    def _name(self) -> str:
        self.counter += 1
        return f"g{self.counter}"

    def _changes(self) -> set[tuple[str, str]]:
        return {(e.kind, e.subject) for e in self.store.events_since(self.position - 1)}

    @rule(
        vc=st.integers(0, 9),
        priority=PRIORITIES,
        shape=SHAPES,
        lazy=st.booleans(),
        leaf=st.sampled_from(["", "", "V100", "K80"]),
        pin=st.integers(0, 5),
    )
    def submit_group(
        self, vc: int, priority: int, shape: list[tuple[int, int]], lazy: bool, leaf: str, pin: int
    ) -> None:
        vc_name = self.topo.vcs[vc % len(self.topo.vcs)]
        pins = sorted(self.topo.vc_pinned[vc_name])
        pinned = pins[0] if pins and pin == 0 and priority >= 0 else ""
        leaf = leaf if leaf in self.topo.chains_for_leaf else ""
        name = self._name()
        before = allocation_state(self.store)
        result = self._apply(
            submit(name, vc_name, priority, shape, leaf_type=leaf, pinned=pinned, lazy=lazy)
        )
        assert result[0] in {"placed", "preempting", "waiting", "error"}, result
        if result[0] in {"waiting", "error"}:
            assert allocation_state(self.store) == before
        if result[0] == "preempting":
            assert priority >= 0
            for victim in result[2]:
                assert self.store.allocator.groups[victim].priority < priority

    @rule(
        vc=st.integers(0, 9),
        priority=PRIORITIES,
        shape=SHAPES,
        chosen=st.sets(st.integers(0, 1000), max_size=6),
    )
    def submit_inside_suggested_nodes(
        self, vc: int, priority: int, shape: list[tuple[int, int]], chosen: set[int]
    ) -> None:
        """A group is placed (or reserves) inside the nodes Kubernetes suggests, or waits."""
        vc_name = self.topo.vcs[vc % len(self.topo.vcs)]
        names = sorted(self.topo.nodes)
        suggested = {names[i % len(names)] for i in chosen}
        name = self._name()
        before = allocation_state(self.store)
        result = self._apply(submit(name, vc_name, priority, shape, suggested=suggested))
        if result[0] in {"waiting", "error"}:
            assert allocation_state(self.store) == before
        else:
            held = self.store.allocator.groups[name].leaves()
            assert {self.topo.node_name[leaf] for leaf in held} <= suggested, result

    @rule(data=st.data(), chosen=st.sets(st.integers(0, 1000), max_size=6))
    def resubmit_preemptor_with_suggested_nodes(self, data: st.DataObject,
                                                chosen: set[int]) -> None:
        """A preemptor submitted again keeps its reservation inside the suggested nodes,
        else it is cancelled and planned again inside them."""
        preempting = sorted(n for n, g in self.store.allocator.groups.items() if g.preempting)
        if not preempting:
            return
        name = data.draw(st.sampled_from(preempting))
        group = self.store.allocator.groups[name]
        spec, before = group.spec, group.leaves()
        names = sorted(self.topo.nodes)
        suggested = {names[i % len(names)] for i in chosen}
        inside = {self.topo.node_name[leaf] for leaf in before} <= suggested
        result = self._apply(submit(spec.name, spec.vc, spec.priority, spec.members,
                                    leaf_type=spec.leaf_type, pinned=spec.pinned,
                                    lazy=spec.lazy, suggested=suggested))
        now = self.store.allocator.groups.get(name)
        if inside:
            assert now is not None and now.leaves() == before, result
        else:
            assert ("cancelled", name) in self._changes()
            if now is not None:
                assert {self.topo.node_name[leaf] for leaf in now.leaves()} <= suggested

    @rule(data=st.data())
    def release_group(self, data: st.DataObject) -> None:
        names = sorted(self.store.allocator.groups)
        if not names:
            return
        name = data.draw(st.sampled_from(names))
        assert self._apply(release(name))[0] == "released"
        assert name not in self.store.allocator.groups

    @rule(
        vc=st.integers(0, 9),
        priority=PRIORITIES,
        shape=SHAPES,
        leaf=st.sampled_from(["", "V100"]),
    )
    def submit_then_release_restores(
        self, vc: int, priority: int, shape: list[tuple[int, int]], leaf: str
    ) -> None:
        vc_name = self.topo.vcs[vc % len(self.topo.vcs)]
        leaf = leaf if leaf in self.topo.chains_for_leaf else ""
        name = self._name()
        before = allocation_state(self.store)
        result = self._apply(submit(name, vc_name, priority, shape, leaf_type=leaf))
        if result[0] not in {"placed", "preempting"}:
            assert allocation_state(self.store) == before
            return
        side_effects = {k for k, subject in self._changes() if subject != name}
        self._apply(release(name))
        if not side_effects:  # no lower preemption cancelled, nobody downgraded
            assert allocation_state(self.store) == before

    @rule(node=st.integers(0, 1000), healthy=st.booleans())
    def node_health(self, node: int, healthy: bool) -> None:
        names = sorted(self.topo.nodes)
        result = self._apply(set_node_health(names[node % len(names)], healthy))
        assert result[0] == "node_health"

    @rule(
        node=st.integers(0, 1000),
        count=st.integers(1, 8),
        vc=st.integers(0, 9),
        priority=PRIORITIES,
        lag=st.integers(0, 3),
    )
    def conditional_bind(self, node: int, count: int, vc: int, priority: int, lag: int) -> None:
        topo, cells = self.topo, self.store.allocator.cells
        node_name = sorted(topo.nodes)[node % len(topo.nodes)]
        node_cell = topo.nodes[node_name][0]
        free = [
            x for x in topo.leaves[node_cell] if cells.eff[x] == FREE and not cells.bad[x]
        ][:count]
        if not free:
            return
        since = self.store.revision - lag
        leaf_type = topo.chains[topo.chain_of[node_cell]].leaf_type
        vc_name = topo.vcs[vc % len(topo.vcs)]
        before = allocation_state(self.store)
        stale = max(cells.rev[x] for x in free) > since
        result = self._apply(
            bind(
                self._name(),
                vc_name,
                priority,
                [(1, len(free))],
                [(node_name, [topo.device[x] for x in free])],
                since,
                leaf_type=leaf_type,
            )
        )
        if stale and result[0] != "error":
            assert result[0] == "conflict" and "changed at revision" in result[2], result
        if result[0] == "placed":
            assert result[3] == [[len(free), node_name, [topo.device[x] for x in free]]]
        else:
            assert result[0] in {"conflict", "error"}, result
            assert allocation_state(self.store) == before

    @rule(data=st.sampled_from([b"\xc1", msgpack.packb(["submit", 1]),
                                msgpack.packb(["release", ""])]))
    def invalid_op(self, data: bytes) -> None:
        before = self.store.snapshot()
        assert self._apply(data)[0] == "error"
        assert self.store.snapshot() == before

    @rule()
    def restore_twin(self) -> None:
        twin = ClusterStore(self.topo)
        twin.restore(self.store.snapshot())
        self.twin = twin

    @invariant()
    def consistent(self) -> None:
        check_invariants(self.store.allocator)
        assert self.store.snapshot() == self.twin.snapshot()


class MultiChainMachine(AllocationMachine):
    topo = Topology(multi_chain_config())


class SyntheticMachine(AllocationMachine):
    topo = Topology(synthetic_config(nodes=16, nodes_per_rack=4, vcs=3, pinned=1))


TestMultiChain = MultiChainMachine.TestCase
TestMultiChain.settings = SETTINGS
TestSynthetic = SyntheticMachine.TestCase
TestSynthetic.settings = SETTINGS
