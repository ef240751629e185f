"""``sdpaxos bench alloc-e2e``: allocations per second through replicated GPU store processes.

Three (or five) replica processes on loopback, fsync on, serving the allocation store on a
1,024-node x 8-GPU cluster with 16 virtual clusters. A scheduler per site (one session with
its own site's replica, in this process) keeps ``outstanding`` jobs in flight: submit a gang
from the demo's job mix (``cluster_state.workload``), release it as soon as the store answers.
Counted: placements per second (each also costs a release through the log, so the log runs
twice as many commands), and the submit latency. At the end every group must be gone and every
replica must hold the same state (snapshot hashes), or the report says so. The replicas' WAN
emulation is off unless ``wan``.

    python -m bench.alloc_e2e [--seconds 10] [--outstanding 64]   # prints one JSON object
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "measure", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, choices=(3, 5), default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--outstanding", type=int, default=64,
                        help="jobs in flight per site (below the session window of 256)")
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--vcs", type=int, default=16)
    parser.add_argument("--wan", action="store_true", help="emulate the paper's WAN delays")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    """The ``sdpaxos bench`` entry point: measure, print, exit 0 if the end state checks out."""
    report = measure(args.replicas, args.seconds, args.outstanding, nodes=args.nodes,
                     vcs=args.vcs, wan=args.wan, seed=args.seed)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['allocations_per_s']:.0f} allocations/s through {args.replicas} replicas "
              f"({report['placed']} placed of {report['submitted']} submitted in "
              f"{report['seconds']:.1f}s); submit latency p50 {report['p50_ms']:.1f} ms, "
              f"p99 {report['p99_ms']:.1f} ms; replicas identical: "
              f"{report['replicas_identical']}")
    return 0 if report["ok"] else 1


def measure(replicas: int = 3, seconds: float = 10.0, outstanding: int = 64, *,
            nodes: int = 1024, vcs: int = 16, wan: bool = False,
            seed: int = 1) -> dict[str, Any]:
    """Start the replicas, run the load for ``seconds``, stop them; the report as a dict."""
    from cluster_state.config import synthetic_config
    from consensus.runtime.local_cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="sdpaxos-alloc-") as tmp:
        directory = Path(tmp)
        (directory / "gpu.yaml").write_text(synthetic_config(nodes=nodes, vcs=vcs).to_yaml())
        cluster = LocalCluster(directory, replicas, wan=wan,
                               state_machine='kind = "cluster_state"\ngpu_config = "gpu.yaml"')
        cluster.start_all()
        try:
            report = asyncio.run(_load(cluster, seconds, outstanding, vcs, seed))
        finally:
            cluster.stop_all()
    report.update(replicas=replicas, nodes=nodes, gpus=nodes * 8, vcs=vcs, wan=wan,
                  fsync=True, outstanding_per_site=outstanding)
    return report


async def _load(cluster: Any, seconds: float, outstanding: int, vcs: int,
                seed: int) -> dict[str, Any]:
    from cluster_state.client import AllocationStore
    from cluster_state.demo import _wait_serving
    from cluster_state.ops import GroupSpec, Member, Placed, Preempting, Waiting
    from cluster_state.workload import next_job

    await _wait_serving(cluster)
    addresses = cluster.client_addresses
    names = [f"vc{k:02d}" for k in range(vcs)]
    latencies: list[float] = []
    outcomes = {"placed": 0, "preempting": 0, "waiting": 0}
    stop_at = time.monotonic() + seconds
    rng = random.Random(seed)

    async def job_loop(store: AllocationStore, prefix: str, worker_rng: random.Random) -> None:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            job = next_job(worker_rng, f"{prefix}-{n}", names, mean_duration_s=1.0)
            spec = GroupSpec(name=job.name, vc=job.vc, priority=job.priority,
                             members=tuple(Member(p, g) for p, g in job.members))
            started = time.monotonic()
            result = await store.submit(spec)
            latencies.append((time.monotonic() - started) * 1000)
            if isinstance(result, Placed):
                outcomes["placed"] += 1
            elif isinstance(result, Preempting):
                outcomes["preempting"] += 1
            elif isinstance(result, Waiting):
                outcomes["waiting"] += 1
                continue  # nothing to release
            await store.release(job.name)  # placed or reserving: free it again

    stores = [AllocationStore.connect(addresses, home=home) for home in range(len(addresses))]
    began = time.monotonic()
    await asyncio.gather(*[
        job_loop(store, f"s{home}w{k}", random.Random(rng.getrandbits(64)))
        for home, store in enumerate(stores) for k in range(outstanding)
    ])
    elapsed = time.monotonic() - began
    leftover = len(await stores[0].allocations())
    identical = await _replicas_identical(addresses)
    for store in stores:
        await store.close()
    ordered = sorted(latencies)
    return {
        "ok": identical and leftover == 0,
        "allocations_per_s": outcomes["placed"] / elapsed,
        "submits_per_s": len(latencies) / elapsed,
        "submitted": len(latencies),
        **outcomes,
        "seconds": elapsed,
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[int(0.99 * (len(ordered) - 1))],
        "groups_left": leftover,
        "replicas_identical": identical,
    }


async def _replicas_identical(addresses: list[tuple[str, int]], timeout: float = 30.0) -> bool:
    """Every replica's snapshot hash, read locally at each, agrees (waiting for laggards)."""
    from cluster_state.client import AllocationStore

    locals_ = [AllocationStore.connect([address]) for address in addresses]
    try:
        deadline = time.monotonic() + timeout
        while True:
            digests = [(await store.digest(stale=True))["sha256"] for store in locals_]
            if len(set(digests)) == 1:
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.2)
    finally:
        for store in locals_:
            await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="allocations/s through replica processes")
    add_arguments(parser)
    options = parser.parse_args()
    options.json = True
    raise SystemExit(run(options))
