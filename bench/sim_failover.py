"""``sdpaxos bench sim-failover``: sequencer failover time in the deterministic simulator.

LAN delays (0.2 ms RTT), the default timeouts (50 ms heartbeats, 300 ms election timeout),
clients writing at every site; at 1 s the sequencer crashes. Measured: simulated time from the
crash to the first write proposed after it that becomes ready at another replica.
"""

from __future__ import annotations

import argparse
import json
import statistics

from consensus.messages import Command
from consensus.sim.events import FaultCrash
from consensus.sim.simulator import SimOptions, Simulation

__all__ = ["add_arguments", "measure", "run"]

CRASH_AT_US = 1_000_000

#: how long after the crash a write must become ready for the seed to count as failed over
FAILOVER_BOUND_US = 3_000_000

#: the replica that crashes: the sequencer of the first view
SEQUENCER = 0


def measure(replicas: int, seed: int) -> int | None:
    options = SimOptions(replicas=replicas, network="lan", ops=100_000, concurrency=1,
                         heal_us=3_000_000, think_us=1_000)
    sim = Simulation(options, seed)
    first_ready: list[int] = []

    def ready(replica: int, command: Command, called_at_us: int) -> None:
        if sim.now > CRASH_AT_US and called_at_us > CRASH_AT_US:
            first_ready.append(sim.now)

    sim.on_ready = ready
    sim.start()
    sim.schedule(CRASH_AT_US, FaultCrash(SEQUENCER))
    sim.run_until(lambda: bool(first_ready), deadline_us=CRASH_AT_US + FAILOVER_BOUND_US)
    return first_ready[0] - CRASH_AT_US if first_ready else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=3, help="how many replicas")
    parser.add_argument("--seeds", type=int, default=100, help="how many seeded runs")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args: argparse.Namespace) -> int:
    times = [measure(args.replicas, seed) for seed in range(1, args.seeds + 1)]
    done = sorted(t for t in times if t is not None)
    result = {
        "replicas": args.replicas,
        "seeds": args.seeds,
        "failed_over": len(done),
        "p50_ms": round(statistics.median(done) / 1000, 1) if done else None,
        "p99_ms": round(done[max(0, int(len(done) * 0.99 + 0.5) - 1)] / 1000, 1) if done else None,
        "max_ms": round(done[-1] / 1000, 1) if done else None,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"sequencer failover, {args.replicas} replicas, {args.seeds} seeds: "
            f"{result['failed_over']} recovered; p50 {result['p50_ms']} ms, "
            f"p99 {result['p99_ms']} ms, max {result['max_ms']} ms"
        )
    return 0 if len(done) == args.seeds else 1
