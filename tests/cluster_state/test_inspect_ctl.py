"""Inspect trees (issue 24, point 5) from the store, and reconfiguration, inspect and node
health warnings over the embedded API, gRPC and ``sdpaxos ctl`` (points 1, 4, 5)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cs_helpers import Driver, multi_chain_config

from bench.cli import main
from cluster_state import ClusterStore, release, submit
from cluster_state.client import AllocationStore
from cluster_state.config import synthetic_config
from cluster_state.errors import GpuConfigError
from cluster_state.grpc_api.service import serve_grpc
from cluster_state.ops import GroupSpec, Member, inspect
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode

#: the gRPC port's offset from the cluster's base port (clear of the replicas' ports)
GRPC_OFFSET = 300
#: seconds the in-process cluster gets to start and to stop
START_S = 30


def walk(cell: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield cell
    for child in cell.get("children", []):
        yield from walk(child)


def test_physical_vc_and_group_trees() -> None:
    d = Driver(ClusterStore(multi_chain_config()))
    d.apply(submit("lazy", "VC1", 5, [(1, 8)], leaf_type="V100", lazy=True))
    d.apply(submit("firm", "VC1", 5, [(1, 8)], leaf_type="V100"))
    physical = d.query(inspect("physical", "V100-RACK"))[2]
    assert [c["chain"] for c in physical] == ["V100-RACK"]
    cells = [c for top in physical[0]["cells"] for c in walk(top)]
    leaves = [c for c in cells if c["level"] == 1]
    assert len(leaves) == 64 and {c["state"] for c in leaves} == {"free", "used"}
    used = [c for c in leaves if c["state"] == "used"]
    assert {c["group"] for c in used} == {"lazy", "firm"} and {c["priority"] for c in used} == {5}
    nodes = [c for c in cells if c.get("node")]
    assert len(nodes) == 8 and all(c["type"] == "V100-NODE" for c in nodes)
    bound = [c for c in cells if c.get("vc")]
    # VC1's two node cells and its pinned node are bound, each with its virtual address
    # (VC1/0 is its K80 node: VC cells are numbered chain by chain, by name)
    assert sorted(c["virtual"] for c in bound) == ["VC1/1", "VC1/2", "VC1/VC1-PIN"]
    under = [c for c in walk(bound[0]) if c is not bound[0]]
    assert all(c["virtual"].startswith(bound[0]["virtual"] + "/") for c in under)
    # the VC tree: its virtual cells with their physical counterparts
    vc = d.query(inspect("vc", "VC1"))[2]
    floating = [c for c in vc["cells"] if not c["pinned"]]
    node_cells = [c for c in floating if c["type"] == "V100-NODE"]
    assert [c["bound"] for c in node_cells] == [True, True]
    vleaves = [c for cell in node_cells for c in walk(cell["physical"]) if "state" in c]
    assert {c["group"] for c in vleaves if c["group"]} == {"lazy", "firm"}
    # a group's virtual placement, then its lazy-preemption status (by whom, when)
    g = d.query(inspect("group", "lazy"))[2]
    assert g["lazy_preemption"] is None and len(g["physical_placement"]) == 1
    (cell, vleafs), = g["virtual_placement"].items()
    assert cell.startswith("VC1/") and len(vleafs) == 8
    assert all(v.startswith(cell + "/") and v.count("/") == 4 for v in vleafs)
    top = d.apply(submit("top", "VC1", 9, [(1, 8)], leaf_type="V100"))
    assert top[0] in {"placed", "preempting"}
    g = d.query(inspect("group", "lazy"))[2]
    assert g["lazy_preemption"] == {"preemptor": "top", "position": d.position}
    assert g["virtual_placement"] == {}  # HiveD: nil once lazily preempted
    d.apply(release("top"))
    assert d.query(inspect("group", "nobody"))[2] is None
    assert d.query(inspect("vc", "nope"))[0] == "error"
    assert d.query(inspect("physical", "nope"))[0] == "error"
    assert d.query(inspect("physical"))[2][1]["chain"] == "V100-RACK"
    # one cell's subtree by address, with the virtual address it is bound under
    (one,) = d.query(inspect("physical", "rack-b/dgx-b0/0"))[2]
    (socket,) = one["cells"]
    assert socket["type"] == "V100-SOCKET" and socket["virtual"] == "VC1/VC1-PIN/0"
    assert len([c for c in walk(socket) if c["level"] == 1]) == 4


@pytest.fixture
def server(
    tmp_path: Path,
) -> Iterator[tuple[str, list[ReplicaNode], asyncio.AbstractEventLoop]]:
    """Three in-process replicas serving the store; gRPC on replica 1."""
    base = free_base_port()
    (tmp_path / "cluster.toml").write_text(cluster_toml(3, base, wan=False))
    config = load_cluster_config(tmp_path / "cluster.toml")
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stopping: list[asyncio.Event] = []
    nodes: list[ReplicaNode] = []

    async def host() -> None:
        gpu = synthetic_config(nodes=16, vcs=2, pinned=1)
        nodes.extend(ReplicaNode(config, i, ClusterStore(gpu), fsync=False) for i in range(3))
        for node in nodes:
            await node.start()
        grpc_server = await serve_grpc(nodes[1], "127.0.0.1", base + GRPC_OFFSET)
        stop = asyncio.Event()
        stopping.append(stop)
        ready.set()
        await stop.wait()
        await grpc_server.stop(0.5)
        for node in nodes:
            await node.stop()

    thread = threading.Thread(target=lambda: loop.run_until_complete(host()), daemon=True)
    thread.start()
    assert ready.wait(START_S)
    try:
        yield f"127.0.0.1:{base + GRPC_OFFSET}", nodes, loop
    finally:
        loop.call_soon_threadsafe(stopping[0].set)
        thread.join(START_S)


def ctl(capsys: pytest.CaptureFixture[str], server: str, *words: str) -> tuple[int, str, str]:
    code = main(["ctl", "--server", server, "--json", *words])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_config_apply_inspect_and_health_warning_over_grpc(
    server: tuple[str, list[ReplicaNode], asyncio.AbstractEventLoop],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    address, nodes, _ = server
    code, out, _ = ctl(capsys, address, "submit", "train", "--vc", "vc00", "--priority", "100",
                       "--pods", "2x8")
    assert code == 0
    on = sorted({pod[1] for pod in json.loads(out)["pods"]})
    # a configuration without the first node of the group: dry run, then apply
    smaller = synthetic_config(nodes=16, vcs=2, pinned=1).to_dict()
    for rack in smaller["physicalCluster"]["physicalCells"]:
        rack["cellChildren"] = [n for n in rack["cellChildren"] if n["cellAddress"] != on[0]]
    smaller["virtualClusters"] = {"vc00": smaller["virtualClusters"]["vc00"]}
    path = tmp_path / "new.yaml"
    path.write_text(json.dumps(smaller))  # JSON is YAML
    code, out, _ = ctl(capsys, address, "config", "apply", str(path), "--dry-run")
    plan = json.loads(out)
    assert code == 0 and plan["dry_run"] and plan["changed"]
    assert plan["groups"]["train"]["outcome"] == "trimmed"
    assert plan["nodes_removed"] == [on[0]] and plan["vcs_removed"] == ["vc01"]
    code, out, _ = ctl(capsys, address, "status", "train")
    assert [pod["node"] for pod in json.loads(out)["pods"]] == on  # the dry run changed nothing
    assert main(["ctl", "--server", address, "config", "apply", str(path), "--dry-run"]) == 0
    table = capsys.readouterr().out
    assert "would run" in table and "trimmed" in table and "8 leaf cells dropped" in table
    code, out, _ = ctl(capsys, address, "config", "apply", str(path))
    done = json.loads(out)
    assert code == 0 and done["changed"] and done["groups"] == plan["groups"]
    code, out, _ = ctl(capsys, address, "status", "train")
    assert [pod["node"] for pod in json.loads(out)["pods"]] == ["", on[1]]
    code, out, _ = ctl(capsys, address, "config", "apply", str(path))
    assert code == 0 and json.loads(out)["changed"] is False
    # every replica runs the new configuration
    stores = [node.state_machine for node in nodes]
    assert all(isinstance(s, ClusterStore) for s in stores)
    leader = nodes[1].state_machine
    assert isinstance(leader, ClusterStore)
    assert leader.topology.digest.hex() == done["digest"]
    # an invalid file is refused before anything is proposed
    bad = tmp_path / "bad.yaml"
    bad.write_text("physicalCluster: {cellTypes: {}}\n")
    code, _, err = ctl(capsys, address, "config", "apply", str(bad))
    assert code == 1 and "physicalCells" in err
    # inspect over gRPC, JSON and tables
    code, out, _ = ctl(capsys, address, "inspect", "group", "train")
    assert code == 0 and json.loads(out)["physical_placement"] == {on[1]: list(range(8))}
    code, out, _ = ctl(capsys, address, "inspect", "vc", "vc00")
    assert code == 0 and json.loads(out)["vc"] == "vc00"
    code, out, _ = ctl(capsys, address, "inspect", "physical")
    assert code == 0 and json.loads(out)[0]["cells"]
    code, _, err = ctl(capsys, address, "inspect", "group", "nobody")
    assert code == 1 and "NOT_FOUND" in err
    assert main(["ctl", "--server", address, "inspect", "physical"]) == 0
    assert "physical cluster" in capsys.readouterr().out
    assert main(["ctl", "--server", address, "inspect", "vc", "vc00"]) == 0
    assert "virtual cluster vc00" in capsys.readouterr().out
    # a health report for a node the configuration does not know: ignored (the API answers
    # with a warning), which ctl reports as a refusal (issue 34: it exited 0)
    code, out, err = ctl(capsys, address, "node", on[0], "--bad")
    assert code == 1 and json.loads(out)["changed"] is False
    assert "unknown node" in json.loads(out)["error"] and "nothing changed" in err


def test_embedded_reconfigure_and_inspect(
    server: tuple[str, list[ReplicaNode], asyncio.AbstractEventLoop],
) -> None:
    _, nodes, loop = server

    async def scenario() -> None:
        store = AllocationStore.embedded(nodes[0])
        spec = GroupSpec(name="e", vc="vc01", priority=3, members=(Member(1, 8),))
        placed = await store.submit(spec)
        tree = await store.inspect("group", "e")
        assert tree["physical_placement"] == {placed.pods[0][1]: list(range(8))}
        text = synthetic_config(nodes=16, vcs=2, pinned=1).to_yaml()
        assert (await store.plan_reconfiguration(text))["changed"] is False
        same = await store.reconfigure(text)
        assert same.changed is False
        with pytest.raises(GpuConfigError):
            await store.reconfigure("physicalCluster: 1")
        with pytest.raises(ValueError, match="kind"):
            await store.inspect("trees")

    asyncio.run_coroutine_threadsafe(scenario(), loop).result(START_S)
