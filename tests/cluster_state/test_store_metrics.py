"""The GPU store's families on its replica's ``/metrics`` (``cluster_state.metrics``, through
``StateMachineKind.metrics``), after real allocations through a 3-replica cluster."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from test_watch_pushed import _until

from cluster_state.config import load_config, synthetic_config
from cluster_state.ops import Placed, Preempting, Waiting, decode_result, submit
from cluster_state.store import ClusterStore
from consensus.messages import Command
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.metrics import metrics_of, render
from consensus.runtime.node import ReplicaNode

GPUS_PER_NODE = 8


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("sdpaxos_store_")
        for s in family.samples
    }


def helps(text: str) -> dict[str, str]:
    return {family.name: family.documentation for family in text_string_to_metric_families(text)
            if family.name.startswith("sdpaxos_store_")}


async def scenario(tmp_path: Path) -> None:
    (tmp_path / "gpu.yaml").write_text(synthetic_config(nodes=16, vcs=2).to_yaml())
    text = cluster_toml(3, free_base_port(), wan=False)
    text += '\n[state_machine]\nkind = "cluster_state"\ngpu_config = "gpu.yaml"\n'
    (tmp_path / "cluster.toml").write_text(text)
    config = load_cluster_config(tmp_path / "cluster.toml")
    nodes = [ReplicaNode(config, i, ClusterStore(load_config(tmp_path / "gpu.yaml")),
                         fsync=False) for i in range(3)]
    for node in nodes:
        metrics_of(node)  # before it starts, as serve_metrics does: every apply is counted
        await node.start()
    seq = 0

    async def run(op: bytes) -> object:
        nonlocal seq
        seq += 1
        result = await nodes[0].submit(Command(client_id=7, seq=seq, op=op))
        return decode_result(result.value)

    try:
        store = nodes[0].state_machine
        assert isinstance(store, ClusterStore)
        vc00 = store.allocator.vc_info("vc00")
        quota = int(vc00["leaves"]["total"])
        # its whole nodes (the rest of its quota is smaller cells)
        whole = sum(level["cells"] for level in vc00["cells"]
                    if level["cell_type"].endswith("-NODE"))
        assert isinstance(await run(submit("a", "vc00", 10, [(2, GPUS_PER_NODE)])), Placed)
        assert isinstance(await run(submit("o", "vc01", -1, [(1, 4)])), Placed)
        # all of vc00's nodes at the same priority: no room now
        assert isinstance(await run(submit("w", "vc00", 10, [(whole, GPUS_PER_NODE)])), Waiting)
        # ... at a higher one: it preempts "a" and reserves all those nodes meanwhile
        assert isinstance(await run(submit("p", "vc00", 20, [(whole, GPUS_PER_NODE)])),
                          Preempting)
        # the other replicas apply the same commands and count the same: once each has
        # applied as far as replica 0, all three are read in one turn (a log-time command
        # applied between two reads would move the revision of one of them only)
        stores = [node.state_machine for node in nodes]
        await _until(lambda: len({s.applied_position for s in stores}) == 1)  # type: ignore[attr-defined]
        got = samples(render(nodes[0]))
        peers = [samples(render(node)) for node in nodes[1:]]
        documented = helps(render(nodes[0]))
        every_name = {name for family in text_string_to_metric_families(render(nodes[0]))
                      for name in (family.name, *(s.name for s in family.samples))}
    finally:
        for node in nodes:
            await node.stop()

    assert all(documented.values()) and len(documented) == 8, documented

    def gpus(vc: str, state: str) -> float:
        return got[("sdpaxos_store_vc_gpus", (("state", state), ("vc", vc)))]

    def groups(vc: str, state: str) -> float:
        return got[("sdpaxos_store_groups", (("state", state), ("vc", vc)))]

    assert gpus("vc00", "quota") == quota > 2 * GPUS_PER_NODE
    assert gpus("vc00", "used") == 2 * GPUS_PER_NODE  # "a", until it is released
    # "p" reserves its victim's leaves and the rest of the nodes: the smaller cells are free
    assert gpus("vc00", "reserved") == whole * GPUS_PER_NODE
    assert gpus("vc00", "free") == quota - whole * GPUS_PER_NODE > 0
    assert gpus("vc01", "opportunistic") == 4 and gpus("vc01", "used") == 0
    assert gpus("vc01", "free") == gpus("vc01", "quota") > 0
    assert groups("vc00", "placed") == 1 and groups("vc00", "preempting") == 1
    assert groups("vc01", "placed") == 1 and groups("vc00", "reserved") == 0
    assert got[("sdpaxos_store_preemptions_total", ())] == 1
    assert got[("sdpaxos_store_preempted_groups_total", ())] == 1
    assert got[("sdpaxos_store_waiting_total", ())] == 1
    assert got[("sdpaxos_store_downgrades_total", ())] == 0
    assert got[("sdpaxos_store_bad_nodes", ())] == 0
    assert got[("sdpaxos_store_revision", ())] >= 0
    for other in peers:
        assert other == got
    # the README's operations section names only families a replica of the store serves
    # ("sdpaxos_client_connections_*": a prefix; the key-value store's own is not served here)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Operating a cluster", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(sdpaxos_[a-z_]+)", section)) - {"sdpaxos_kv_keys"}
    assert len(named) > 20, named
    missing = [name for name in named
               if not any(have == name or (name.endswith("_") and have.startswith(name))
                          for have in every_name)]
    assert not missing, missing


def test_store_families_after_allocations(tmp_path: Path) -> None:
    asyncio.run(asyncio.wait_for(scenario(tmp_path), 60))
