"""Configurations derived from ``cs_helpers.MULTI_CHAIN_YAML`` for the reconfiguration tests:
each one is valid, and together they remove, add and move nodes, shrink and drop VCs and
change the store options."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import yaml
from cs_helpers import MULTI_CHAIN_YAML

Raw = dict[str, Any]


def base() -> Raw:
    raw: Raw = yaml.safe_load(MULTI_CHAIN_YAML)
    return raw


def _cells(raw: Raw) -> list[Any]:
    cells: list[Any] = raw["physicalCluster"]["physicalCells"]
    return cells


def without_a3(raw: Raw) -> Raw:
    """dgx-a3 leaves rack-a (a partly filled rack); VC2's whole rack becomes 3 nodes."""
    _cells(raw)[0]["cellChildren"].pop()
    raw["virtualClusters"]["VC2"]["virtualCells"][0] = {
        "cellType": "V100-RACK.V100-NODE", "cellNumber": 3}
    return raw


def k80_2_moves_chain(raw: Raw) -> Raw:
    """k80-2 moves to a chain of its own (K80-SOLO); VC2 gets one K80 node in each chain."""
    raw["physicalCluster"]["cellTypes"]["K80-SOLO"] = {
        "childCellType": "K80-NODE", "childCellNumber": 1}
    _cells(raw)[2]["cellChildren"].pop()
    _cells(raw).append({"cellType": "K80-SOLO", "cellChildren": [{"cellAddress": "k80-2"}]})
    raw["virtualClusters"]["VC2"]["virtualCells"][1] = {
        "cellType": "3-K80-NODE.K80-NODE", "cellNumber": 1}
    raw["virtualClusters"]["VC2"]["virtualCells"].append(
        {"cellType": "K80-SOLO.K80-NODE", "cellNumber": 1})
    return raw


def rack_c_added(raw: Raw) -> Raw:
    """A new rack of four nodes (bad until reported, with that option), for VC3, and
    preemptors placed at once."""
    _cells(raw).append({"cellType": "V100-RACK", "cellAddress": "rack-c",
                        "cellChildren": [{"cellAddress": f"dgx-c{i}"} for i in range(4)]})
    raw["virtualClusters"]["VC3"]["virtualCells"].append(
        {"cellType": "V100-RACK.V100-NODE", "cellNumber": 4})
    raw["storeOptions"] = {"initialNodeHealth": "bad", "reservations": "immediate"}
    return raw


def vc3_gone_vc1_shrunk(raw: Raw) -> Raw:
    """VC3 is removed and VC1 keeps one V100 node (and its pinned node)."""
    del raw["virtualClusters"]["VC3"]
    raw["virtualClusters"]["VC1"]["virtualCells"][0]["cellNumber"] = 1
    return raw


def pin_moves(raw: Raw) -> Raw:
    """VC1's pinned node becomes dgx-b3 instead of dgx-b0."""
    rack_b = _cells(raw)[1]["cellChildren"]
    del rack_b[0]["pinnedCellId"]
    rack_b[3]["pinnedCellId"] = "VC1-PIN"
    return raw


VARIANTS: dict[str, Callable[[Raw], Raw]] = {
    "base": lambda raw: raw,
    "without_a3": without_a3,
    "k80_2_moves_chain": k80_2_moves_chain,
    "rack_c_added": rack_c_added,
    "vc3_gone_vc1_shrunk": vc3_gone_vc1_shrunk,
    "pin_moves": pin_moves,
}


def variant(name: str) -> str:
    """The YAML text of configuration ``name``."""
    text: str = yaml.safe_dump(VARIANTS[name](copy.deepcopy(base())), sort_keys=False)
    return text
