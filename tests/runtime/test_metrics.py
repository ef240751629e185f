"""The Prometheus text a replica node serves (``consensus.runtime.metrics``)."""

from __future__ import annotations

from pathlib import Path

from consensus.messages import OAccept, OAck, OEntry
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.metrics import render
from consensus.runtime.node import ReplicaNode
from consensus.statemachine import KVStore


def _metric(text: str, name: str) -> float:
    (value,) = [line.split()[1] for line in text.splitlines() if line.split()[0] == name]
    return float(value)


def test_c_instance_recoveries_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    node = ReplicaNode(load_cluster_config(path), 1, KVStore(), fsync=False)
    assert _metric(render(node), "sdpaxos_c_recoveries_total") == 0
    # slot 0 names index 0 of ours, which we never proposed (lost in a crash, say): execution
    # waits for it, so we recover it ourselves
    core = node.core
    core.info = ""  # (it publishes no addresses: its own first C-instance would be that)
    core.step(OAccept(src=0, view=0, entries=(OEntry(slot=0, owner=1),)), 1)
    core.step(OAck(src=0, view=0, slots=(0,)), 1)  # the sequencer's, once durable: chosen
    now = 0
    while _metric(render(node), "sdpaxos_c_recoveries_total") == 0:
        now += 50_000
        assert now < 2_000_000, "no recovery"
        core.tick(now)
        core.advance(core.ready())
    assert _metric(render(node), "sdpaxos_c_recoveries_total") == 1
