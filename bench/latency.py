"""``sdpaxos bench latency``: per-site latency on the emulated WAN (paper §5.4, Fig. 12).

Replicas as processes at the paper's sites (3: CA, OR, OH; 5: + IRE, SEL) with the transport's
WAN emulation giving every link the paper's RTT; the SDPaxos sequencer and the Multi-Paxos
leader are at CA. At every site an open-loop client process sends Poisson arrivals at
``--rate`` requests/s to its own replica: blind writes, answered when *ready*, and (a share
``--executed-share`` of them) writes answered after *execution*. Reported per site and protocol:
p50 / mean / p95 / p99 of both, beside the site's theoretical ready-latency bound computed from
the RTT table (``bench.bounds``; EPaxos's: the nearest fast quorum). Protocols are
interleaved round by round.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from bench.bounds import BOUND_KINDS, ready_bounds_ms, sites_for
from bench.harness import (
    TLS_SUFFIX,
    BenchProgress,
    BenchSession,
    LoadPlan,
    SiteLoad,
    add_common_arguments,
    interrupts_to_exit_code,
    machine_info,
    parse_protocols,
    print_table,
    run_load,
    summary_ms,
    write_json,
)
from bench.loadgen import new_histogram

__all__ = ["add_arguments", "run"]

#: open-loop requests in flight per connection stay well under the session window
PER_CONNECTION_RATE = 100.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--protocols",
        type=parse_protocols,
        default=parse_protocols("sdpaxos,multipaxos,mencius,epaxos"),
        help="comma-separated, side by side (interleaved round by round)",
    )
    parser.add_argument("--replicas", type=int, nargs="+", choices=(3, 5), default=[3],
                        help="replica counts, measured one after the other")
    parser.add_argument(
        "--rate", type=float, nargs="+", default=[20.0, 500.0], help="requests/s per site (Poisson)"
    )
    parser.add_argument(
        "--executed-share",
        type=float,
        default=0.5,
        help="share of writes answered after execution (the rest when ready)",
    )
    parser.add_argument("--size", type=int, default=16, help="command bytes")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of every protocol, interleaved")
    parser.add_argument(
        "--tls", action="store_true",
        help="run each protocol twice, over mutual TLS 1.3 (as PROTOCOL+tls) and without, "
        "interleaved, and report TLS's cost",
    )
    parser.add_argument("--lan", action="store_true",
                        help="no emulated WAN delays: loopback latency (what TLS adds shows)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds of load before measuring")
    add_common_arguments(
        parser, "short settings, only the first of the replica counts and rates: under a minute"
    )


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.replicas, args.rate = args.replicas[:1], args.rate[:1]
        args.rounds, args.duration, args.warmup = 1, 3.0, 1.0
    with interrupts_to_exit_code("latency") as code:
        report = measure(args)
        write_json(args.json, report)
        show(report)
        if args.plot:
            from bench.plots import latency_figure

            latency_figure(report, args.plot)
    return code[0]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    machine = machine_info()
    protocols: list[str] = args.protocols
    if args.tls:  # each protocol beside itself over TLS, interleaved like protocols
        protocols = [v for p in protocols for v in (p, p + TLS_SUFFIX)]
    rows: list[dict[str, Any]] = []
    steps = len(args.replicas) * len(args.rate) * args.rounds * len(protocols)
    with (
        BenchSession("latency", args.workdir, fsync=not args.no_fsync) as session,
        BenchProgress("latency", steps) as progress,
    ):
        for replicas in args.replicas:
            sites = sites_for(replicas)
            for rate in args.rate:
                connections = max(1, math.ceil(rate / PER_CONNECTION_RATE))
                merged = {
                    p: {s: (new_histogram(), new_histogram()) for s in sites} for p in protocols
                }
                problems = {p: {"errors": 0, "timeouts": 0, "lost": 0} for p in protocols}
                lag = {p: 0.0 for p in protocols}
                cpu: dict[str, dict[str, float]] = {}
                for round_ in range(args.rounds):
                    shift = round_ % len(protocols)
                    for protocol in protocols[shift:] + protocols[:shift]:
                        progress.begin(
                            f"N={replicas} {rate:g}/s per site, {protocol}, "
                            f"round {round_ + 1}/{args.rounds}"
                        )
                        plan = LoadPlan(
                            mode="open",
                            sites=tuple(
                                SiteLoad(site, i, connections, rate=rate, process=i)
                                for i, site in enumerate(sites)
                            ),
                            warmup=args.warmup, duration=args.duration, drain=10.0,
                            size=args.size, executed_share=args.executed_share,
                            seed=args.seed + round_,
                        )  # fmt: skip
                        cluster = session.start_cluster(
                            f"{protocol}-n{replicas}-r{rate:g}", replicas,
                            protocol.removesuffix(TLS_SUFFIX), wan=not args.lan,
                            tls=protocol.endswith(TLS_SUFFIX),
                        )
                        try:
                            result = run_load(session, cluster, plan, progress)
                        finally:
                            session.stop_cluster(cluster)
                        for measured in result.sites:
                            pair = merged[protocol][measured.site]
                            pair[0].add(measured.histograms["ready"])
                            pair[1].add(measured.histograms["executed"])
                            lag[protocol] = max(lag[protocol], measured.max_send_lag_ms)
                        cpu[protocol] = result.cpu
                        for key, value in result.problems().items():
                            problems[protocol][key] += value
                        progress.end()
                for protocol in protocols:
                    bounds = ready_bounds_ms(protocol.removesuffix(TLS_SUFFIX), sites)
                    for i, site in enumerate(sites):
                        ready, executed = merged[protocol][site]
                        rows.append({
                            "replicas": replicas, "rate": rate, "protocol": protocol,
                            "site": site, "bound_ms": bounds[i],
                            "ready": summary_ms(ready), "executed": summary_ms(executed),
                            "problems": problems[protocol],
                            "max_send_lag_ms": lag[protocol],
                            "cpu_last_round": cpu[protocol],
                        })  # fmt: skip
    return {
        "bench": "latency",
        "machine": machine,
        "settings": {
            "protocols": protocols, "replicas": args.replicas, "rates": args.rate,
            "executed_share": args.executed_share, "size": args.size,
            "duration_s": args.duration, "warmup_s": args.warmup, "rounds": args.rounds,
            "fsync": not args.no_fsync, "seed": args.seed, "quick": args.quick,
            "sequencer_or_leader": "CA (replica 0)",
        },
        "bound_kinds": {p: BOUND_KINDS[p.removesuffix(TLS_SUFFIX)] for p in protocols},
        "rows": rows,
    }  # fmt: skip


def show(report: dict[str, Any]) -> None:
    panels = list(dict.fromkeys((r["replicas"], r["rate"]) for r in report["rows"]))
    for replicas, rate in panels:
        table_rows = []
        for r in report["rows"]:
            if (r["replicas"], r["rate"]) != (replicas, rate):
                continue
            ready, executed = r["ready"], r["executed"]
            table_rows.append([
                r["site"], r["protocol"], r["bound_ms"], ready["p50_ms"], ready["mean_ms"],
                ready["p95_ms"], ready["p99_ms"], executed["p50_ms"], executed["mean_ms"],
                executed["p95_ms"], executed["p99_ms"], ready["count"] + executed["count"],
            ])  # fmt: skip
        print_table(
            f"WAN latency, {replicas} replicas, {rate:g} req/s per site (ms; bound: theoretical "
            "ready latency from the RTT table)",
            ["site", "protocol", "bound", "ready p50", "mean", "p95", "p99", "executed p50",
             "mean", "p95", "p99", "requests"],
            table_rows,
        )  # fmt: skip
    plain = {(r["replicas"], r["rate"], r["protocol"], r["site"]): r for r in report["rows"]}
    for r in report["rows"]:
        base = plain.get((r["replicas"], r["rate"], r["protocol"].removesuffix(TLS_SUFFIX),
                          r["site"]))
        if (r["protocol"].endswith(TLS_SUFFIX) and base is not None
                and None not in (r["ready"]["p50_ms"], base["ready"]["p50_ms"])):
            added = r["ready"]["p50_ms"] - base["ready"]["p50_ms"]
            print(f"TLS cost: {r['protocol']}, {r['replicas']} replicas, {r['rate']:g}/s, "
                  f"{r['site']}: ready p50 {r['ready']['p50_ms']} ms vs {base['ready']['p50_ms']}"
                  f" ms without TLS ({added:+.3f} ms)")
