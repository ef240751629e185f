"""What the GPU allocation store adds to its replica's ``/metrics``
(``StateMachineKind.metrics``: ``consensus`` renders these and knows nothing of GPUs).

Gauges are read from the store at every scrape, in one pass over its groups (O(groups and
their pods)); each VC's guaranteed quota depends on the configuration only and is computed
once per configuration. Counters count what this replica applied since it started (a
restart's replay included), from the store's change events and results as each command
applies (``ReplicaNode.on_apply``): cheap, and exact however long between two scrapes.

==========================================  ==================================================
family                                      meaning
==========================================  ==================================================
``sdpaxos_store_vc_gpus{vc,state}``         GPUs of a virtual cluster: ``quota`` (its
                                            guaranteed cells), ``used`` / ``reserved`` by its
                                            guaranteed groups (placed / preempting), ``free``
                                            (quota minus both; a preemptor's leaves that are
                                            its victims' counted once), ``opportunistic``
                                            (used by its priority -1 groups, beyond quota)
``sdpaxos_store_groups{vc,state}``          groups by VC and state: ``placed``,
                                            ``preempting`` (waiting for victims), ``reserved``
                                            (victims gone, waiting for the scheduler),
                                            ``downgraded`` (lazily preempted, still running)
``sdpaxos_store_bad_nodes``                 nodes marked unhealthy
``sdpaxos_store_revision``                  the last applied change's log position
``sdpaxos_store_preemptions_total``         groups that began preempting others
``sdpaxos_store_preempted_groups_total``    victims those preemptions named
``sdpaxos_store_downgrades_total``          groups lazily preempted (downgraded)
``sdpaxos_store_waiting_total``             submissions answered "waiting" (no room now)
==========================================  ==================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from cluster_state.ops import Waiting, encode_result
from cluster_state.store import ClusterStore
from consensus.messages import Command
from consensus.runtime.state_machines import StateMetric

if TYPE_CHECKING:
    from cluster_state.cells import Topology

__all__ = ["GROUP_STATES", "VC_GPU_STATES", "StoreMetrics"]

#: the ``state`` label values of the two per-VC families, in the order they are reported
VC_GPU_STATES: Final = ("quota", "used", "reserved", "free", "opportunistic")
GROUP_STATES: Final = ("placed", "preempting", "reserved", "downgraded")

#: a "waiting" result's bytes after its array header: its kind as msgpack packs the string
#: (a one-byte header, then "waiting"), so an answer is recognised without decoding it
_WAITING_KIND: Final = encode_result(Waiting("", ""))[1 : 2 + len("waiting")]


class StoreMetrics:
    """The store's metrics (a ``MetricsSource``); ``applied`` is the node's apply hook."""

    __slots__ = ("_quota", "_quota_of", "downgrades", "preempted", "preemptions", "store",
                 "waiting")

    def __init__(self, store: ClusterStore) -> None:
        self.store = store
        self.preemptions = 0
        self.preempted = 0
        self.downgrades = 0
        self.waiting = 0
        self._quota: dict[str, int] = {}
        self._quota_of: Topology | None = None  # the configuration _quota was computed for

    def applied(self, position: int, commands: Sequence[Command],
                results: Sequence[bytes]) -> None:
        """Count what the commands from ``position`` on did (a ``TurnLoop.on_apply`` hook):
        their events (at the event log's tail, tagged with their positions) and their
        "waiting" answers."""
        for result in results:
            if result[1 : 1 + len(_WAITING_KIND)] == _WAITING_KIND:
                self.waiting += 1
        events = self.store.events.events
        for index in range(len(events) - 1, -1, -1):
            event = events[index]
            if event.revision < position:
                break
            if event.kind == "preempting":
                self.preemptions += 1
                self.preempted += len(event.data)
            elif event.kind == "downgraded":
                self.downgrades += 1

    def _quotas(self) -> dict[str, int]:
        """Each VC's guaranteed GPUs under the configuration the store runs now."""
        allocator = self.store.allocator
        if self._quota_of is not allocator.topo:
            self._quota = {vc: int(allocator.vc_info(vc)["leaves"]["total"])
                           for vc in allocator.topo.vcs}
            self._quota_of = allocator.topo
        return self._quota

    def _reserved_apart(self, vc: str) -> int:
        """Leaves ``vc``'s guaranteed preemptors reserve that none of its placed guaranteed
        groups uses (only asked for a VC with a preemptor: one more pass over its groups)."""
        mine = [g for g in self.store.allocator.groups.values()
                if g.spec.vc == vc and g.guaranteed]
        placed = {leaf for g in mine if not g.preempting for pod in g.pods for leaf in pod}
        return len({leaf for g in mine if g.preempting for pod in g.pods for leaf in pod}
                   - placed)

    def collect(self) -> Iterable[StateMetric]:
        allocator = self.store.allocator
        quota = self._quotas()
        gpus = {vc: dict.fromkeys(VC_GPU_STATES, 0) for vc in quota}
        groups = {vc: dict.fromkeys(GROUP_STATES, 0) for vc in quota}
        for group in allocator.groups.values():
            vc = group.spec.vc
            if vc not in gpus:  # a VC a reconfiguration dropped: reported under its name
                gpus[vc] = dict.fromkeys(VC_GPU_STATES, 0)
                groups[vc] = dict.fromkeys(GROUP_STATES, 0)
            leaves = sum(map(len, group.pods))  # (a generator here cost a third of a scrape)
            if group.downgraded:  # lazily preempted: runs as opportunistic
                groups[vc]["downgraded"] += 1
                gpus[vc]["opportunistic"] += leaves
                continue
            groups[vc][group.state] += 1
            if not group.guaranteed:
                gpus[vc]["opportunistic"] += leaves
            else:
                gpus[vc]["reserved" if group.preempting else "used"] += leaves
        for vc, counts in gpus.items():
            counts["quota"] = quota.get(vc, 0)
            # a preemptor reserves its victims' leaves too: count only the others as taken
            taken = counts["used"] + (self._reserved_apart(vc) if counts["reserved"] else 0)
            counts["free"] = max(0, counts["quota"] - taken)
        yield StateMetric(
            name="sdpaxos_store_vc_gpus", type="gauge", labels=("vc", "state"),
            help="GPUs of a virtual cluster by state: quota (its guaranteed cells), used and "
            "reserved by its guaranteed groups (placed, preempting), free (quota minus used "
            "and reserved), opportunistic (used by its priority -1 groups).",
            samples=[((vc, state), counts[state])
                     for vc, counts in sorted(gpus.items()) for state in VC_GPU_STATES],
        )  # fmt: skip
        yield StateMetric(
            name="sdpaxos_store_groups", type="gauge", labels=("vc", "state"),
            help="Groups of a virtual cluster by state: placed, preempting (waiting for its "
            "victims), reserved (victims gone, waiting for its scheduler), downgraded (lazily "
            "preempted, running as opportunistic).",
            samples=[((vc, state), counts[state])
                     for vc, counts in sorted(groups.items()) for state in GROUP_STATES],
        )  # fmt: skip
        yield StateMetric(name="sdpaxos_store_bad_nodes", type="gauge",
                          help="Nodes marked unhealthy.",
                          samples=(((), len(allocator.bad_nodes)),))
        yield StateMetric(name="sdpaxos_store_revision", type="gauge",
                          help="The log position of the last change the store applied.",
                          samples=(((), self.store.revision),))
        for name, value, help_text in (
            ("sdpaxos_store_preemptions_total", self.preemptions,
             "Groups that began preempting lower-priority groups (applied here since start)."),
            ("sdpaxos_store_preempted_groups_total", self.preempted,
             "Victims those preemptions named (applied here since start)."),
            ("sdpaxos_store_downgrades_total", self.downgrades,
             "Groups lazily preempted: downgraded to opportunistic, keeping their GPUs."),
            ("sdpaxos_store_waiting_total", self.waiting,
             "Submissions answered 'waiting': no room for the group now (applied here since "
             "start; a retried submission counts again)."),
        ):
            yield StateMetric(name=name, type="counter", help=help_text,
                              samples=(((), value),))
