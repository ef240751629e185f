"""``sdpaxos bench throughput``: peak throughput of the protocols, replicas as processes.

N replicas (fsync on) on loopback, each in its own cgroup with ``--cpu`` CPUs (equal machines;
``--straggler F`` gives one replica F times that share, the paper's §5.1 straggler: each of the
``--straggler-replica`` choices is a configuration of its own, run beside the same one without
a straggler so that each protocol's loss is measured in the same run); closed-loop
clients in ``--client-procs`` separate processes keep ``--outstanding`` requests in flight on
each of ``--clients`` connections. Connections are spread over the replicas, except for
Multi-Paxos, where they all go to the leader (as in the paper: a follower would only forward).
Commands are ``--size``-byte puts, or with ``--reads`` percent linearizable reads, over
uniformly random keys; with ``--contention P`` (the paper's §5.2, Fig. 10) P percent of them
touch one hot key and the rest keys of their own, each P a configuration of its own (EPaxos
orders only conflicting commands: its throughput falls as P grows, the others' do not).
Writes are blind (acknowledged when ready).

Several protocols in one run are interleaved: round r runs them in an order rotated by r, each on
a fresh cluster, so machine noise spreads over all of them. Reported per configuration and
protocol: median (min-max) throughput over the rounds, write and read latency percentiles (all
rounds' HDR histograms merged) and each process's CPU use.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from typing import Any

from bench.harness import (
    TLS_SUFFIX,
    BenchProgress,
    BenchSession,
    LoadPlan,
    add_common_arguments,
    interrupts_to_exit_code,
    machine_info,
    parse_protocols,
    print_table,
    run_load,
    scrape_metrics,
    spread,
    summary_ms,
    write_json,
)
from bench.loadgen import new_histogram
from bench.workload import HOT_PREFIX
from consensus.config import SITES
from consensus.runtime.local_cluster import LocalCluster
from consensus.statemachine import SESSION_WINDOW

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--protocols",
        type=parse_protocols,
        default=parse_protocols("sdpaxos,multipaxos,mencius,epaxos"),
        help="comma-separated, interleaved round by round",
    )
    parser.add_argument("--replicas", type=int, nargs="+", choices=(3, 5), default=[3],
                        help="replica counts, measured one after the other")
    parser.add_argument(
        "--size",
        type=int,
        nargs="+",
        default=[16],
        help="command bytes (16 and 1024 are the paper's)",
    )
    parser.add_argument(
        "--reads",
        type=float,
        nargs="+",
        default=[0.0],
        help="percent of linearizable reads (0-100)",
    )
    parser.add_argument(
        "--contention",
        type=float,
        nargs="+",
        default=None,
        metavar="P",
        help="percent of commands on one hot key, the rest on keys of their own (0-100); "
        "one configuration per value (default: uniform keys, no hot key)",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=72,
        help="client connections in all (peak throughput needs deep queues: replicas batch "
        "what a turn brings, and bigger batches cost less per command)",
    )
    parser.add_argument(
        "--outstanding",
        type=int,
        default=32,
        help=f"requests in flight per connection (at most {SESSION_WINDOW})",
    )
    parser.add_argument("--client-procs", type=int, default=3, help="load-generator processes")
    parser.add_argument(
        "--cpu", type=float, default=0.3, help="CPUs per replica through a cgroup (0: unlimited)"
    )
    parser.add_argument(
        "--straggler",
        type=float,
        default=None,
        metavar="F",
        help="one replica gets F times the others' CPU share (e.g. 0.33)",
    )
    parser.add_argument(
        "--straggler-replica",
        type=int,
        nargs="+",
        default=[0],
        help="which replicas straggle, one configuration each (0: the SDPaxos sequencer, the "
        "Multi-Paxos leader)",
    )
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every protocol, interleaved")
    parser.add_argument(
        "--tls", action="store_true",
        help="run each protocol twice, over mutual TLS 1.3 (as PROTOCOL+tls) and without, "
        "interleaved, and report TLS's cost",
    )
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.5,
                        help="seconds of load before measuring")
    add_common_arguments(
        parser, "short settings, only the first replica count, size and read share: under a minute"
    )


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.outstanding <= SESSION_WINDOW:
        raise SystemExit(f"--outstanding must be in 1..{SESSION_WINDOW}")
    if any(not 0 <= r <= 100 for r in args.reads):
        raise SystemExit("--reads is a percentage (0-100)")
    contention: list[float | None] = list(args.contention) if args.contention else [None]
    if any(c is not None and not 0 <= c <= 100 for c in contention):
        raise SystemExit("--contention is a percentage (0-100)")
    if args.quick:
        args.replicas, args.size, args.reads = args.replicas[:1], args.size[:1], args.reads[:1]
        args.straggler_replica = args.straggler_replica[:1]
        args.rounds, args.duration, args.warmup = 1, 1.5, 0.5
    stragglers: list[int | None] = [None]
    if args.straggler is not None:
        stragglers += args.straggler_replica
    configs = list(
        itertools.product(args.replicas, args.size, args.reads, stragglers, contention)
    )
    if args.tls:  # each protocol beside itself over TLS, interleaved like protocols
        args.protocols = [v for p in args.protocols for v in (p, p + TLS_SUFFIX)]
    with interrupts_to_exit_code("throughput") as code:
        report = measure(args, configs)
        write_json(args.json, report)
        show(report)
        if args.plot:
            from bench.plots import throughput_figure

            throughput_figure(report, args.plot)
    return code[0]


def measure(
    args: argparse.Namespace, configs: list[tuple[int, int, float, int | None, float | None]]
) -> dict[str, Any]:
    machine = machine_info()
    protocols: list[str] = args.protocols
    with BenchSession("throughput", args.workdir, fsync=not args.no_fsync) as session:
        limiter = session.limiter
        if not limiter.available and (args.cpu > 0 or args.straggler is not None):
            print(f"CPU limits unavailable, running unlimited: {limiter.reason}")
        steps = len(configs) * args.rounds * len(protocols)
        results = []
        with BenchProgress("throughput", steps) as progress:
            for replicas, size, reads, straggling, hot in configs:
                cpus = [args.cpu] * replicas
                straggler = None
                if straggling is not None:
                    victim = straggling % replicas
                    cpus[victim] = (args.cpu or 1.0) * args.straggler
                    quota, period = limiter.quota_for(cpus[victim])
                    straggler = {
                        "replica": victim, "site": SITES[victim], "cpus": cpus[victim],
                        "effective_cpus": round(quota / period, 4) if limiter.available else None,
                    }  # fmt: skip
                trials: dict[str, list[dict[str, Any]]] = {p: [] for p in protocols}
                histograms = {p: (new_histogram(), new_histogram()) for p in protocols}
                for round_ in range(args.rounds):
                    shift = round_ % len(protocols)
                    for protocol in protocols[shift:] + protocols[:shift]:
                        contended = "" if hot is None else f", {hot:g}% contention"
                        progress.begin(
                            f"N={replicas} {size} B {reads:g}% reads{contended}, {protocol}, "
                            f"round {round_ + 1}/{args.rounds}"
                        )
                        trial, writes, read_hist = _trial(
                            session, progress, args, protocol, replicas, size, reads, cpus, hot
                        )
                        trials[protocol].append(trial)
                        histograms[protocol][0].add(writes)
                        histograms[protocol][1].add(read_hist)
                        progress.end()
                for protocol in protocols:
                    rates = [t["throughput_per_s"] for t in trials[protocol]]
                    results.append({
                        "protocol": protocol, "replicas": replicas, "size": size,
                        "reads_pct": reads, "straggler": straggler, "contention_pct": hot,
                        "throughput_per_s": round(statistics.median(rates)),
                        "throughput_min": round(min(rates)),
                        "throughput_max": round(max(rates)),
                        "write_latency_ms": summary_ms(histograms[protocol][0]),
                        "read_latency_ms": summary_ms(histograms[protocol][1]),
                        "peer_bytes_per_command": _median_of(
                            trials[protocol], "peer_bytes_per_command"
                        ),
                        "rounds": trials[protocol],
                    })  # fmt: skip
        _losses(results)
        _tls_cost(results)
        _ratios(results)
        return {
            "bench": "throughput",
            "machine": machine,
            "settings": {
                "protocols": protocols, "clients": args.clients,
                "outstanding": args.outstanding, "client_procs": args.client_procs,
                "duration_s": args.duration, "warmup_s": args.warmup, "rounds": args.rounds,
                "fsync": not args.no_fsync, "seed": args.seed, "quick": args.quick,
                "multipaxos_clients": "all to the leader",
            },
            "cpu_limit": {
                "mechanism": limiter.kind, "detail": limiter.reason,
                "per_replica_cpus": args.cpu if limiter.available else None,
            },
            "results": results,
        }  # fmt: skip


def _trial(
    session: BenchSession,
    progress: BenchProgress,
    args: argparse.Namespace,
    protocol: str,
    replicas: int,
    size: int,
    reads: float,
    cpus: list[float],
    hot: float | None = None,
) -> tuple[dict[str, Any], Any, Any]:
    tls = protocol.endswith(TLS_SUFFIX)
    protocol = protocol.removesuffix(TLS_SUFFIX)
    cluster = session.start_cluster(f"{protocol}-n{replicas}{TLS_SUFFIX if tls else ''}",
                                    replicas, protocol, cpus=cpus, tls=tls)
    try:
        targets = [0] if protocol == "multipaxos" else list(range(replicas))
        plan = LoadPlan(
            mode="closed",
            sites=spread(targets, SITES, args.clients, args.outstanding, args.client_procs),
            warmup=args.warmup, duration=args.duration, size=size, reads=reads / 100,
            seed=args.seed, dist="uniform" if hot is None else f"{HOT_PREFIX}{hot:g}",
        )  # fmt: skip
        result = run_load(session, cluster, plan, progress)
        traffic = _peer_traffic(cluster, replicas)
    finally:
        session.stop_cluster(cluster)
    trial = {
        "throughput_per_s": round(result.throughput()),
        "write_throughput_per_s": round(result.throughput("ready")),
        "read_throughput_per_s": round(result.throughput("read")),
        "cpu": result.cpu,
        **traffic,
        **result.problems(),
        "first_error": result.first_error(),
    }
    return trial, result.histogram("ready"), result.histogram("read")


def _peer_traffic(cluster: LocalCluster, replicas: int) -> dict[str, Any]:
    """Bytes replicas sent each other per command applied, over the whole trial: in all, and
    by the replica that sent the most (a leader's fan-out shows here). None if a replica's
    metrics did not answer."""
    scraped = [scrape_metrics(cluster, r) for r in range(replicas)]
    sent = [m.get("sdpaxos_peer_bytes_sent_total") for m in scraped]
    applied = max(m.get("sdpaxos_commands_applied_total", 0.0) for m in scraped)
    # an instance recovered while its owner lives costs a Prepare round and fails the
    # owner's commands in it: under load, a sign of suspicion outrunning slow turns
    recoveries = round(sum(m.get("sdpaxos_c_recoveries_total", 0.0) for m in scraped))
    if None in sent or not applied:
        return {
            "peer_bytes_per_command": None,
            "busiest_sender_bytes_per_command": None,
            "c_recoveries": recoveries,
        }
    counts = [float(b) for b in sent if b is not None]
    return {
        "peer_bytes_per_command": round(sum(counts) / applied),
        "busiest_sender_bytes_per_command": round(max(counts) / applied),
        "c_recoveries": recoveries,
    }


def _median_of(trials: list[dict[str, Any]], key: str) -> int | None:
    values = [t[key] for t in trials if t.get(key) is not None]
    return round(statistics.median(values)) if values else None


def _losses(results: list[dict[str, Any]]) -> None:
    """Each straggler result's throughput loss against the same configuration without one."""
    baseline = {
        (r["protocol"], r["replicas"], r["size"], r["reads_pct"], r["contention_pct"]):
        r["throughput_per_s"]
        for r in results if r["straggler"] is None
    }  # fmt: skip
    for r in results:
        base = baseline.get(
            (r["protocol"], r["replicas"], r["size"], r["reads_pct"], r["contention_pct"])
        )
        r["loss_pct"] = (
            round(100 * (1 - r["throughput_per_s"] / base), 1)
            if r["straggler"] is not None and base else None
        )  # fmt: skip


def _tls_cost(results: list[dict[str, Any]]) -> None:
    """``--tls``: each TLS result's throughput as a share of the same run without TLS."""
    plain = {
        (r["protocol"], r["replicas"], r["size"], r["reads_pct"], str(r["straggler"])): r
        for r in results if not r["protocol"].endswith(TLS_SUFFIX)
    }  # fmt: skip
    for r in results:
        if not r["protocol"].endswith(TLS_SUFFIX):
            continue
        base = plain.get((r["protocol"].removesuffix(TLS_SUFFIX), r["replicas"], r["size"],
                          r["reads_pct"], str(r["straggler"])))
        if base and base["throughput_per_s"]:
            r["tls_throughput_ratio"] = round(r["throughput_per_s"] / base["throughput_per_s"], 3)


def _ratios(results: list[dict[str, Any]]) -> None:
    """Each result's throughput as a ratio of EPaxos's in the same configuration and run (the
    paper's claim: SDPaxos 1.7x EPaxos at 5 % contention), when EPaxos ran."""
    epaxos = {
        (r["replicas"], r["size"], r["reads_pct"], str(r["straggler"]), r["contention_pct"]):
        r["throughput_per_s"]
        for r in results if r["protocol"] == "epaxos"
    }  # fmt: skip
    for r in results:
        base = epaxos.get(
            (r["replicas"], r["size"], r["reads_pct"], str(r["straggler"]), r["contention_pct"])
        )
        r["vs_epaxos"] = round(r["throughput_per_s"] / base, 2) if base else None


def show(report: dict[str, Any]) -> None:
    limit = report["cpu_limit"]
    title = (
        f"Throughput (closed loop, {report['settings']['clients']} connections x "
        f"{report['settings']['outstanding']} outstanding; CPU limit: "
        f"{limit['per_replica_cpus'] or 'none'} per replica via {limit['mechanism']})"
    )
    rows = []
    for r in report["results"]:
        cpu = [
            statistics.fmean(t["cpu"].get(f"replica-{i}", 0.0) for t in r["rounds"])
            for i in range(r["replicas"])
        ]
        straggler = r["straggler"]
        hot = r.get("contention_pct")
        rows.append([
            r["protocol"], r["replicas"], r["size"], r["reads_pct"],
            "-" if hot is None else f"{hot:g} %",
            f"{straggler['site']} @ {straggler['cpus']:.2f}" if straggler else "-",
            r["throughput_per_s"], f"{r['throughput_min']:,}-{r['throughput_max']:,}",
            "-" if r["loss_pct"] is None else f"{r['loss_pct']:g} %",
            r["write_latency_ms"]["p50_ms"], r["write_latency_ms"]["p99_ms"],
            r["read_latency_ms"]["p50_ms"], r["read_latency_ms"]["p99_ms"],
            " ".join(f"{c:.2f}" for c in cpu),
            "-" if r.get("peer_bytes_per_command") is None else r["peer_bytes_per_command"],
            "-" if r.get("vs_epaxos") is None else f"{r['vs_epaxos']:.2f}x",
        ])  # fmt: skip
    print_table(
        title,
        ["protocol", "N", "bytes", "reads %", "contention", "straggler", "ops/s (median)",
         "min-max", "loss", "write p50 ms", "write p99", "read p50 ms", "read p99",
         "replica CPUs used", "peer B/cmd", "vs EPaxos"],
        rows,
    )  # fmt: skip
    for r in report["results"]:
        straggler = f", straggler at {r['straggler']['site']}" if r["straggler"] else ""
        what = f"{r['protocol']}, {r['replicas']} replicas, {r['size']} B{straggler}"
        errors = sum(t["errors"] for t in r["rounds"])
        if errors:
            first = next((t["first_error"] for t in r["rounds"] if t["first_error"]), "")
            print(f"{what}: {errors} requests answered with an error (first: {first})")
        recoveries = sum(t.get("c_recoveries") or 0 for t in r["rounds"])
        if recoveries:
            print(f"{what}: {recoveries} C-instance recoveries started (no replica failed)")
        timeouts = sum(t["timeouts"] for t in r["rounds"])
        if timeouts:
            # A straggler's clients, or a closed loop deeper than the cluster drains: past
            # saturation requests outlive the replicas' retransmission timeouts too, and
            # copies crowd the links.
            print(f"{what}: {timeouts} requests timed out in the load generator and were "
                  "replaced (without a straggler: past saturation, fewer --outstanding finds "
                  "the peak)")
    for r in report["results"]:
        if "tls_throughput_ratio" in r:
            print(f"TLS cost: {r['protocol']}, {r['replicas']} replicas, {r['size']} B, "
                  f"{r['reads_pct']:g}% reads: {r['throughput_per_s']} ops/s, "
                  f"{r['tls_throughput_ratio']:.3f} x the same run without TLS")
