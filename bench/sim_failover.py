"""``sdpaxos bench sim-failover``: sequencer failover time in the deterministic simulator.

LAN delays (0.2 ms RTT), the default timeouts (50 ms heartbeats, 300 ms election timeout),
clients writing at every site; at 1 s the sequencer crashes. Measured: simulated time from the
crash to the first write proposed after it that becomes ready at another replica.
"""

from __future__ import annotations

import argparse
import json
import statistics

from consensus.sim.simulator import SimOptions, Simulation

__all__ = ["add_arguments", "measure", "run"]

CRASH_AT_US = 1_000_000


def measure(replicas: int, seed: int) -> int | None:
    options = SimOptions(replicas=replicas, network="lan", ops=100_000, concurrency=1,
                         heal_us=3_000_000, think_us=1_000)
    sim = Simulation(options, seed)
    sim.start()
    sim._push(CRASH_AT_US, "fault_crash", 0)
    first_ready: list[int] = []
    original = sim._ready

    def ready(rep, command):  # type: ignore[no-untyped-def]
        opened = sim._open(command)
        if opened is not None and sim.now > CRASH_AT_US and opened[1]["call"] > CRASH_AT_US:
            first_ready.append(sim.now)
        original(rep, command)

    sim._ready = ready  # type: ignore[method-assign]
    sim.chaos_over = False  # fault events only act during the chaos phase
    deadline = CRASH_AT_US + 3_000_000
    import heapq

    while sim.heap and not first_ready:
        at, _, kind, target, payload = heapq.heappop(sim.heap)
        if at > deadline:
            break
        sim.now = at
        if kind in ("heal", "check"):
            continue
        sim._dispatch(kind, target, payload)
    return first_ready[0] - CRASH_AT_US if first_ready else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--json", action="store_true")


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
