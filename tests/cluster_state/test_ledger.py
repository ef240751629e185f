"""The demo's independent witness of GPU ownership catches a double allocation."""

from __future__ import annotations

from cluster_state.events import ChangeEvent
from cluster_state.ledger import GpuLedger, double_allocations


def placed(revision: int, group: str, node: str, devices: list[int]) -> ChangeEvent:
    return ChangeEvent(revision, "placed", group, ("V100-RACK", [[len(devices), node, devices]],
                                                   revision))


def test_a_gpu_given_to_two_live_groups_is_a_violation() -> None:
    ledger = GpuLedger()
    ledger.apply(placed(1, "a", "n0", [0, 1]))
    ledger.apply(placed(2, "b", "n0", [2, 3]))
    assert ledger.violations == [] and ledger.in_use() == 4
    ledger.apply(placed(3, "c", "n0", [1]))
    assert ledger.violations == ["revision 3: n0 GPU 1 given to c while a holds it"]


def test_released_gpus_can_be_given_again() -> None:
    ledger = GpuLedger()
    ledger.apply(placed(1, "a", "n0", [0, 1]))
    ledger.apply(ChangeEvent(2, "released", "a", ()))
    ledger.apply(placed(3, "b", "n0", [0, 1]))
    assert ledger.violations == [] and ledger.in_use() == 2


def test_double_allocations_in_a_state() -> None:
    groups = [
        {"name": "a", "pods": [[2, "n0", [0, 1]]]},
        {"name": "b", "pods": [[1, "n1", [1]], [1, "n0", [1]]]},
        {"name": "c", "pods": []},
    ]
    assert double_allocations(groups) == ["n0 GPU 1: a and b"]
    assert double_allocations(groups[:1] + groups[2:]) == []
