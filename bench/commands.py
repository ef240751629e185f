"""``sdpaxos bench``: the benchmark subcommands."""

from __future__ import annotations

import argparse
import importlib

#: benchmark -> (module with add_arguments/run, help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "core": (
        "bench.core_throughput",
        "protocol-core throughput, all replicas in one process, no I/O",
    ),
    "turn-cost": ("bench.turn_cost", "CPU per loop turn and per write, three replicas in one "
                  "process: one write at a time or many"),
    "command-cost": ("bench.command_cost", "CPU per command of a replica's per-command parts "
                     "(intake, feed, acknowledge, apply, snapshot), each alone, in one process"),
    "wan": ("bench.wan_accuracy", "accuracy of the transport's emulated WAN delays"),
    "runtime": ("bench.runtime_bench", "replicas as processes with fsync: throughput, latency"),
    "sim-failover": ("bench.sim_failover", "sequencer failover time in the simulator"),
    "msg-cost": ("bench.msg_cost", "messages per read and per write in the simulator"),
    "alloc-e2e": ("bench.alloc_e2e", "GPU allocations/s through replicated store processes"),
    "watch": ("bench.watch_fanout", "watchers at a paced allocation rate: CPU per delivered "
              "event, event delay"),
    "throughput": (
        "bench.throughput",
        "peak throughput per protocol, replicas as processes with CPU limits",
    ),
    "latency": ("bench.latency", "per-site latency on the emulated WAN, open-loop clients"),
    "failover": ("bench.failover", "throughput timeline per site when the sequencer is killed"),
    "reads": ("bench.reads", "linearizable read throughput and latency, uniform and Zipf keys"),
    "restart": ("bench.restart", "recovery time after restarting replicas at real log sizes"),
    "decode": ("bench.decode", "decoding time of votes, promises and new views by size"),
    "extender-filter": ("bench.extender_filter",
                        "the extender's filter latency: pod cache against listing every pod"),
    "soak": ("bench.soak", "real processes for hours under a GPU cluster's mixed life: "
             "memory, files, disk, stalls and latency over time, then every check"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    benches = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, (module_name, help_text) in BENCHMARKS.items():
        sub = benches.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(sub)
        sub.set_defaults(_bench_run=module.run)


def run(args: argparse.Namespace) -> int:
    code: int = args._bench_run(args)
    return code
