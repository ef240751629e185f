"""Between the store's answers (the maps and events of ``cluster_state.ops``/``events``) and
the typed messages of ``cluster_state.proto``: one function per message, both ways where a
client needs the way back (events, pods). Fields map one to one; a map's missing optional
entry is the message field's default."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from cluster_state import ops
from cluster_state.events import ChangeEvent
from cluster_state.grpc_api import cluster_state_pb2 as pb

__all__ = [
    "allocation_to_pb",
    "event_from_pb",
    "event_to_pb",
    "group_to_pb",
    "group_tree_to_pb",
    "physical_trees_to_pb",
    "pods_from_pb",
    "pods_to_pb",
    "reconfigure_reply",
    "summary_to_pb",
    "vc_to_pb",
    "vc_tree_to_pb",
]


def pods_to_pb(pods: Iterable[Any]) -> list[pb.Pod]:
    """``[leaves, node, devices]`` entries (lists or ``ops.Pod``) as ``Pod`` messages."""
    return [pb.Pod(leaves=int(n), node=str(node), devices=[int(d) for d in devices])
            for n, node, devices in pods]


def pods_from_pb(pods: Iterable[pb.Pod]) -> tuple[ops.Pod, ...]:
    return tuple(ops.Pod(p.leaves, p.node, tuple(p.devices)) for p in pods)


def _lazy(status: Mapping[str, Any] | None) -> pb.LazyPreemption | None:
    if status is None:
        return None
    return pb.LazyPreemption(preemptor=status["preemptor"], position=status["position"])


def group_to_pb(info: Mapping[str, Any]) -> pb.Group:
    """``Allocator.group_info``'s map."""
    spec = pb.GroupSpec(
        name=info["name"], vc=info["vc"], priority=info["priority"],
        members=[pb.Member(pods=p, leaves=g) for p, g in info["members"]],
        leaf_type=info["leaf_type"], pinned=info["pinned"], lazy=info["lazy"],
    )
    return pb.Group(
        spec=spec, state=info["state"], downgraded=info["downgraded"],
        lazy_preemption=_lazy(info["lazy_preemption"]), chain=info["chain"],
        pods=pods_to_pb(info["pods"]), token=info["token"], victims=info["victims"],
        preempted_by=info["preempted_by"], incarnation=info["incarnation"],
        claims=[pb.Claim(slot=slot, uid=uid, pod=pod) for slot, uid, pod in info["claims"]],
    )


def allocation_to_pb(info: Mapping[str, Any]) -> pb.Allocation:
    """One entry of ``Allocator.list_groups``."""
    return pb.Allocation(
        name=info["name"], vc=info["vc"], priority=info["priority"], state=info["state"],
        leaves=info["leaves"], chain=info["chain"], token=info["token"],
        pods=pods_to_pb(info["pods"]), incarnation=info["incarnation"],
    )


def vc_to_pb(info: Mapping[str, Any]) -> pb.VirtualCluster:
    """``Allocator.vc_info``'s map."""
    return pb.VirtualCluster(
        name=info["name"],
        cells=[pb.VcCells(**cells) for cells in info["cells"]],
        pinned=[pb.PinnedCell(**pin) for pin in info["pinned"]],
        leaves=pb.VcLeaves(**info["leaves"]),
        groups=info["groups"],
    )


def summary_to_pb(info: Mapping[str, Any]) -> pb.Summary:
    """``Allocator.summary``'s map."""
    return pb.Summary(
        chains=[pb.ChainUse(**chain) for chain in info["chains"]], nodes=info["nodes"],
        bad_nodes=info["bad_nodes"], groups=info["groups"], preempting=info["preempting"],
        vcs=info["vcs"],
    )


def _physical_cell(doc: Mapping[str, Any]) -> pb.PhysicalCell:
    return pb.PhysicalCell(
        address=doc["address"], type=doc["type"], level=doc["level"], healthy=doc["healthy"],
        state=doc["state"], priority=doc["priority"], group=doc.get("group") or "",
        partial=doc.get("partial", False), node=doc.get("node", ""), vc=doc.get("vc", ""),
        doomed=doc.get("doomed", False), virtual=doc.get("virtual", ""),
        children=[_physical_cell(child) for child in doc.get("children", ())],
    )


def physical_trees_to_pb(trees: Iterable[Mapping[str, Any]]) -> pb.PhysicalTrees:
    """``Allocator.inspect_physical``'s list."""
    return pb.PhysicalTrees(chains=[
        pb.ChainCells(chain=tree["chain"], cells=[_physical_cell(c) for c in tree["cells"]])
        for tree in trees
    ])


def _virtual_cell(doc: Mapping[str, Any]) -> pb.VirtualCell:
    return pb.VirtualCell(
        virtual=doc["virtual"], address=doc["address"], healthy=doc["healthy"],
        state=doc.get("state", ""), priority=doc["priority"], group=doc.get("group") or "",
        children=[_virtual_cell(child) for child in doc.get("children", ())],
    )


def vc_tree_to_pb(tree: Mapping[str, Any]) -> pb.VcTree:
    """``Allocator.inspect_vc``'s map."""
    cells = []
    for doc in tree["cells"]:
        physical = doc.get("physical")
        cells.append(pb.VcCell(
            address=doc["address"], chain=doc["chain"], type=doc["type"], level=doc["level"],
            pinned=doc["pinned"], bound=doc["bound"], doomed=doc["doomed"],
            used_leaves=doc["used_leaves"],
            physical=_virtual_cell(physical) if physical is not None else None,
        ))
    return pb.VcTree(vc=tree["vc"], cells=cells)


def group_tree_to_pb(tree: Mapping[str, Any]) -> pb.GroupTree:
    """``Allocator.inspect_group``'s map."""
    return pb.GroupTree(
        name=tree["name"], vc=tree["vc"], priority=tree["priority"], state=tree["state"],
        chain=tree["chain"],
        physical_placement={node: pb.Devices(devices=devices)
                            for node, devices in tree["physical_placement"].items()},
        virtual_placement={cell: pb.VirtualAddresses(addresses=addresses)
                           for cell, addresses in tree["virtual_placement"].items()},
        victims=tree["victims"], preempted_by=tree["preempted_by"],
        lazy_preemption=_lazy(tree["lazy_preemption"]), allocated_pods=tree["allocated_pods"],
    )


def reconfigure_reply(digest: str, changed: bool, report: Mapping[str, Any],
                      typed: bool) -> pb.ReconfigureReply:
    """A reconfiguration's (or its dry run's) report; ``typed``: leave the JSON out."""
    groups = {}
    for name, entry in report.get("groups", {}).items():
        moved = entry.get("moved") or ("", "")
        groups[name] = pb.GroupOutcome(outcome=entry["outcome"], reason=entry.get("reason", ""),
                                       dropped=entry.get("dropped", ()), moved_from=moved[0],
                                       moved_to=moved[1])
    return pb.ReconfigureReply(
        digest=digest, changed=changed, report_json="" if typed else json.dumps(report),
        groups=groups, nodes_added=report.get("nodes_added", ()),
        nodes_removed=report.get("nodes_removed", ()), vcs_added=report.get("vcs_added", ()),
        vcs_removed=report.get("vcs_removed", ()),
    )


# --------------------------------------------------------------------------- events
def event_to_pb(event: ChangeEvent, *, with_json: bool) -> pb.Event:
    """A change event with its typed details (``with_json``: the deprecated ``data_json``
    too, for clients that predate the typed fields)."""
    message = pb.Event(revision=event.revision, kind=event.kind, subject=event.subject)
    if with_json:
        message.data_json = json.dumps(list(event.data))
    data = event.data
    match event.kind:
        case "placed" | "trimmed":
            chain, pods, token = data
            message.placed.CopyFrom(pb.PlacedEvent(chain=chain, pods=pods_to_pb(pods),
                                                   token=token))
        case "preempting":
            message.preempting.victims.extend(data)
        case "downgraded":
            message.downgraded.preemptor = data[0]
        case "cancelled":
            message.cancelled.reason = data[0]
        case "node_health":
            message.node_health.healthy = data[0]
        case "reconfigured":
            message.reconfigured.digest = data[0]
        case "claimed":
            incarnation, slot, uid, pod, previous = data
            message.claimed.CopyFrom(pb.ClaimedEvent(incarnation=incarnation, slot=slot,
                                                     uid=uid, pod=pod, previous=previous))
    return message


def event_from_pb(event: pb.Event) -> ChangeEvent:
    """The ``ChangeEvent`` the store holds (its ``data`` as the store's own: lists inside),
    from the typed details, or from ``data_json`` if the replica sent only that."""
    details = event.WhichOneof("details")
    data: tuple[Any, ...]
    if details is None and event.data_json:  # a replica of an older build
        data = tuple(json.loads(event.data_json))
    elif details == "placed":
        placed = event.placed
        data = (placed.chain, [[p.leaves, p.node, list(p.devices)] for p in placed.pods],
                placed.token)
    elif details == "preempting":
        data = tuple(event.preempting.victims)
    elif details == "downgraded":
        data = (event.downgraded.preemptor,)
    elif details == "cancelled":
        data = (event.cancelled.reason,)
    elif details == "node_health":
        data = (event.node_health.healthy,)
    elif details == "reconfigured":
        data = (event.reconfigured.digest,)
    elif details == "claimed":
        claimed = event.claimed
        data = (claimed.incarnation, claimed.slot, claimed.uid, claimed.pod, claimed.previous)
    else:  # released, reserved: nothing more
        data = ()
    return ChangeEvent(event.revision, event.kind, event.subject, data)
