"""Hypothesis interleaves reconfigurations (nodes removed, added and moved chain, VCs shrunk
and removed, the pinned cell moved, store options changed) with every other operation of
``test_stateful.AllocationMachine``; after each step the invariants hold
(``check_invariants``, the VC safety invariant included) and the twin store, fed the same
log or restored from a snapshot, is byte-identical. Groups are never lost by a
reconfiguration unless none of their leaves is left, and keep every leaf that is."""

from __future__ import annotations

from cs_helpers import multi_chain_config
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule
from reconfig_helpers import VARIANTS, variant
from test_stateful import AllocationMachine

from cluster_state import ClusterStore, Topology, bind, release, submit
from cluster_state.ops import plan_reconfigure, reconfigure

TEXTS = {name: variant(name) for name in VARIANTS}


class ReconfigMachine(AllocationMachine):
    topo = Topology(multi_chain_config())

    # removing a node is the change that trims groups: drawn more often
    @rule(name=st.sampled_from([*sorted(TEXTS), "without_a3", "without_a3"]), dry=st.booleans())
    def reconfigure(self, name: str, dry: bool) -> None:
        store = self.store
        old_topo = store.topology
        before = {
            g: {
                (old_topo.node_name[leaf], old_topo.device[leaf])
                for leaf in group.leaves()
            }
            for g, group in store.allocator.groups.items()
            if not group.preempting
        }
        if dry:
            snap = store.snapshot()
            plan = self._query(plan_reconfigure(TEXTS[name]))
            assert store.snapshot() == snap
            if not plan["changed"]:
                return
        result = self._apply(reconfigure(TEXTS[name]))
        event(f"reconfigure to {name}: changed {result[2]}")
        assert result[0] == "reconfigured", result
        topo = store.topology
        self.topo = topo  # the other rules draw VCs and nodes from the running configuration
        report = result[3] if result[2] else {"groups": {}}
        if dry:
            assert {k: v for k, v in plan.items() if k != "changed"} == report
        after = store.allocator.groups
        for g, gpus in before.items():
            outcome = report["groups"].get(g, {"outcome": "kept"})["outcome"]
            event(f"reconfigured group: {outcome}")
            if outcome == "dropped":
                assert g not in after
                continue
            kept = {(topo.node_name[leaf], topo.device[leaf]) for leaf in after[g].leaves()}
            assert kept <= gpus, g
            if outcome in {"kept", "downgraded"}:
                assert kept == gpus, g  # work-preserving: every GPU stays with its group
        assert not any(g.preempting for g in after.values()) or not result[2]

    @rule(data=st.data(), by_bind=st.booleans())
    def confirm_reserved(self, data: st.DataObject, by_bind: bool) -> None:
        """The scheduler of a preemptor whose victims are gone confirms it (HiveD: it is
        scheduled again), by a second submit or by binding exactly its reserved GPUs."""
        alloc = self.store.allocator
        names = sorted(n for n, g in alloc.groups.items() if g.reserved)
        if not names:  # make one: release every victim of a preemptor
            waiting = sorted(n for n, g in alloc.groups.items() if g.preempting)
            if not waiting:
                return
            preemptor = data.draw(st.sampled_from(waiting))
            for victim in sorted(alloc.groups[preemptor].victims):
                self._apply(release(victim))
            group = alloc.groups[preemptor]
            if not group.reserved:  # reservations: immediate placed it at once
                assert not group.preempting
                return
            names = [preemptor]
        group = alloc.groups[data.draw(st.sampled_from(names))]
        topo, spec = self.store.topology, group.spec
        members = [(m.pods, m.leaves) for m in spec.members]
        options = {"leaf_type": spec.leaf_type, "pinned": spec.pinned, "lazy": spec.lazy}
        if by_bind:
            pods = [(topo.node_name[p[0]], [topo.device[x] for x in p]) for p in group.pods]
            op = bind(spec.name, spec.vc, spec.priority, members, pods, -1, **options)
        else:
            op = submit(spec.name, spec.vc, spec.priority, members, **options)
        result = self._apply(op)
        event(f"confirmed by {'bind' if by_bind else 'submit'}")
        assert result[0] == "placed", result
        assert not alloc.groups[spec.name].preempting

    def _query(self, op: bytes) -> dict[str, object]:
        import msgpack

        answer = msgpack.unpackb(self.store.query(op))
        assert answer[0] == "plan", answer
        info: dict[str, object] = answer[2]
        return info

    @rule()
    def restore_twin(self) -> None:
        # a replica built with the first configuration adopts the snapshot's
        twin = ClusterStore(multi_chain_config())
        twin.restore(self.store.snapshot())
        self.twin = twin


TestReconfig = ReconfigMachine.TestCase
TestReconfig.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
