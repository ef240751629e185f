"""``sdpaxos bench reads``: linearizable reads under mixed workloads (paper §3.5, §5.3, §5.4).

Reads are linearizable reads (``Client.read``: kind ``read``): in SDPaxos one round trip to
the sequencer, which names the last slot that updated the key, then served locally once
executed through it; in the baselines they go through the log. Workloads ``DIST-R:W``: keys
uniform or Zipf(0.99) over ``--keys`` items, reads to writes R:W (default: uniform and Zipf,
1:1 and 9:1; the paper's Fig. 13 uses uniform 1:1, Zipf 1:1 and Zipf 9:1).

* Default (LAN): replicas as processes with ``--cpu`` CPUs each (cgroup), closed-loop clients in
  separate processes; read and write throughput and latency per workload.
* ``--wan``: the paper's sites and RTTs, open-loop Poisson clients at ``--rate`` requests/s per
  site; read and write latency per site, with the read bound (SDPaxos: the RTT to the
  sequencer at CA).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from bench.bounds import read_bounds_ms, sites_for
from bench.harness import (
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
    spread,
    summary_ms,
    write_json,
)
from bench.loadgen import new_histogram
from consensus.config import SITES
from consensus.statemachine import SESSION_WINDOW

__all__ = ["add_arguments", "parse_workload", "run"]

DEFAULT_WORKLOADS = ("uniform-1:1", "uniform-9:1", "zipf-1:1", "zipf-9:1")


def parse_workload(text: str) -> tuple[str, float]:
    """``"zipf-9:1"`` -> ("zipf", 0.9): the key distribution and the share of reads."""
    dist, _, ratio = text.partition("-")
    reads, _, writes = ratio.partition(":")
    try:
        r, w = float(reads), float(writes)
    except ValueError:
        raise argparse.ArgumentTypeError(f"workload {text!r}: expected DIST-R:W") from None
    if dist not in ("uniform", "zipf") or r < 0 or w < 0 or r + w == 0:
        raise argparse.ArgumentTypeError(f"workload {text!r}: DIST is uniform or zipf, R:W >= 0")
    return dist, r / (r + w)


def _workload(text: str) -> str:
    parse_workload(text)
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--protocols", type=parse_protocols, default=parse_protocols("sdpaxos"),
                        help="comma-separated protocols, interleaved round by round")
    parser.add_argument("--replicas", type=int, choices=(3, 5), default=3,
                        help="how many replicas (sites CA, OR, OH, VA, JP in that order)")
    parser.add_argument(
        "--workloads",
        type=_workload,
        nargs="+",
        default=list(DEFAULT_WORKLOADS),
        metavar="DIST-R:W",
        help="workloads measured one after the other: key distribution and read:write mix",
    )
    parser.add_argument("--keys", type=int, default=500_000, help="distinct keys (paper: 500k)")
    parser.add_argument("--size", type=int, default=16, help="bytes of a write")
    parser.add_argument(
        "--wan", action="store_true", help="paper's sites and RTTs, open-loop clients at every site"
    )
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s per site (--wan)")
    parser.add_argument("--clients", type=int, default=12, help="connections (LAN)")
    parser.add_argument("--outstanding", type=int, default=32, help="per connection (LAN)")
    parser.add_argument("--client-procs", type=int, default=2, help="LAN")
    parser.add_argument("--cpu", type=float, default=0.3, help="CPUs per replica (LAN; 0: none)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of every protocol, interleaved")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.5,
                        help="seconds of load before measuring")
    add_common_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.outstanding <= SESSION_WINDOW:
        raise SystemExit(f"--outstanding must be in 1..{SESSION_WINDOW}")
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 1.5, 0.5
        if args.wan:
            args.duration = 3.0
    with interrupts_to_exit_code("reads") as code:
        report = measure(args)
        write_json(args.json, report)
        show(report)
        if args.plot:
            from bench.plots import reads_figure

            reads_figure(report, args.plot)
    return code[0]


def _plan(args: argparse.Namespace, protocol: str, workload: str, seed: int) -> LoadPlan:
    dist, reads = parse_workload(workload)
    sites = sites_for(args.replicas)
    if args.wan:
        connections = max(1, int(args.rate // 100) + 1)
        loads = tuple(
            SiteLoad(site, i, connections, rate=args.rate, process=i)
            for i, site in enumerate(sites)
        )
        return LoadPlan(
            mode="open",
            sites=loads,
            warmup=args.warmup,
            duration=args.duration,
            drain=10.0,
            size=args.size,
            reads=reads,
            keys=args.keys,
            dist=dist,
            seed=seed,
        )
    targets = [0] if protocol == "multipaxos" else list(range(args.replicas))
    loads = spread(targets, SITES, args.clients, args.outstanding, args.client_procs)
    return LoadPlan(
        mode="closed",
        sites=loads,
        warmup=args.warmup,
        duration=args.duration,
        size=args.size,
        reads=reads,
        keys=args.keys,
        dist=dist,
        seed=seed,
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    machine = machine_info()
    protocols: list[str] = args.protocols
    sites = sites_for(args.replicas)
    # (protocol, workload, site or None) -> [read hist, write hist, read rates, write rates]
    acc: dict[tuple[str, str, str | None], list[Any]] = {}
    cpus = [] if args.wan else [args.cpu] * args.replicas
    steps = args.rounds * len(protocols) * len(args.workloads)
    with (
        BenchSession("reads", args.workdir, fsync=not args.no_fsync) as session,
        BenchProgress("reads", steps) as progress,
    ):
        limiter = session.limiter
        if not args.wan and args.cpu > 0 and not limiter.available:
            print(f"CPU limits unavailable, running unlimited: {limiter.reason}")
        for round_ in range(args.rounds):
            shift = round_ % len(protocols)
            for protocol in protocols[shift:] + protocols[:shift]:
                cluster = session.start_cluster(
                    f"{protocol}-n{args.replicas}",
                    args.replicas,
                    protocol,
                    wan=args.wan,
                    cpus=cpus,
                )
                try:
                    for workload in args.workloads:
                        progress.begin(f"{protocol} {workload}, round {round_ + 1}/{args.rounds}")
                        plan = _plan(args, protocol, workload, args.seed + round_)
                        result = run_load(session, cluster, plan, progress)
                        keys: list[str | None] = [None] if not args.wan else list(sites)
                        for key in keys:
                            slot = acc.setdefault((protocol, workload, key), [
                                new_histogram(), new_histogram(), [], [], {"errors": 0,
                                "timeouts": 0, "lost": 0}])  # fmt: skip
                            picked = result.sites if key is None else [result.site(key)]
                            for measured in picked:
                                slot[0].add(measured.histograms["read"])
                                slot[1].add(measured.histograms["ready"])
                            slot[2].append(
                                sum(s.completed["read"] for s in picked) / result.window_s
                            )
                            slot[3].append(
                                sum(s.completed["ready"] for s in picked) / result.window_s
                            )
                        for name, value in result.problems().items():
                            acc[(protocol, workload, keys[0])][4][name] += value
                        progress.end()
                finally:
                    session.stop_cluster(cluster)
        rows = []
        for (protocol, workload, site), (reads, writes, r_rates, w_rates, problems) in acc.items():
            row: dict[str, Any] = {
                "protocol": protocol, "workload": workload, "site": site,
                "read_throughput_per_s": round(statistics.median(r_rates)),
                "write_throughput_per_s": round(statistics.median(w_rates)),
                "read_latency_ms": summary_ms(reads), "write_latency_ms": summary_ms(writes),
                "problems": problems,
            }  # fmt: skip
            if site is not None:
                row["read_bound_ms"] = read_bounds_ms(protocol, sites)[sites.index(site)]
            rows.append(row)
        return {
            "bench": "reads",
            "machine": machine,
            "settings": {
                "protocols": protocols, "replicas": args.replicas, "workloads": args.workloads,
                "keys": args.keys, "size": args.size, "wan": args.wan,
                "rate_per_site": args.rate if args.wan else None,
                "clients": None if args.wan else args.clients,
                "outstanding": None if args.wan else args.outstanding,
                "duration_s": args.duration, "warmup_s": args.warmup, "rounds": args.rounds,
                "fsync": not args.no_fsync, "seed": args.seed, "quick": args.quick,
            },
            "cpu_limit": {
                "mechanism": limiter.kind if cpus else "none", "detail": limiter.reason,
                "per_replica_cpus": args.cpu if cpus and limiter.available else None,
            },
            "rows": rows,
        }  # fmt: skip


def show(report: dict[str, Any]) -> None:
    rows = []
    wan = report["settings"]["wan"]
    for r in report["rows"]:
        read, write = r["read_latency_ms"], r["write_latency_ms"]
        cells = [r["protocol"], r["workload"]]
        if wan:
            cells += [r["site"], r.get("read_bound_ms")]
        cells += [
            r["read_throughput_per_s"],
            r["write_throughput_per_s"],
            read["p50_ms"],
            read["mean_ms"],
            read["p95_ms"],
            read["p99_ms"],
            write["p50_ms"],
            write["p99_ms"],
        ]
        rows.append(cells)
    columns = ["protocol", "workload"] + (["site", "read bound ms"] if wan else [])
    columns += ["reads/s", "writes/s", "read p50 ms", "mean", "p95", "p99", "write p50 ms", "p99"]
    mode = "WAN, open loop per site" if wan else "LAN, closed loop"
    print_table(
        f"Linearizable reads ({mode}, {report['settings']['replicas']} replicas)", columns, rows
    )
