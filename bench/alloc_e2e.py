"""``sdpaxos bench alloc-e2e``: allocations per second through replicated GPU store processes.

Three (or five) replica processes on loopback, fsync on, serving the allocation store on a
1,024-node x 8-GPU cluster with 16 virtual clusters; schedulers at every site (in this process,
each talking to its own site's replica) keep ``--outstanding`` jobs in flight: submit a gang
from the demo's job mix, release it as soon as it is placed. Counted: placements per second,
and the submit latency. The replicas' WAN emulation is off unless ``--wan``.
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
    parser.add_argument("--outstanding", type=int, default=64, help="jobs in flight per site")
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--vcs", type=int, default=16)
    parser.add_argument("--wan", action="store_true", help="emulate the paper's WAN delays")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    report = measure(args.replicas, args.seconds, args.outstanding, nodes=args.nodes,
                     vcs=args.vcs, wan=args.wan, seed=args.seed)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['allocations_per_s']:.0f} allocations/s through {args.replicas} replicas "
              f"({report['placed']} placed in {report['seconds']:.1f}s); submit latency p50 "
              f"{report['p50_ms']:.1f} ms, p99 {report['p99_ms']:.1f} ms")
    return 0


def measure(replicas: int, seconds: float, outstanding: int, *, nodes: int = 1024,
            vcs: int = 16, wan: bool = False, seed: int = 1) -> dict[str, Any]:
    from cluster_state.config import synthetic_config
    from consensus.runtime.local_cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="sdpaxos-alloc-") as tmp:
        directory = Path(tmp)
        (directory / "gpu.yaml").write_text(synthetic_config(nodes=nodes, vcs=vcs).to_yaml())
        cluster = LocalCluster(directory, replicas, wan=wan,
                               state_machine='kind = "cluster_state"\ngpu_config = "gpu.yaml"')
        cluster.start_all()
        try:
            return asyncio.run(_load(cluster, seconds, outstanding, vcs, seed))
        finally:
            cluster.stop_all()


async def _load(cluster: Any, seconds: float, outstanding: int, vcs: int,
                seed: int) -> dict[str, Any]:
    from cluster_state.client import AllocationStore
    from cluster_state.demo import _wait_serving
    from cluster_state.ops import GroupSpec, Member, Placed
    from cluster_state.workload import next_job

    await _wait_serving(cluster)
    addresses = cluster.client_addresses
    names = [f"vc{k:02d}" for k in range(vcs)]
    latencies: list[float] = []
    placed = 0
    stop_at = time.monotonic() + seconds
    rng = random.Random(seed)

    async def scheduler(store: AllocationStore, prefix: str, worker_rng: random.Random) -> None:
        nonlocal placed
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            job = next_job(worker_rng, f"{prefix}-{n}", names, mean_duration_s=1.0)
            spec = GroupSpec(name=job.name, vc=job.vc, priority=max(0, job.priority),
                             members=tuple(Member(p, g) for p, g in job.members))
            started = time.monotonic()
            result = await store.submit(spec)
            latencies.append((time.monotonic() - started) * 1000)
            if isinstance(result, Placed):
                placed += 1
            await store.release(job.name)  # placed or reserving: free it again

    stores = [AllocationStore.connect(addresses, client_id=5000 + home, home=home)
              for home in range(len(addresses))]
    began = time.monotonic()
    await asyncio.gather(*[
        scheduler(store, f"s{home}w{k}", random.Random(rng.getrandbits(64)))
        for home, store in enumerate(stores) for k in range(outstanding)
    ])
    elapsed = time.monotonic() - began
    for store in stores:
        await store.close()
    ordered = sorted(latencies)
    return {
        "placed": placed,
        "submitted": len(latencies),
        "seconds": elapsed,
        "allocations_per_s": placed / elapsed,
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[int(0.99 * (len(ordered) - 1))],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
