"""``python -m bench.stall_processes``: ``bench.snapshot_stall``'s operations on real replica
processes, each replica's event loop alone in its process, as a deployment runs them.

``bench.snapshot_stall`` runs three replicas and the load on one event loop in one process: a
stall it measures is any replica's turn, the load's own work and the worker threads of all
three at once (the load alone stalls that loop ~40 ms at 98k GPUs). Here three ``sdpaxos
serve`` processes (fsync on, ``--fault-injection`` for the cut, a snapshot every ``--every``
commands) serve the GPU store on a ``synthetic_config`` cluster (``--nodes`` x 8 GPUs); this
process is the load, ``--outstanding`` scheduler sessions at replica 0 submitting and
releasing gangs, after filling the cluster to ``FILL`` of its GPUs. Then one phase per
operation, each ``--seconds`` of that load with the operation run meanwhile:

* ``load``: nothing more (what the others are compared with);
* ``install``: replica 2 cut off from its peers (``cut_off``, the test-only fault layer)
  until both took two snapshots since (their logs then no longer hold what it missed), then
  healed: it is sent a peer's snapshot and installs it;
* ``backup``: ``--repeat`` backups at replica 0 (``Client.backup``: ``sdpaxos snapshot save``);
* ``digest``: ``--repeat`` digest queries at replica 0 (``AllocationStore.digest``).

Per phase and replica: the longest loop stall in the phase, from the replica's own lag probe
(``sdpaxos_loop_stall_seconds``, scraped before and after: the lowest bucket bound under
which every stall of the phase fell, ``soak_samples.interval_stall``; 50 ms is a bound), the
longest garbage-collector pass likewise, per generation (``sdpaxos_gc_pause_seconds``), and
how long the operations took. Prints one JSON object.

    python -m bench.stall_processes [--nodes 12288 --vcs 64 --seconds 10 --outstanding 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.snapshot_stall import FILL, SHAPES  # the same fill and gang shapes
from bench.soak_samples import interval_stall
from cluster_state.client import AllocationStore
from cluster_state.config import synthetic_config
from cluster_state.demo import _wait_serving
from cluster_state.ops import GroupSpec, Member, Placed
from consensus.runtime.backup import BACKUP_CLIENT_ID
from consensus.runtime.client import Client, cut_off
from consensus.runtime.local_cluster import LocalCluster

__all__ = ["OPERATIONS", "measure"]

OPERATIONS = ("load", "install", "backup", "digest")
#: the replica cut off and made to install a snapshot
LAGGING = 2
#: how long the start, an operation, or a wait for snapshots may take at most
TIMEOUT_S = 300.0
#: seconds between two polls of a replica's metrics
POLL_S = 0.2


def _metrics(address: tuple[str, int]) -> dict[str, Any]:
    """The stall histogram's cumulative buckets (by ``le``) and the snapshot counters."""
    url = f"http://{address[0]}:{address[1]}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    found: dict[str, Any] = {"buckets": {}, "gc": {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sdpaxos_loop_stall_seconds_bucket":
                found["buckets"][sample.labels["le"]] = sample.value
            elif sample.name == "sdpaxos_gc_pause_seconds_bucket":
                found["gc"].setdefault(sample.labels["generation"], {})[
                    sample.labels["le"]] = sample.value
            elif sample.name in ("sdpaxos_snapshots_taken_total",
                                 "sdpaxos_snapshots_installed_total"):
                found[sample.name] = sample.value
    return found


class _Load:
    """Schedulers at replica 0: submit gangs, release them (a session each)."""

    def __init__(self, cluster: LocalCluster, vcs: int, outstanding: int) -> None:
        self.stores = [AllocationStore.connect(cluster.client_addresses, client_id=1000 + k,
                                               home=0, timeout_s=10.0)
                       for k in range(outstanding)]
        self.vcs = [f"vc{k:02d}" for k in range(vcs)]
        self.rng = random.Random(1)
        self.placed: list[tuple[str, int]] = []
        self.used = 0
        self.names = 0
        self.done = 0

    async def _submit(self, store: AllocationStore) -> None:
        self.names += 1
        name = f"g{self.names:08d}"
        members = self.rng.choice(SHAPES)
        spec = GroupSpec(name=name, vc=self.rng.choice(self.vcs),
                         priority=self.rng.randint(0, 1000),
                         members=tuple(Member(p, g) for p, g in members))
        if isinstance(await store.submit(spec), Placed):
            gpus = sum(p * g for p, g in members)
            self.placed.append((name, gpus))
            self.used += gpus
        self.done += 1

    async def _release(self, store: AllocationStore) -> None:
        name, gpus = self.placed.pop(self.rng.randrange(len(self.placed)))
        self.used -= gpus
        await store.release(name)
        self.done += 1

    async def fill(self, gpus: int) -> None:
        async def one(store: AllocationStore) -> None:
            while self.used < FILL * gpus:
                await self._submit(store)

        await asyncio.gather(*(one(store) for store in self.stores))

    async def churn(self, until: asyncio.Future[Any]) -> None:
        async def one(store: AllocationStore) -> None:
            while not until.done():
                if self.placed and self.rng.random() < 0.5:
                    await self._release(store)
                else:
                    await self._submit(store)

        await asyncio.gather(*(one(store) for store in self.stores))

    async def close(self) -> None:
        for store in self.stores:
            await store.close()


async def _poll(metrics: list[tuple[str, int]], done: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not done(await asyncio.gather(*(asyncio.to_thread(_metrics, m) for m in metrics))):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {TIMEOUT_S:g} s")
        await asyncio.sleep(POLL_S)


async def _install(cluster: LocalCluster, metrics: list[tuple[str, int]]) -> None:
    """Cut replica ``LAGGING`` off until both peers took two snapshots (the second compacts
    their logs to the first, taken after the cut), heal, wait for its install."""
    addresses = cluster.client_addresses
    others = [r for r in range(3) if r != LAGGING]
    before = await asyncio.gather(*(asyncio.to_thread(_metrics, m) for m in metrics))
    taken = [before[r]["sdpaxos_snapshots_taken_total"] for r in range(3)]
    installed = before[LAGGING]["sdpaxos_snapshots_installed_total"]
    await cut_off(addresses[LAGGING], others)
    for r in others:
        await cut_off(addresses[r], [LAGGING])
    await _poll(metrics, lambda now: all(now[r]["sdpaxos_snapshots_taken_total"] >= taken[r] + 2
                                         for r in others), "the peers' two snapshots")
    for r in range(3):
        await cut_off(addresses[r], [])
    await _poll(metrics, lambda now: now[LAGGING]["sdpaxos_snapshots_installed_total"]
                > installed, "replica 2's install of a peer's snapshot")


async def _phase(name: str, cluster: LocalCluster, load: _Load, seconds: float,
                 repeat: int) -> dict[str, Any]:
    metrics = [spec.metrics_address for spec in cluster.config.replicas]
    assert all(m is not None for m in metrics)
    targets = [m for m in metrics if m is not None]
    before = await asyncio.gather(*(asyncio.to_thread(_metrics, m) for m in targets))
    durations: list[float] = []

    async def operate() -> None:
        started = time.monotonic()
        if name == "install":
            await _install(cluster, targets)
            durations.append(time.monotonic() - started)
        elif name in ("backup", "digest"):
            client = Client(BACKUP_CLIENT_ID, [cluster.client_addresses[0]], timeout_s=TIMEOUT_S)
            store = AllocationStore.connect(cluster.client_addresses, client_id=999, home=0,
                                            timeout_s=TIMEOUT_S)
            try:
                for _ in range(repeat):
                    started = time.monotonic()
                    if name == "backup":
                        await client.backup()
                    else:
                        await store.digest()
                    durations.append(time.monotonic() - started)
            finally:
                await client.close()
                await store.close()
        await asyncio.sleep(seconds)  # and the load goes on a phase's length after it

    done_before = load.done
    began = time.monotonic()
    operation = asyncio.ensure_future(operate())
    await load.churn(operation)
    await operation
    elapsed = time.monotonic() - began
    after = await asyncio.gather(*(asyncio.to_thread(_metrics, m) for m in targets))
    pairs = list(zip(before, after, strict=True))
    stalls = [interval_stall(b["buckets"], a["buckets"]) for b, a in pairs]
    pauses = [{g: p for g in sorted(a["gc"])
               if (p := interval_stall(b["gc"].get(g, {}), a["gc"][g])) is not None}
              for b, a in pairs]
    return {
        "operation": name,
        "count": len(durations),
        "took_ms": [round(d * 1e3, 1) for d in durations],
        "longest_stall_at_most_ms": [None if s is None else round(s * 1e3, 1) for s in stalls],
        "longest_gc_pause_at_most_ms": [{g: round(p * 1e3, 2) for g, p in by_gen.items()}
                                        for by_gen in pauses],
        "scheduler_ops_per_s": round((load.done - done_before) / elapsed),
    }


async def _measure(nodes: int, vcs: int, seconds: float, every: int, outstanding: int,
                   repeat: int, operations: tuple[str, ...], directory: Path) -> dict[str, Any]:
    (directory / "gpu.yaml").write_text(
        synthetic_config(nodes=nodes, vcs=vcs, pinned=vcs // 4).to_yaml())
    cluster = LocalCluster(directory, 3,
                           state_machine='kind = "cluster_state"\ngpu_config = "gpu.yaml"',
                           extra_args=("--fault-injection", "--snapshot-every", str(every)))
    began = time.monotonic()
    cluster.start_all()
    try:
        await _wait_serving(cluster, timeout=TIMEOUT_S)
        startup_s = time.monotonic() - began
        load = _Load(cluster, vcs, outstanding)
        try:
            began = time.monotonic()
            await load.fill(nodes * 8)
            fill_s = time.monotonic() - began
            phases = [await _phase(name, cluster, load, seconds, repeat) for name in operations]
        finally:
            await load.close()
    finally:
        cluster.stop_all()
    return {"cluster": {"nodes": nodes, "gpus": nodes * 8, "vcs": vcs,
                        "startup_s": round(startup_s, 1), "fill_s": round(fill_s, 1),
                        "groups": len(load.placed)},
            "every": every, "outstanding": outstanding, "seconds": seconds,
            "phases": phases}


def measure(nodes: int = 12288, vcs: int = 64, seconds: float = 10.0, every: int = 2000,
            outstanding: int = 32, repeat: int = 5,
            operations: tuple[str, ...] = OPERATIONS) -> dict[str, Any]:
    """Start the replicas, run the phases, stop them; the report as a JSON-able dict."""
    with tempfile.TemporaryDirectory(prefix="stall-processes-") as tmp:
        return asyncio.run(_measure(nodes, vcs, seconds, every, outstanding, repeat,
                                    operations, Path(tmp)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stall_processes",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=12288, help="8-GPU nodes")
    parser.add_argument("--vcs", type=int, default=64, help="virtual clusters")
    parser.add_argument("--seconds", type=float, default=10.0, help="load per phase")
    parser.add_argument("--every", type=int, default=2000, help="commands per snapshot")
    parser.add_argument("--outstanding", type=int, default=32, help="scheduler sessions")
    parser.add_argument("--repeat", type=int, default=5, help="backups and digests per phase")
    parser.add_argument("--operations", default=",".join(OPERATIONS),
                        help=f"comma list of {', '.join(OPERATIONS)}")
    args = parser.parse_args(argv)
    chosen = tuple(name for name in args.operations.split(",") if name)
    unknown = set(chosen) - set(OPERATIONS)
    if unknown:
        parser.error(f"--operations: unknown {', '.join(sorted(unknown))}")
    if min(args.nodes, args.vcs, args.every, args.outstanding, args.repeat) < 1 or (
            args.seconds <= 0):
        parser.error("--nodes, --vcs, --every, --outstanding, --repeat and --seconds must be "
                     "positive")
    print(json.dumps(measure(args.nodes, args.vcs, args.seconds, args.every, args.outstanding,
                             args.repeat, chosen)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
