"""An independent witness of the allocation history: who held which GPU, event by event.

Fed with the store's watch stream (``ChangeEvent``s in revision order), it keeps the owner of
every (node, device) and records a violation whenever a placement takes a GPU that a live
group still holds — the "no GPU is ever allocated twice" check of the demo and end-to-end
tests. It trusts nothing the store computes beyond the events themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cluster_state.events import ChangeEvent

__all__ = ["GpuLedger", "double_allocations"]


class GpuLedger:
    def __init__(self) -> None:
        self.owner: dict[tuple[str, int], str] = {}
        self.held: dict[str, list[tuple[str, int]]] = {}
        self.violations: list[str] = []
        self.revision = 0
        self.placements = 0

    def apply(self, event: ChangeEvent) -> None:
        if event.revision < self.revision:
            self.violations.append(f"event at revision {event.revision} after {self.revision}")
        self.revision = event.revision
        if event.kind == "placed":
            self._place(event.subject, event.data[1], event.revision)
        elif event.kind == "trimmed":  # a reconfiguration dropped leaves: it holds fewer now
            gpus = {(str(node), int(d)) for _, node, devices in event.data[1] for d in devices}
            for gpu in self.held.get(event.subject, []):
                if gpu not in gpus and self.owner.get(gpu) == event.subject:
                    del self.owner[gpu]
            self.held[event.subject] = sorted(gpus)
        elif event.kind == "released":
            for gpu in self.held.pop(event.subject, []):
                if self.owner.get(gpu) == event.subject:
                    del self.owner[gpu]

    def _place(self, group: str, pods: Iterable[Any], revision: int) -> None:
        gpus = [(str(node), int(device)) for _, node, devices in pods for device in devices]
        for gpu in gpus:
            holder = self.owner.get(gpu)
            if holder is not None and holder != group:
                self.violations.append(
                    f"revision {revision}: {gpu[0]} GPU {gpu[1]} given to {group} "
                    f"while {holder} holds it"
                )
        for gpu in self.held.get(group, []):
            self.owner.pop(gpu, None)  # placed again (after a preemption): the new cells count
        self.held[group] = gpus
        for gpu in gpus:
            self.owner[gpu] = group
        self.placements += 1

    def in_use(self) -> int:
        return len(self.owner)


def double_allocations(groups: Iterable[dict[str, Any]]) -> list[str]:
    """GPUs used by two placed groups in one state (the ``list_groups`` query's answer)."""
    seen: dict[tuple[str, int], str] = {}
    problems = []
    for group in groups:
        if group.get("state") in ("preempting", "reserved"):
            continue  # its pods are reserved, not used: the victims still hold them
        for _, node, devices in group.get("pods") or []:
            for device in devices:
                gpu = (str(node), int(device))
                if gpu in seen:
                    problems.append(f"{gpu[0]} GPU {gpu[1]}: {seen[gpu]} and {group['name']}")
                seen[gpu] = group["name"]
    return problems
