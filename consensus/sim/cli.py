"""``sdpaxos sim``: run the deterministic simulator over many seeds and report as JSON."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from consensus.config import SITES, UNSAFE_VARIANTS
from consensus.errors import ConfigError
from consensus.sim.simulator import (
    FAULT_CLASSES,
    PROTOCOLS,
    RECOVERY_BOUND_US,
    RESTART_KINDS,
    RunResult,
    SimOptions,
    Simulation,
)

__all__ = ["add_arguments", "parse_faults", "parse_restarts", "replay_command", "run", "sweep"]

#: the long-log mode's defaults: a LAN (little delay per slot) and many clients per site
LONG_LOG_NETWORK = "lan"
LONG_LOG_CONCURRENCY = 50
#: and otherwise
DEFAULT_NETWORK = "wan"
DEFAULT_CONCURRENCY = 2


def parse_faults(text: str) -> frozenset[str]:
    """``none``, ``all`` or a comma list of fault classes (unknown names are an error)."""
    text = text.strip()
    if text == "none":
        return frozenset()
    if text == "all":
        return frozenset(FAULT_CLASSES)
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = sorted(names - set(FAULT_CLASSES))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown fault classes {unknown}; choose from {', '.join(FAULT_CLASSES)}, "
            "or none / all"
        )
    return frozenset(names)


def parse_restarts(text: str) -> tuple[str, ...]:
    """A comma list of ``one`` (the sequencer) and ``all`` (the whole cluster), in order."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(set(names) - set(RESTART_KINDS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of {' and '.join(RESTART_KINDS)}, got {text!r}"
        )
    return names


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--protocol", choices=sorted(PROTOCOLS), default="sdpaxos",
                        help="the protocol core to simulate")
    parser.add_argument("--replicas", type=int, default=3, help="replicas per run")
    parser.add_argument("--seeds", type=int, default=20, help="how many runs")
    parser.add_argument("--start-seed", type=int, default=1,
                        help="the first run's seed (the others follow it)")
    parser.add_argument(
        "--faults", type=parse_faults, default=frozenset(),
        help=f"none, all, or a comma list of: {', '.join(FAULT_CLASSES)}",
    )
    parser.add_argument("--network", choices=("wan", "lan"), default=None,
                        help="wan: the paper's RTTs between sites; lan: 0.2 ms (default: "
                        f"{DEFAULT_NETWORK}, with --long-log {LONG_LOG_NETWORK})")
    parser.add_argument("--ops", type=int, default=200, help="client operations per run")
    parser.add_argument("--concurrency", type=int, default=None,
                        help=f"clients per site (default: {DEFAULT_CONCURRENCY}, with "
                        f"--long-log {LONG_LOG_CONCURRENCY})")
    parser.add_argument("--reads", choices=("log", "lease", "mixed"), default="mixed",
                        help="how reads are served: through the log, by the sequencer's lease, or "
                        "both")
    parser.add_argument("--snapshot-every", type=_non_negative, default=0, metavar="N",
                        help="each replica snapshots and compacts its log every N applied "
                        "commands, and replicas behind a peer's compaction point install "
                        "its snapshot (0: never)")
    parser.add_argument("--keyless", type=_share, default=0.0, metavar="SHARE",
                        help="share of updates that name no keys (they count as updating "
                        "every key)")
    parser.add_argument("--long-log", type=_non_negative, default=0, metavar="SLOTS",
                        help="long-log mode: blind writes until the global log holds SLOTS "
                        "slots (--ops is ignored; no faults), then the --restarts in turn, "
                        "each of which must be followed by the cluster serving again (a log "
                        "read answered at every site, every replica caught up) within "
                        "--recovery-bound-ms of simulated time (0: off)")
    parser.add_argument("--restarts", type=parse_restarts, default=RESTART_KINDS,
                        metavar="LIST", help="long-log mode: comma list of one (restart the "
                        "sequencer) and all (restart every replica at once), in order "
                        "(default: one,all)")
    parser.add_argument("--recovery-bound-ms", type=_non_negative,
                        default=RECOVERY_BOUND_US // 1000, metavar="MS",
                        help="long-log mode: how long after a restart serving again may take")
    parser.add_argument("--no-codec", action="store_true",
                        help="deliver messages as they are (default: every send step goes "
                        "through the node's framing and is decoded as its receiver would; a "
                        "message that cannot be encoded or decoded is a violation)")
    parser.add_argument("--sessions", action="store_true",
                        help="clients open sessions with open-by times (many one-shot), the "
                        "replicas propose log-time commands and the session table has tight "
                        "bounds: evictions in every run, and no request may run twice")
    parser.add_argument("--unsafe", default="", help="test only: comma list of broken variants "
                        f"({', '.join(sorted(UNSAFE_VARIANTS))})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--verbose", action="store_true", help="print each failing run's trace")


def options_from(args: argparse.Namespace) -> SimOptions:
    unsafe = frozenset(v for v in args.unsafe.split(",") if v)
    long_log = args.long_log
    network = args.network or (LONG_LOG_NETWORK if long_log else DEFAULT_NETWORK)
    concurrency = args.concurrency
    if concurrency is None:
        concurrency = LONG_LOG_CONCURRENCY if long_log else DEFAULT_CONCURRENCY
    return SimOptions(
        protocol=args.protocol,
        replicas=args.replicas,
        faults=args.faults,
        ops=args.ops,
        concurrency=concurrency,
        network=network,
        reads=args.reads,
        use_codec=not args.no_codec,
        unsafe=unsafe,
        snapshot_every=args.snapshot_every,
        keyless=args.keyless,
        long_log=long_log,
        restarts=args.restarts,
        recovery_bound_us=args.recovery_bound_ms * 1000,
        sessions=args.sessions,
    )


def replay_command(options: SimOptions, seed: int) -> str:
    faults = ",".join(sorted(options.faults)) or "none"
    parts = [
        "sdpaxos sim", f"--protocol {options.protocol}", f"--replicas {options.replicas}",
        "--seeds 1", f"--start-seed {seed}", f"--faults {faults}",
        f"--network {options.network}", f"--ops {options.ops}",
        f"--concurrency {options.concurrency}", f"--reads {options.reads}",
    ]
    if options.snapshot_every:
        parts.append(f"--snapshot-every {options.snapshot_every}")
    if options.keyless:
        parts.append(f"--keyless {options.keyless}")
    if options.long_log:
        parts += [f"--long-log {options.long_log}", f"--restarts {','.join(options.restarts)}",
                  f"--recovery-bound-ms {options.recovery_bound_us // 1000}"]
    if not options.use_codec:
        parts.append("--no-codec")
    if options.sessions:
        parts.append("--sessions")
    if options.unsafe:
        parts.append(f"--unsafe {','.join(sorted(options.unsafe))}")
    return " ".join(parts)


def sweep(options: SimOptions, seeds: range) -> dict[str, Any]:
    started = time.perf_counter()
    violations: list[dict[str, Any]] = []
    liveness: list[dict[str, Any]] = []
    ready: dict[str, list[int]] = {}
    executed: dict[str, list[int]] = {}
    messages: dict[str, int] = {}
    completed = failed = 0
    unchecked = 0
    snapshots = {"taken": 0, "installed": 0, "restarts_from": 0}
    long_log: list[dict[str, Any]] = []
    sessions = {"expired": 0, "outcomes_unknown": 0}
    for seed in seeds:
        result: RunResult = Simulation(options, seed).run()
        sessions["expired"] += result.sessions_expired
        sessions["outcomes_unknown"] += result.outcomes_unknown
        completed += result.ops_completed
        failed += result.ops_failed
        unchecked += 0 if result.checked else 1
        snapshots["taken"] += result.snapshots_taken
        snapshots["installed"] += result.snapshots_installed
        snapshots["restarts_from"] += result.restarts_from_snapshot
        for site, values in result.ready_latency_us.items():
            ready.setdefault(site, []).extend(values)
        for site, values in result.executed_latency_us.items():
            executed.setdefault(site, []).extend(values)
        for name, count in result.messages.items():
            messages[name] = messages.get(name, 0) + count
        long_log += [{"seed": seed, **restart} for restart in result.long_log]
        entry = {
            "seed": seed,
            "time_ms": round(result.violation_time_us / 1000, 3),
            "replay": replay_command(options, seed),
            "trace": result.trace_tail,
        }
        if result.violation is not None:
            violations.append({**entry, "message": result.violation})
        elif result.liveness is not None:
            liveness.append({**entry, "time_ms": round(result.sim_time_us / 1000, 3),
                             "message": result.liveness})
    order = [site for site in SITES if site in ready] + sorted(set(ready) - set(SITES))
    extra: dict[str, Any] = {"long_log": long_log} if options.long_log else {}
    if options.sessions:
        extra["sessions"] = sessions
    return {
        "protocol": options.protocol,
        "replicas": options.replicas,
        "faults": sorted(options.faults),
        "runs": len(seeds),
        "violations": violations,
        "liveness_failures": liveness,
        "ops_completed": completed,
        "ops_failed": failed,
        "histories_unchecked": unchecked,
        "snapshots": snapshots,
        "site_latency_ms": {site: _percentiles(ready[site]) for site in order},
        "executed_latency_ms": {
            site: _percentiles(executed[site]) for site in order if site in executed
        },
        "messages": dict(sorted(messages.items())),
        **extra,
        "elapsed_s": round(time.perf_counter() - started, 2),
    }


def _percentiles(values_us: list[int]) -> dict[str, float]:
    ordered = sorted(values_us)
    if not ordered:
        return {"p50": float("nan"), "p99": float("nan")}
    return {
        "p50": round(statistics.median(ordered) / 1000, 3),
        "p99": round(ordered[max(0, int(len(ordered) * 0.99 + 0.5) - 1)] / 1000, 3),
    }


def run(args: argparse.Namespace) -> int:
    options = options_from(args)
    try:
        report = sweep(options, range(args.start_seed, args.start_seed + args.seeds))
    except ConfigError as exc:  # e.g. an --unsafe variant the chosen protocol lacks
        print(f"sdpaxos sim: error: {exc}", file=sys.stderr)
        return 2
    failed = bool(report["violations"] or report["liveness_failures"])
    if args.json:
        if not args.verbose:
            for entry in report["violations"] + report["liveness_failures"]:
                entry.pop("trace")
        print(json.dumps(report))
    else:
        print(
            f"{report['runs']} runs of {options.protocol} with {options.replicas} replicas, "
            f"faults: {', '.join(report['faults']) or 'none'}: "
            f"{len(report['violations'])} violations, "
            f"{len(report['liveness_failures'])} liveness failures, "
            f"{report['ops_completed']} operations ({report['ops_failed']} more failed for "
            f"good), {report['elapsed_s']} s"
        )
        for restart in report.get("long_log", ()):
            took = restart.get("recovered_ms")
            print(f"  seed {restart['seed']}: restarted {restart['restart']} at "
                  f"{restart['slots']:,} slots: "
                  + (f"serving again after {took} ms" if took is not None else "did not recover"))
        if options.snapshot_every:
            taken = report["snapshots"]
            print(f"  snapshots: {taken['taken']} taken, {taken['installed']} installed from "
                  f"a peer, {taken['restarts_from']} restarts from one")
        for site, p in report["site_latency_ms"].items():
            print(f"  {site:4} ready latency p50 {p['p50']} ms, p99 {p['p99']} ms")
        for entry in report["violations"] + report["liveness_failures"]:
            print(f"FAILED seed {entry['seed']} at {entry['time_ms']} ms: {entry['message']}",
                  file=sys.stderr)
            print(f"  replay: {entry['replay']}", file=sys.stderr)
            if args.verbose:
                for line in entry["trace"]:
                    print(f"    {line}", file=sys.stderr)
    return 1 if failed else 0
