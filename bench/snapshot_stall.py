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

Then one phase per operation of ``--operations`` (default all four), each ``--seconds``
under the same load, the replicas' own snapshots falling due as in ``off_loop``:

* ``load``: nothing more (the stalls the load and the replicas' own snapshots make, which
  the others are compared with);
* ``install``: replica 2 cut off from its peers (the transport's test-only ``drop_from``
  and ``drop_to``) until their logs no longer hold what it missed (compacted past it), then
  let back: it is sent replica 0's (or 1's) snapshot and installs it
  (``SnapshotPipeline.install``: state built by the worker thread);
* ``backup``: ``--repeat`` backups of replica 0 through its client port (``Client.backup``,
  what ``sdpaxos snapshot save`` does);
* ``digest``: ``--repeat`` digest queries (``AllocationStore.digest``) at replica 0.

Reported per operation: how many ran and how long each took (wall, p50/max), the longest
stall of the event loop by the replicas' own probe (``NodeStats.longest_stall_s``, the
``sdpaxos_loop_stall_longest_seconds`` metric: the most of any replica, over the phase; 20 ms
resolution), the longest loop turn and snapshot hold of any replica, the bench probe's
lateness as above, and ``on_loop_ms``: what the same work
costs when run whole at once (timed here on replica 0's store, as the loop ran it before:
``restore``, ``snapshot`` with encoding and sha256, ``query(get_digest())``).

    python -m bench.snapshot_stall [--nodes 12288 --vcs 64 --seconds 10 --phases 6]
    python -m bench.snapshot_stall --phases 0 --operations load,install,backup,digest
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from cluster_state import ClusterStore, GpuConfigError, release, submit, synthetic_config
from cluster_state.client import AllocationStore
from cluster_state.gc_pause import freeze, gc_paused
from cluster_state.ops import get_digest
from consensus.messages import Command
from consensus.runtime.backup import BACKUP_CLIENT_ID
from consensus.runtime.cli import SERVE_GC_THRESHOLDS, cluster_toml
from consensus.runtime.client import Client
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.runtime.turns import LAG_PROBE_S
from consensus.storage.snapshot import encode_snapshot

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
#: the operations measured after the snapshot phases (``--operations``)
OPERATIONS = ("load", "install", "backup", "digest")
#: the replica cut off (until its peers compacted their logs past it) and then sent a
#: snapshot to install
LAGGING = 2
#: the longest any operation may take before the phase gives up on it (seconds)
OPERATION_TIMEOUT_S = 120.0
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

    async def churn(self, seconds: float, outstanding: int,
                    busy: asyncio.Future[Any] | None = None) -> None:
        """Submit and release for ``seconds``, and on while ``busy`` is not done."""
        deadline = time.monotonic() + seconds

        def going() -> bool:
            return time.monotonic() < deadline or (busy is not None and not busy.done())

        async def client(c: int) -> None:
            while going():
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
                   outstanding: int, directory: Path, chosen: tuple[str, ...] = OPERATIONS,
                   repeat: int = 5) -> dict[str, Any]:
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
        freeze()
        results = []
        for phase in range(phases + 1 if phases else 0):
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
        operations = [
            await _operation_phase(name, replicas, load, seconds, outstanding, every, repeat)
            for name in chosen
        ]
        for done in operations:  # (after them all: each holds the loop seconds at 98k GPUs)
            if done["operation"] != "load":
                done["on_loop_ms"] = _on_loop_ms(done["operation"], replicas[0])
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
        "operations": operations,
    }


async def _until(done: Any, what: str) -> None:
    deadline = time.monotonic() + OPERATION_TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {OPERATION_TIMEOUT_S:g} s")
        await asyncio.sleep(0.01)


async def _install_once(replicas: list[ReplicaNode]) -> float:
    """Cut replica ``LAGGING`` off until its peers took ``SNAPSHOTS_MISSED`` snapshots, let
    it back; seconds from then until it installed one of theirs."""
    lagging = replicas[LAGGING]
    others = [r for r in replicas if r is not lagging]
    installed = lagging.stats.snapshots_installed
    cut = frozenset(r.me for r in others)
    lagging.transport.drop_from = lagging.transport.drop_to = cut
    for replica in others:
        replica.transport.drop_from = replica.transport.drop_to = frozenset({lagging.me})
    frontier = lagging.core.exec_slot

    def compacted_past() -> bool:  # their logs no longer hold what it missed
        cores = [r.sdpaxos for r in others]
        return all(core is not None and core.compacted > frontier for core in cores)

    await _until(compacted_past, "the peers' compaction while replica 2 is cut off")
    started = time.perf_counter()
    for replica in replicas:
        replica.transport.drop_from = replica.transport.drop_to = frozenset()
    await _until(lambda: lagging.stats.snapshots_installed > installed,
                 "replica 2's install of a peer's snapshot")
    return time.perf_counter() - started


def _on_loop_ms(name: str, node: ReplicaNode) -> float:
    """What ``name``'s work costs run whole at once, as the loop ran it before (ms, the
    median of three): the state built from a snapshot (not adopted), a backup's encoding
    and hashing, a digest query."""
    store = node.state_machine
    assert isinstance(store, ClusterStore)
    data = store.snapshot()
    costs = []
    for _ in range(3):
        started = time.perf_counter()
        if name == "install":
            store.prepare_restore(data)
        elif name == "backup":
            hashlib.sha256(encode_snapshot(node.core.snapshot_meta(), store.snapshot()))
        else:
            store.query(get_digest())
        costs.append(time.perf_counter() - started)
    return round(_percentile(costs, 0.5) * 1e3, 1)


async def _operation_phase(name: str, replicas: list[ReplicaNode], load: _Load,
                           seconds: float, outstanding: int, every: int,
                           repeat: int) -> dict[str, Any]:
    """``--seconds`` of the load with ``name`` run meanwhile (see the module's header)."""
    for replica in replicas:
        replica.snapshot_every = every
        replica.snapshot_off_loop = True
    # the replicas' lag probes measure across what held the loop before the phase (the
    # fill's collection, say): their next wake-ups are let pass before they count
    await asyncio.sleep(2 * LAG_PROBE_S)
    for replica in replicas:
        replica.stats.longest_stall_s = 0.0
        replica.stats.longest_turn_s = 0.0
        replica.stats.longest_snapshot_hold_s = 0.0
    home = replicas[0]
    durations: list[float] = []

    async def drive() -> None:
        if name == "load":  # the load alone: what the others are compared with
            return
        if name == "install":
            durations.append(await _install_once(replicas))
            return
        client = Client(BACKUP_CLIENT_ID, [home.config.replica(home.me).client_address],
                        timeout_s=OPERATION_TIMEOUT_S)
        store = AllocationStore.embedded(home)
        try:
            for _ in range(repeat):
                started = time.perf_counter()
                if name == "backup":
                    await client.backup()
                else:
                    await store.digest()
                durations.append(time.perf_counter() - started)
        finally:
            await client.close()

    lateness: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe(lateness, stop))
    driving = asyncio.ensure_future(drive())
    await load.churn(seconds, outstanding, busy=driving)
    await driving
    stop.set()
    await probe
    return {
        "operation": name,
        "count": len(durations),
        "took_p50_ms": round(_percentile(durations, 0.5) * 1e3, 1),
        "took_max_ms": round(max(durations, default=0.0) * 1e3, 1),
        "loop_stall_longest_ms": round(
            max(r.stats.longest_stall_s for r in replicas) * 1e3, 1),
        "longest_turn_ms": round(max(r.stats.longest_turn_s for r in replicas) * 1e3, 1),
        "longest_snapshot_hold_ms": round(
            max(r.stats.longest_snapshot_hold_s for r in replicas) * 1e3, 1),
        "stall_p99_ms": round(_percentile(lateness, 0.99) * 1e3, 1),
        "stall_max_ms": round(max(lateness, default=0.0) * 1e3, 1),
    }


def run(nodes: int = 12288, vcs: int = 64, seconds: float = 10.0, phases: int = 6,
        every: int = 2000, outstanding: int = 32, operations: tuple[str, ...] = OPERATIONS,
        repeat: int = 5) -> dict[str, Any]:
    """Run the phases; return the measurements as a JSON-able dict."""
    with tempfile.TemporaryDirectory(prefix="snapshot-stall-") as directory:
        return asyncio.run(_measure(nodes, vcs, seconds, phases, every, outstanding,
                                    Path(directory), operations, repeat))


def check_arguments(args: argparse.Namespace) -> str | None:
    """What makes these parameters impossible (one line), or None."""
    if min(args.nodes, args.vcs, args.every, args.outstanding, args.repeat) < 1:
        return "--nodes, --vcs, --every, --outstanding and --repeat must be positive"
    if args.phases < 0:
        return f"--phases must be 0 or more, not {args.phases}"
    unknown = set(_operations(args.operations)) - set(OPERATIONS)
    if unknown:
        return f"--operations: unknown {', '.join(sorted(unknown))} (of {', '.join(OPERATIONS)})"
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
    parser.add_argument("--operations", default=",".join(OPERATIONS),
                        help="comma list of the operation phases (empty: none)")
    parser.add_argument("--repeat", type=int, default=5,
                        help="backups and digests taken in their phase")
    args = parser.parse_args(argv)
    problem = check_arguments(args)
    if problem is not None:
        print(f"snapshot_stall: error: {problem}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR)
    print(json.dumps(run(args.nodes, args.vcs, args.seconds, args.phases, args.every,
                         args.outstanding, _operations(args.operations), args.repeat),
                     indent=2))


def _operations(text: str) -> tuple[str, ...]:
    return tuple(name for name in (part.strip() for part in text.split(",")) if name)


if __name__ == "__main__":
    main()
