"""The store decides exactly what it decided when these recordings were made: long seeded
workloads (guaranteed, opportunistic, lazy and pinned gangs, preemption and reservations,
suggested nodes, conditional binds, claims, nodes failing and coming back,
reconfigurations) are replayed and every answer, every dry run, the read models and the
snapshot bytes are compared with digests recorded by an earlier build
(``golden/recorded_decisions.json``).

A refactor or an optimisation of the allocator must leave them all unchanged; a change that
means to decide differently records them again, and says why, with::

    PYTHONPATH=. python tests/cluster_state/test_recorded_decisions.py

Each workload's digests are taken every ``CHECKPOINT`` operations, so a mismatch names the
first stretch of operations where the decisions part."""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
from cs_helpers import MULTI_CHAIN_YAML
from reconfig_helpers import VARIANTS, variant

from cluster_state import ClusterStore, ops, parse_config, synthetic_config
from cluster_state.workload import next_job
from consensus.messages import Command

GOLDEN = Path(__file__).parent / "golden" / "recorded_decisions.json"
#: operations between two digests
CHECKPOINT = 100

#: priorities drawn for guaranteed groups: few, so equal priorities meet (no preemption)
#: as often as higher ones (preemption)
PRIORITIES = (0, 10, 100, 500, 1000)
#: gang shapes of the small configurations: (pods, leaves per pod)
SHAPES = (
    ((1, 1),), ((1, 1),), ((1, 2),), ((2, 1),), ((1, 4),), ((1, 8),), ((2, 4),),
    ((1, 2), (1, 1)), ((3, 1),), ((2, 2), (1, 4)), ((2, 8),), ((1, 3),),
)
#: a node name no configuration knows (suggested nodes may name it; health reports of it are
#: ignored with a warning)
UNKNOWN_NODE = "no-such-node"


@dataclass
class _Run:
    """One workload's store, log position and the digests taken so far."""

    store: ClusterStore
    rng: random.Random
    position: int = 0
    seq: int = 0
    names: int = 0
    window: Any = None
    digests: list[str] | None = None

    def __post_init__(self) -> None:
        self.window = hashlib.sha256()
        self.digests = []

    def apply(self, op: bytes) -> list[Any]:
        self.position += 1
        self.seq += 1
        out = self.store.apply(self.position, Command(client_id=1 + self.seq % 3,
                                                      seq=self.seq, op=op))
        self.window.update(op)
        self.window.update(out)
        result: list[Any] = msgpack.unpackb(out)
        return result

    def query(self, op: bytes) -> list[Any]:
        out = self.store.query(op)
        self.window.update(op)
        self.window.update(out)
        result: list[Any] = msgpack.unpackb(out)
        return result

    def new_name(self) -> str:
        self.names += 1
        return f"g{self.names}"

    def checkpoint(self) -> None:
        """Digest the window's answers with the read models and the snapshot bytes."""
        store = self.store
        self.query(ops.get_summary())
        self.query(ops.list_groups())
        for vc in store.topology.vcs:
            self.query(ops.get_vc(vc))
            self.query(ops.inspect("vc", vc))
        self.query(ops.inspect("physical"))
        for name in sorted(store.allocator.groups)[:5]:
            self.query(ops.get_group(name))
            self.query(ops.inspect("group", name))
        self.window.update(store.snapshot())
        assert self.digests is not None
        self.digests.append(self.window.hexdigest()[:16])
        self.window = hashlib.sha256()


def _suggested(run: _Run) -> list[str] | None:
    """No suggestion mostly; else some of the configured nodes (now and then an unknown
    one too, or all of them)."""
    rng, nodes = run.rng, sorted(run.store.topology.nodes)
    roll = rng.random()
    if roll < 0.7:
        return None
    if roll < 0.75:
        return nodes
    chosen = rng.sample(nodes, rng.randint(1, max(1, len(nodes) // 2)))
    if rng.random() < 0.2:
        chosen.append(UNKNOWN_NODE)
    return chosen


def _small_step(run: _Run, texts: dict[str, str]) -> None:
    """One operation on the two-chain configuration (and its reconfigured variants)."""
    rng, store = run.rng, run.store
    topo = store.topology
    vcs = list(topo.vcs)
    nodes = sorted(topo.nodes)
    groups = sorted(store.allocator.groups)
    roll = rng.random()
    if roll < 0.42 or not groups:
        vc = rng.choice(vcs)
        opportunistic = rng.random() < 0.15
        priority = -1 if opportunistic else rng.choice(PRIORITIES)
        pins = sorted(topo.vc_pinned.get(vc, {}))
        pinned = rng.choice(pins) if pins and not opportunistic and rng.random() < 0.2 else ""
        leaf_type = rng.choice(["", "", "V100", "K80"])
        members = rng.choice(SHAPES)
        args: dict[str, Any] = {"leaf_type": leaf_type, "pinned": pinned,
                                "lazy": rng.random() < 0.25, "suggested": _suggested(run)}
        name = run.new_name()
        if rng.random() < 0.15:  # a dry run first (HiveD's filtering phase)
            run.query(ops.plan_submit(name, vc, priority, members, **args))
        run.apply(ops.submit(name, vc, priority, members, **args))
    elif roll < 0.47:
        # a group submitted again: confirms a reservation, or is planned again inside
        # other suggested nodes
        spec = store.allocator.groups[rng.choice(groups)].spec
        name = spec.name
        run.apply(ops.submit(name, spec.vc, spec.priority, spec.members,
                             leaf_type=spec.leaf_type, pinned=spec.pinned, lazy=spec.lazy,
                             suggested=_suggested(run)))
    elif roll < 0.72:
        name = rng.choice(groups)
        if rng.random() < 0.2:
            incarnation = store.allocator.groups[name].created + rng.choice([0, 0, 1])
            run.apply(ops.release_if(name, incarnation))
        else:
            run.apply(ops.release(name))
        if rng.random() < 0.05:
            run.apply(ops.release(name))  # again: already released
    elif roll < 0.78:
        name = rng.choice(groups)
        group = store.allocator.groups[name]
        slot = rng.randrange(len(group.spec.pod_sizes) + 1)
        uid = f"uid-{rng.randrange(6)}"
        previous = rng.choice(["", "", "uid-0", "uid-1"])
        run.apply(ops.claim(name, group.created, slot, uid, f"ns/{uid}", previous))
    elif roll < 0.86:
        node = UNKNOWN_NODE if rng.random() < 0.05 else rng.choice(nodes)
        run.apply(ops.set_node_health(node, rng.random() < 0.55))
    elif roll < 0.96:
        # a conditional bind of some devices of one node (free or not: conflicts are
        # decisions too)
        node = rng.choice(nodes)
        devices = sorted({topo.device[leaf] for n in topo.nodes[node]
                          for leaf in topo.leaves[n]})
        count = rng.choice([1, 1, 2, 4])
        if count > len(devices):
            count = 1
        chosen = sorted(rng.sample(devices, count))
        vc = rng.choice(vcs)
        priority = -1 if rng.random() < 0.3 else rng.choice(PRIORITIES)
        since = max(-1, store.revision - rng.choice([0, 0, 5]))
        run.apply(ops.bind(run.new_name(), vc, priority, [(1, count)], [(node, chosen)], since))
    elif roll < 0.985:
        name = rng.choice(sorted(texts))
        if rng.random() < 0.3:
            run.query(ops.plan_reconfigure(texts[name]))
        run.apply(ops.reconfigure(texts[name]))
    else:
        run.apply(b"\x93\x01")  # garbage: an error, nothing changes


def small_workload(seed: int, steps: int) -> list[str]:
    texts = {name: variant(name) for name in VARIANTS}
    run = _Run(ClusterStore(parse_config(MULTI_CHAIN_YAML)), random.Random(seed))
    for step in range(1, steps + 1):
        _small_step(run, texts)
        if step % CHECKPOINT == 0:
            run.checkpoint()
    assert run.digests is not None
    return run.digests


def _synthetic_texts() -> list[str]:
    return [synthetic_config(nodes=n, vcs=8, pinned=2).to_yaml() for n in (64, 56, 72)]


def synthetic_workload(seed: int, steps: int) -> list[str]:
    """The alloc-e2e job mix on a 64-node cluster kept near full, so the second pass,
    preemption, spread gangs and lazy preemption all happen; nodes fail and come back and
    the cluster shrinks and grows now and then."""
    texts = _synthetic_texts()
    run = _Run(ClusterStore(parse_config(texts[0])), random.Random(seed))
    rng = run.rng
    live: list[str] = []
    for step in range(1, steps + 1):
        store = run.store
        vcs = list(store.topology.vcs)
        roll = rng.random()
        if roll < 0.03:
            node = rng.choice(sorted(store.topology.nodes))
            run.apply(ops.set_node_health(node, rng.random() < 0.6))
        elif roll < 0.035:
            run.apply(ops.reconfigure(rng.choice(texts)))
        elif roll < 0.45 and live:
            name = live.pop(rng.randrange(len(live)))
            if name in store.allocator.groups:
                run.apply(ops.release(name))
        else:
            job = next_job(rng, run.new_name(), vcs, mean_duration_s=1.0)
            lazy = rng.random() < 0.2
            result = run.apply(ops.submit(job.name, job.vc, job.priority, job.members,
                                          lazy=lazy, suggested=_suggested(run)))
            if result[0] in ("placed", "preempting"):
                live.append(job.name)
            if result[0] == "preempting" and rng.random() < 0.7:
                for victim in result[2]:  # what the victims' schedulers do
                    if victim in store.allocator.groups:
                        run.apply(ops.release(victim))
        if step % CHECKPOINT == 0:
            run.checkpoint()
    assert run.digests is not None
    return run.digests


#: name -> (workload, seed, steps)
WORKLOADS: dict[str, tuple[Callable[[int, int], list[str]], int, int]] = {
    "small-1": (small_workload, 1, 1500),
    "small-2": (small_workload, 2, 1500),
    "small-3": (small_workload, 3, 1500),
    "synthetic-1": (synthetic_workload, 1, 2000),
    "synthetic-2": (synthetic_workload, 2, 2000),
}


def _recorded() -> dict[str, list[str]]:
    recorded: dict[str, list[str]] = json.loads(GOLDEN.read_text())
    return recorded


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_decisions_are_the_recorded_ones(name: str) -> None:
    workload, seed, steps = WORKLOADS[name]
    expected = _recorded()[name]
    got = workload(seed, steps)
    assert len(got) == len(expected)
    for k, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert mine == theirs, (
            f"{name}: the decisions part within operations {k * CHECKPOINT + 1}.."
            f"{(k + 1) * CHECKPOINT} (answers, dry runs, read models or snapshot bytes)")


def _record() -> Iterator[tuple[str, list[str]]]:
    for name, (workload, seed, steps) in sorted(WORKLOADS.items()):
        yield name, workload(seed, steps)


if __name__ == "__main__":
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(dict(_record()), indent=1) + "\n")
    print(f"recorded {GOLDEN}", file=sys.stderr)
