"""``sdpaxos bench failover``: kill a replica under load (paper §5.5, Fig. 14), for every
protocol on the same kill.

Replicas as processes (LAN by default, the default LAN timeouts: 50 ms heartbeats, 300 ms
election timeout, 250 ms leases; ``--wan`` for the paper's RTTs); a closed-loop client process
per site loads its own replica. ``--before`` seconds into the measured window the replica the
protocol leans on is killed with SIGKILL: the SDPaxos sequencer (asked through the metrics
endpoint), the Multi-Paxos leader (replica 0, CA, until a failover), and for Mencius and
EPaxos replica 0 too — the same site everywhere. Multi-Paxos fails over by a phase-1 takeover,
Mencius by revoking the dead replica's slots, EPaxos by recovering its instances. Reported per
protocol and site: completed requests per 100 ms bin (the timeline), the *stall* — the longest
pause between consecutive completions that spans the kill — and how long after the kill
completions resumed. Protocols are interleaved round by round, each on a fresh cluster.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from typing import Any

from bench.bounds import sites_for
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
    sequencer_of,
    write_json,
)

__all__ = ["add_arguments", "run", "stall_after"]

BIN_S = 0.1


#: the replica killed when the protocol has no sequencer to ask for (the Multi-Paxos leader
#: at start, and CA, where SDPaxos's first sequencer is)
DEFAULT_VICTIM = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--protocols",
        type=parse_protocols,
        default=parse_protocols("sdpaxos,multipaxos,mencius,epaxos"),
        help="comma-separated, interleaved round by round",
    )
    parser.add_argument("--replicas", type=int, choices=(3, 5), default=3,
                        help="how many replicas (sites CA, OR, OH, VA, JP in that order)")
    parser.add_argument("--wan", action="store_true", help="the paper's RTTs between sites")
    parser.add_argument("--connections", type=int, default=2, help="per site")
    parser.add_argument("--outstanding", type=int, default=8, help="per connection")
    parser.add_argument("--before", type=float, default=2.0, help="seconds of load before")
    parser.add_argument("--after", type=float, default=3.0, help="seconds of load after")
    parser.add_argument("--rounds", type=int, default=3, help="kills, each on a fresh cluster")
    add_common_arguments(parser)


def stall_after(
    gaps: list[tuple[float, float]], kill_at: float, horizon: float
) -> tuple[float | None, float | None]:
    """(longest gap between completions that ends after the kill and starts before
    ``kill_at + horizon``; when completions resumed, from the kill), in seconds."""
    spanning = [
        (start, length)
        for start, length in gaps
        if start + length > kill_at and start < kill_at + horizon
    ]
    if not spanning:
        return None, None
    start, length = max(spanning, key=lambda gap: gap[1])
    return length, start + length - kill_at


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.before, args.after, args.rounds = 1.0, 2.0, 1
    with interrupts_to_exit_code("failover") as code:
        report = measure(args)
        write_json(args.json, report)
        show(report)
        if args.plot:
            from bench.plots import failover_figure

            failover_figure(report, args.plot)
    return code[0]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    machine = machine_info()
    sites = sites_for(args.replicas)
    runs = []
    protocols: list[str] = args.protocols
    schedule = [
        (round_, protocol)
        for round_ in range(args.rounds)
        for protocol in protocols[round_ % len(protocols):] + protocols[:round_ % len(protocols)]
    ]
    with (
        BenchSession("failover", args.workdir, fsync=not args.no_fsync) as session,
        BenchProgress("failover", len(schedule)) as progress,
    ):
        for round_, protocol in schedule:
            progress.begin(f"N={args.replicas}, {protocol}, kill {round_ + 1}/{args.rounds}")
            cluster = session.start_cluster(
                f"{protocol}-n{args.replicas}", args.replicas, protocol, wan=args.wan
            )
            try:
                victim = sequencer_of(cluster) if protocol == "sdpaxos" else DEFAULT_VICTIM
                if victim is None:
                    raise RuntimeError("no replica reports being the sequencer")
                plan = LoadPlan(
                    mode="closed",
                    sites=tuple(
                        SiteLoad(site, i, args.connections, args.outstanding, process=i)
                        for i, site in enumerate(sites)
                    ),
                    warmup=0.5, duration=args.before + args.after, drain=3.0, bin_s=BIN_S,
                    request_timeout=5.0, seed=args.seed + round_,
                )  # fmt: skip
                result = run_load(
                    session,
                    cluster,
                    plan,
                    progress,
                    events=[(args.before, functools.partial(cluster.kill, victim))],
                )
                new_sequencer = sequencer_of(cluster) if protocol == "sdpaxos" else None
            finally:
                session.stop_cluster(cluster)
            kill_at = plan.warmup + args.before  # from start_at, as the timelines are
            bins = int((kill_at + args.after) / BIN_S)
            per_site = []
            for site in result.sites:
                stall, resumed = stall_after(site.gaps, kill_at, args.after)
                before = site.timeline[int(plan.warmup / BIN_S) : int(kill_at / BIN_S)]
                per_site.append({
                    "site": site.site,
                    "killed": site.site == sites[victim],
                    "stall_ms": None if stall is None else round(stall * 1000, 1),
                    "resumed_after_kill_ms": None if resumed is None else round(resumed * 1000, 1),
                    "throughput_before_per_s": round(sum(before) / (len(before) * BIN_S))
                    if before else None,
                    "timeline": site.timeline[:bins],
                    "timeouts": site.timeouts, "lost": site.lost, "errors": site.errors,
                })  # fmt: skip
            runs.append({
                "protocol": protocol, "killed_site": sites[victim], "killed_replica": victim,
                "new_sequencer": None if new_sequencer is None else sites[new_sequencer],
                "kill_at_s": kill_at, "bin_s": BIN_S, "sites": per_site,
            })  # fmt: skip
            progress.end()
    stalls = {}
    for protocol in protocols:
        survivors = [s["stall_ms"] for r in runs if r["protocol"] == protocol
                     for s in r["sites"] if not s["killed"]]  # fmt: skip
        measured = [s for s in survivors if s is not None]
        stalls[protocol] = {
            "median": statistics.median(measured) if measured else None,
            "max": max(measured) if measured else None,
            "sites_measured": len(measured), "sites": len(survivors),
        }  # fmt: skip
    return {
        "bench": "failover",
        "machine": machine,
        "settings": {
            "replicas": args.replicas, "wan": args.wan, "connections": args.connections,
            "outstanding": args.outstanding, "before_s": args.before, "after_s": args.after,
            "protocols": protocols,
            "rounds": args.rounds, "heartbeat_ms": 50, "election_timeout_ms": 300,
            "fsync": not args.no_fsync, "seed": args.seed, "quick": args.quick,
        },
        "stall_ms": stalls,
        "runs": runs,
    }  # fmt: skip


def show(report: dict[str, Any]) -> None:
    rows = []
    for k, run in enumerate(report["runs"]):
        for site in run["sites"]:
            rows.append([
                k + 1, run["protocol"], site["site"], "killed" if site["killed"] else "",
                site["throughput_before_per_s"], site["stall_ms"],
                site["resumed_after_kill_ms"], run["new_sequencer"] or "-",
            ])  # fmt: skip
    settings = report["settings"]
    print_table(
        f"Failover on the same kill, {settings['replicas']} replicas, "
        f"{'WAN' if settings['wan'] else 'LAN'}, heartbeat {settings['heartbeat_ms']} ms, "
        f"election timeout {settings['election_timeout_ms']} ms",
        ["run", "protocol", "site", "", "ops/s before", "stall ms", "resumed ms after kill",
         "new sequencer"],
        rows,
    )  # fmt: skip
    for protocol, stall in report["stall_ms"].items():
        print(f"{protocol}: stall median {stall['median']} ms, max {stall['max']} ms "
              f"({stall['sites_measured']} of {stall['sites']} surviving sites stalled)")
