"""How long a replica's snapshots hold its event loop, under load, at 100k GPUs.

Three ``ReplicaNode``s in this process (one event loop, fsync on, no WAN emulation), each with
its own ``ClusterStore`` on a ``synthetic_config`` cluster (``--nodes`` x 8 GPUs), are first
filled through the log to ``FILL`` of their GPUs; then, for ``--phases`` phases of
``--seconds`` each and a last one, ``--outstanding`` clients submit gangs and release them (a
snapshot falls due every ``--every`` commands at each replica) while a probe task sleeps 1 ms
again and again and records how late it wakes: the event loop's stalls. The phases
alternate the first two variants in one sitting, and one phase of the third ends the run (a
snapshot after a phase without any compacts the core's whole phase of log at once, the same
in either variant):

* ``off_loop``: the snapshot captured on the loop, written by the replica's snapshot thread
  (``consensus.runtime.snapshot_writer``), installed on the loop;
* ``on_loop``: the whole snapshot on the loop (``snapshot_off_loop=False``: the node before);
* ``none``: no snapshot falls due (the stalls the load alone makes).

Reported per phase: snapshots taken, the longest a snapshot held the loop at once
(``NodeStats.longest_snapshot_hold_s``: capture or install; on_loop: all of it), the most CPU
time of the loop's thread in one (``longest_snapshot_cpu_s``: on a busy machine the wall time
is mostly waiting for a CPU), the longest rewrite of the write-ahead log in one
(``longest_log_rewrite_s``: its fsyncs), the longest loop turn of a replica (the load's own
work), the probe's lateness (p50/p99/max, ms) and the commands applied per second. The
collector runs as ``sdpaxos serve`` runs it (thresholds, everything built before the phases
frozen). The three replicas share one loop, so the probe sees every replica's stalls and the
load's own turns as well.

    python -m bench.snapshot_stall [--nodes 12288 --vcs 64 --seconds 10 --phases 6]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from cluster_state import ClusterStore, GpuConfigError, release, submit, synthetic_config
from cluster_state.gc_pause import gc_paused
from consensus.messages import Command
from consensus.runtime.cli import SERVE_GC_THRESHOLDS, cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode

__all__ = ["run"]

#: the exit status of a usage error (argparse's)
USAGE_ERROR = 2
#: the stores are filled to this fraction of their GPUs before the phases
FILL = 0.8
#: the probe's sleep (seconds): its lateness is the loop's stall
PROBE_S = 0.001
#: the variants the phases alternate, and the one of the last phase
VARIANTS = ("off_loop", "on_loop")
LAST_VARIANT = "none"
#: a snapshot never falls due in the ``none`` phases (commands)
NEVER = 10**12
#: gang shapes (pods, GPUs per pod) the clients submit
SHAPES = [[(1, 1)], [(1, 2)], [(1, 4)], [(1, 8)], [(2, 8)], [(4, 8)]]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


class _Load:
    """Clients that submit gangs through one replica and release what was placed."""

    def __init__(self, node: ReplicaNode, vcs: list[str], seed: int) -> None:
        self.node, self.vcs, self.rng = node, vcs, random.Random(seed)
        self.seq = 0
        self.names = 0
        self.placed: list[tuple[str, int]] = []  # (group, GPUs)
        self.used = 0

    async def _command(self, client: int, op: bytes) -> list[Any]:
        self.seq += 1
        result = await self.node.submit(Command(client_id=client, seq=self.seq, op=op))
        answer: list[Any] = msgpack.unpackb(result.value)
        return answer

    async def submit_one(self, client: int) -> None:
        self.names += 1
        name = f"g{self.names:08d}"
        members = self.rng.choice(SHAPES)
        op = submit(name, self.rng.choice(self.vcs), self.rng.randint(0, 1000), members)
        answer = await self._command(client, op)
        if answer[0] == "placed":
            gpus = sum(p * n for p, n in members)
            self.placed.append((name, gpus))
            self.used += gpus

    async def release_one(self, client: int) -> None:
        name, gpus = self.placed.pop(self.rng.randrange(len(self.placed)))
        self.used -= gpus
        await self._command(client, release(name))

    async def fill(self, gpus: int, outstanding: int) -> None:
        async def client(c: int) -> None:
            while self.used < FILL * gpus:
                await self.submit_one(c)

        await asyncio.gather(*(client(c) for c in range(outstanding)))

    async def churn(self, seconds: float, outstanding: int) -> None:
        deadline = time.monotonic() + seconds

        async def client(c: int) -> None:
            while time.monotonic() < deadline:
                if self.placed and self.rng.random() < 0.5:
                    await self.release_one(c)
                else:
                    await self.submit_one(c)

        await asyncio.gather(*(client(c) for c in range(outstanding)))


async def _probe(lateness: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        due = time.perf_counter() + PROBE_S
        await asyncio.sleep(PROBE_S)
        lateness.append(time.perf_counter() - due)


async def _measure(nodes: int, vcs: int, seconds: float, phases: int, every: int,
                   outstanding: int, directory: Path) -> dict[str, Any]:
    config = synthetic_config(nodes=nodes, vcs=vcs, pinned=vcs // 4)
    # the collector as ``sdpaxos serve`` runs it: young objects as usual, old ones rarely,
    # and what is built at start frozen out of its way (full passes over three 100k-GPU
    # stores otherwise stall the loop for a second, whatever the snapshots)
    gc.set_threshold(*SERVE_GC_THRESHOLDS)
    started = time.perf_counter()
    with gc_paused():
        stores = [ClusterStore(config) for _ in range(3)]  # one topology, shared
    build_s = time.perf_counter() - started
    cluster_file = directory / "cluster.toml"
    cluster_file.write_text(cluster_toml(3, free_base_port(), wan=False, cluster_id="snapstall"))
    cluster = load_cluster_config(cluster_file)
    replicas = [ReplicaNode(cluster, i, stores[i], snapshot_every=NEVER) for i in range(3)]
    for replica in replicas:
        await replica.start()
    load = _Load(replicas[0], [vc.name for vc in config.virtual_clusters], seed=1)
    try:
        started = time.perf_counter()
        await load.fill(nodes * 8, outstanding)
        fill_s = time.perf_counter() - started
        gc.collect()
        gc.freeze()
        results = []
        for phase in range(phases + 1):
            variant = VARIANTS[phase % len(VARIANTS)] if phase < phases else LAST_VARIANT
            for replica in replicas:
                replica.snapshot_every = NEVER if variant == "none" else every
                replica.snapshot_off_loop = variant == "off_loop"
                replica.stats.longest_snapshot_hold_s = 0.0
                replica.stats.longest_log_rewrite_s = 0.0
                replica.stats.longest_snapshot_cpu_s = 0.0
                replica.stats.longest_turn_s = 0.0
            taken = sum(r.stats.snapshots_taken for r in replicas)
            applied = replicas[0].stats.commands_applied
            lateness: list[float] = []
            stop = asyncio.Event()
            probe = asyncio.create_task(_probe(lateness, stop))
            began = time.perf_counter()
            await load.churn(seconds, outstanding)
            elapsed = time.perf_counter() - began
            stop.set()
            await probe
            results.append({
                "variant": variant,
                "snapshots": sum(r.stats.snapshots_taken for r in replicas) - taken,
                "longest_snapshot_hold_ms": round(
                    max(r.stats.longest_snapshot_hold_s for r in replicas) * 1e3, 1),
                "longest_snapshot_cpu_ms": round(
                    max(r.stats.longest_snapshot_cpu_s for r in replicas) * 1e3, 1),
                "longest_log_rewrite_ms": round(
                    max(r.stats.longest_log_rewrite_s for r in replicas) * 1e3, 1),
                "longest_turn_ms": round(max(r.stats.longest_turn_s for r in replicas) * 1e3, 1),
                "stall_p50_ms": round(_percentile(lateness, 0.5) * 1e3, 2),
                "stall_p99_ms": round(_percentile(lateness, 0.99) * 1e3, 1),
                "stall_max_ms": round(max(lateness, default=0.0) * 1e3, 1),
                "applied_per_s": round((replicas[0].stats.commands_applied - applied) / elapsed),
            })
        snapshot_bytes = len(stores[0].snapshot())
    finally:
        for replica in replicas:
            replica.snapshot_on_stop = False
            await replica.stop()
    return {
        "cluster": {"nodes": nodes, "gpus": nodes * 8, "vcs": vcs, "build_s": round(build_s, 2),
                    "groups": len(load.placed), "fill_s": round(fill_s, 1),
                    "snapshot_bytes": snapshot_bytes},
        "every": every,
        "outstanding": outstanding,
        "phases": results,
    }


def run(nodes: int = 12288, vcs: int = 64, seconds: float = 10.0, phases: int = 6,
        every: int = 2000, outstanding: int = 32) -> dict[str, Any]:
    """Run the phases; return the measurements as a JSON-able dict."""
    with tempfile.TemporaryDirectory(prefix="snapshot-stall-") as directory:
        return asyncio.run(_measure(nodes, vcs, seconds, phases, every, outstanding,
                                    Path(directory)))


def check_arguments(args: argparse.Namespace) -> str | None:
    """What makes these parameters impossible (one line), or None."""
    if min(args.nodes, args.vcs, args.phases, args.every, args.outstanding) < 1:
        return "--nodes, --vcs, --phases, --every and --outstanding must be positive"
    if args.seconds <= 0:
        return f"--seconds must be positive, not {args.seconds}"
    try:
        synthetic_config(nodes=args.nodes, vcs=args.vcs, pinned=args.vcs // 4)
    except GpuConfigError as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=12288)
    parser.add_argument("--vcs", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--phases", type=int, default=6)
    parser.add_argument("--every", type=int, default=2000)
    parser.add_argument("--outstanding", type=int, default=32)
    args = parser.parse_args(argv)
    problem = check_arguments(args)
    if problem is not None:
        print(f"snapshot_stall: error: {problem}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR)
    print(json.dumps(run(args.nodes, args.vcs, args.seconds, args.phases, args.every,
                         args.outstanding), indent=2))


if __name__ == "__main__":
    main()
