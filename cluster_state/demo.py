"""``sdpaxos demo``: a local geo-replicated GPU allocation store under a scheduler workload.

What it does, in order:

1. writes a HiveD-style GPU cluster (64 nodes x 8 GPUs in racks of 8, 4 virtual clusters, two
   with a pinned node) and a cluster file for 3 (or 5) replicas at the paper's sites, with the
   paper's WAN round trips emulated by the transport, and starts the replicas as processes;
2. runs one scheduler per site, each talking to the replica at its own site: it submits gang
   jobs of mixed sizes and priorities (``cluster_state.workload``), releases the victims of a
   preemption it started, and releases each job when its (short) run time is over;
3. shows a live view: allocation latency and throughput per site, GPU use per VC, the current
   sequencer and view;
4. midway (unless ``--no-failover``) kills the sequencer, shows the failover, restarts the old
   replica and waits until it has caught up; with ``--replace`` it replaces it instead (as if
   its disk were gone): a new replica at the same site on new ports joins as a learner
   (``sdpaxos member replace``), catches up, and is promoted in the old one's place;
5. stops the schedulers and checks: every replica's state identical, no GPU held by two groups
   (in the final state and at any point of the watch stream), the per-VC accounting within its
   quota, and every acknowledged placement that nobody released still present. Exit status 1
   if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_state.ledger import GpuLedger, double_allocations
from cluster_state.workload import JobSpec, next_job

__all__ = ["add_arguments", "run"]

#: the demo's GPU cluster: 64 DGX-like nodes (8 GPUs) in racks of 8, 4 VCs, 2 with a pinned node
GPU_NODES, GPU_VCS, GPU_PINNED = 64, 4, 2


@dataclass
class SiteStats:
    site: str
    submitted: int = 0
    placed: int = 0
    preempting: int = 0
    waiting: int = 0
    errors: int = 0
    released: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=5000))
    spans: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=5000))

    def percentile(self, q: float) -> float | None:
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms[-2000:])
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def rate(self, now: float, window: float = 5.0) -> float:
        return sum(1 for t in self.recent if t > now - window) / window


@dataclass
class DemoState:
    sites: dict[str, SiteStats]
    phase: str = "starting"
    sequencer: int = -1
    view: int = -1
    vcs: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # used, total, groups
    events: list[str] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)  # placed group -> fencing token
    released: set[str] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)
    failover_s: float | None = None  # from the kill to the next allocation anywhere
    #: replicas a replace took out of the cluster (``--replace``)
    removed: set[int] = field(default_factory=set)

    def note(self, text: str) -> None:
        self.events.append(f"{time.monotonic() - self.started:6.1f}s  {text}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, choices=(3, 5), default=3,
                        help="how many replicas (sites CA, OR, OH, VA, JP in that order)")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of workload")
    parser.add_argument("--no-failover", action="store_true", help="do not kill the sequencer")
    parser.add_argument("--replace", action="store_true",
                        help="replace the killed sequencer with a new replica (a learner that "
                        "catches up and is promoted) instead of restarting it")
    parser.add_argument("--schedulers-per-site", type=int, default=4,
                        help="scheduler clients per site")
    parser.add_argument("--seed", type=int, default=1, help="the workload's seed")
    parser.add_argument("--dir", help="keep the cluster's files here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")


def run(args: argparse.Namespace) -> int:
    if not args.duration > 0 or args.schedulers_per_site < 1:  # impossible: a usage error
        print("sdpaxos demo: error: --duration and --schedulers-per-site must be positive",
              file=sys.stderr)
        return 2
    if args.dir:
        return asyncio.run(_demo(args, Path(args.dir)))
    with tempfile.TemporaryDirectory(prefix="sdpaxos-demo-") as tmp:
        return asyncio.run(_demo(args, Path(tmp)))


# ---------------------------------------------------------------------------- the run


async def _demo(args: argparse.Namespace, directory: Path) -> int:
    from rich.console import Console
    from rich.live import Live

    from cluster_state.config import synthetic_config
    from consensus.config import SITES
    from consensus.runtime.local_cluster import LocalCluster

    console = Console(stderr=args.json)
    directory.mkdir(parents=True, exist_ok=True)
    gpu_path = directory / "gpu-cluster.yaml"
    gpu_path.write_text(
        synthetic_config(nodes=GPU_NODES, vcs=GPU_VCS, pinned=GPU_PINNED).to_yaml()
    )
    cluster = LocalCluster(
        directory, args.replicas, wan=True, grpc=True,  # gRPC: where watches are pushed from
        state_machine=f'kind = "cluster_state"\ngpu_config = "{gpu_path.name}"',
    )
    sites = list(SITES[: args.replicas])
    state = DemoState(sites={site: SiteStats(site) for site in sites})
    cluster.start_all()
    try:
        with Live(_render(state), console=console, refresh_per_second=4,
                  transient=args.json) as live:
            report = await _drive(args, cluster, state, sites, live)
    finally:
        cluster.stop_all()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(console, report)
    return 0 if report["ok"] else 1


async def _drive(
    args: argparse.Namespace, cluster: Any, state: DemoState, sites: list[str], live: Any
) -> dict[str, Any]:
    from cluster_state.client import AllocationStore

    addresses = cluster.client_addresses
    await _wait_serving(cluster)
    state.phase = "running"
    state.note(f"{len(sites)} replicas serving; schedulers start")
    ledger = GpuLedger()
    stop = asyncio.Event()
    watch_targets = [f"{a[0]}:{a[1]}" for a in cluster.grpc_addresses if a is not None]
    watcher_store = AllocationStore.connect(addresses, client_id=900, home=0,
                                            watch_targets=watch_targets)
    tasks = [asyncio.create_task(_watch(watcher_store, ledger, state, stop))]
    rng = random.Random(args.seed)
    stores = []
    for home, site in enumerate(sites):
        for k in range(args.schedulers_per_site):
            client_id = 1000 + home * 100 + k
            store = AllocationStore.connect(addresses, client_id=client_id, home=home)
            stores.append(store)
            tasks.append(asyncio.create_task(_scheduler(
                store, state, state.sites[site], f"{site.lower()}{k}",
                random.Random(rng.getrandbits(64)), stop,
            )))
    tasks.append(asyncio.create_task(_observe(cluster, watcher_store, state, stop)))
    refresher = asyncio.create_task(_refresh(live, state, stop))
    try:
        if args.no_failover:
            await asyncio.sleep(args.duration)
        else:
            await _failover(args, cluster, state)
    finally:
        stop.set()
        await asyncio.gather(*tasks, refresher, return_exceptions=True)
    state.phase = "checking"
    live.update(_render(state))
    report = await _check(cluster, state, ledger, watcher_store)
    for store in [*stores, watcher_store]:
        await store.close()
    return report


async def _failover(args: argparse.Namespace, cluster: Any, state: DemoState) -> None:
    await asyncio.sleep(args.duration * 0.4)
    victim = state.sequencer if state.sequencer >= 0 else 0
    state.phase = f"sequencer (replica {victim}) killed"
    state.note(f"kill -9 the sequencer, replica {victim} ({_site(cluster, victim)})")
    killed_at = time.monotonic()
    old_view = state.view
    cluster.kill(victim)
    while state.view == old_view or state.sequencer in (-1, victim):
        await asyncio.sleep(0.05)
        if time.monotonic() - killed_at > 15:
            break
    while True:  # the stall: from the kill to the first answer to a request made after it
        first = min((end for stats in state.sites.values() for begin, end in stats.spans
                     if begin > killed_at), default=None)
        if first is not None or time.monotonic() - killed_at > 15:
            break
        await asyncio.sleep(0.05)
    stall = f"first new allocation after {first - killed_at:.2f}s" if first else "none yet"
    state.note(
        f"view {state.view}: replica {state.sequencer} ({_site(cluster, state.sequencer)}) "
        f"is sequencer ({stall})"
    )
    state.failover_s = first - killed_at if first else None
    await asyncio.sleep(args.duration * 0.15)
    if args.replace:
        await _replace(cluster, state, victim)
        remaining = args.duration - (time.monotonic() - state.started)
        await asyncio.sleep(max(0.0, remaining))
        return
    state.phase = f"replica {victim} restarting"
    cluster.start(victim)
    restarted = time.monotonic()
    state.note(f"replica {victim} restarted from its write-ahead log")
    while time.monotonic() - restarted < 30:
        executed = [_metric(cluster, r, "sdpaxos_executed_slots") or 0.0 for r in _ids(cluster)]
        if executed[victim] > 0 and max(executed) - executed[victim] < 50:
            state.note(f"replica {victim} caught up in {time.monotonic() - restarted:.2f}s")
            break
        await asyncio.sleep(0.2)
    state.phase = "running"
    remaining = args.duration - (time.monotonic() - state.started)
    await asyncio.sleep(max(0.0, remaining))


async def _replace(cluster: Any, state: DemoState, victim: int) -> None:
    """Replace the dead ``victim`` with a new member at its site: it learns the log, then the
    sequencer promotes it in the victim's place (``sdpaxos member replace``)."""
    from consensus.protocol.membership import Change, encode_change
    from consensus.protocol.membership.config import REPLACE
    from consensus.runtime.client import Client
    from consensus.runtime.members import info_of_spec

    spec = cluster.add_member_entry(_site(cluster, victim))
    state.phase = f"replica {victim} replaced by {spec.id}"
    started = time.monotonic()
    live = [cluster.client_addresses[r] for r in _ids(cluster) if r not in (victim, spec.id)]
    change = Change(REPLACE, spec.id, replaces=victim, info=info_of_spec(spec).encode())
    async with Client(990, live, timeout_s=3.0, attempts=len(live)) as client:
        answer = (await client.execute(encode_change(change), ())).payload
        text = answer.decode(errors="replace") if isinstance(answer, bytes) else answer
        state.note(f"member replace {victim}: {text}")
        cluster.start(spec.id)
        state.removed.add(victim)
        learning_noted = False
        while time.monotonic() - started < 60:
            status = await client.status()
            members = {m["id"]: m for m in (status.get("membership") or {}).get("members", [])}
            entry = members.get(spec.id)
            if entry is not None and entry["voter"] and victim not in members:
                epoch = status["membership"]["epoch"]
                state.note(f"replica {spec.id} promoted in {time.monotonic() - started:.2f}s: "
                           f"epoch {epoch}, voters {status['membership']['voters']}")
                break
            executed = _metric(cluster, spec.id, "sdpaxos_executed_slots")
            if executed and not learning_noted:
                learning_noted = True
                state.note(f"replica {spec.id} learning: applied {executed:.0f} of "
                           f"{status['applied']} slots")
            await asyncio.sleep(0.2)
    state.phase = "running"


async def _scheduler(
    store: Any, state: DemoState, stats: SiteStats, prefix: str, rng: random.Random,
    stop: asyncio.Event,
) -> None:
    from cluster_state.ops import GroupSpec, Member, Placed, Preempting, Waiting

    vcs = list(state.vcs) or [f"vc{k:02d}" for k in range(GPU_VCS)]
    running: list[tuple[float, str]] = []
    n = 0
    while not stop.is_set():
        now = time.monotonic()
        for due, name in [r for r in running if r[0] <= now]:
            running.remove((due, name))
            await _release(store, state, stats, name)
        n += 1
        job: JobSpec = next_job(rng, f"{prefix}-{n}", vcs, mean_duration_s=3.0)
        spec = GroupSpec(name=job.name, vc=job.vc, priority=job.priority,
                         members=tuple(Member(p, g) for p, g in job.members))
        stats.submitted += 1
        started = time.monotonic()
        try:
            result = await store.submit(spec)
        except Exception as exc:  # an indefinite failure during the failover, say
            stats.errors += 1
            state.note(f"{job.name}: {exc}")
            await asyncio.sleep(0.2)
            continue
        stats.latencies_ms.append((time.monotonic() - started) * 1000)
        stats.recent.append(time.monotonic())
        stats.spans.append((started, time.monotonic()))
        if isinstance(result, Placed):
            stats.placed += 1
            state.acked[job.name] = result.token
            running.append((time.monotonic() + job.duration_s, job.name))
        elif isinstance(result, Preempting):
            stats.preempting += 1
            for victim in result.victims:  # as a scheduler would, stop the victims' pods
                await _release(store, state, stats, victim)
            running.append((time.monotonic() + job.duration_s, job.name))
        elif isinstance(result, Waiting):
            stats.waiting += 1
            await asyncio.sleep(rng.uniform(0.05, 0.3))
    for _, name in running:
        await _release(store, state, stats, name)


async def _release(store: Any, state: DemoState, stats: SiteStats, name: str) -> None:
    state.released.add(name)  # from now on, its absence is no loss
    with contextlib.suppress(Exception):  # released already (a preemptor's scheduler did)
        await store.release(name)
        stats.released += 1


async def _watch(store: Any, ledger: GpuLedger, state: DemoState, stop: asyncio.Event) -> None:
    from consensus.errors import SDPaxosError

    while not stop.is_set():
        try:
            async for event in store.watch(ledger.revision if ledger.placements else -1):
                ledger.apply(event)
                if stop.is_set():
                    return
        except SDPaxosError as exc:  # a failover: resume from the last revision seen
            state.note(f"watch: {exc}; resuming")
            await asyncio.sleep(0.2)


async def _observe(cluster: Any, store: Any, state: DemoState, stop: asyncio.Event) -> None:
    while not stop.is_set():
        for replica in _ids(cluster, state):
            if _metric(cluster, replica, "sdpaxos_is_sequencer") == 1:
                state.sequencer = replica
                view = _metric(cluster, replica, "sdpaxos_view")
                state.view = int(view) if view is not None else -1
        with contextlib.suppress(Exception):
            vcs = {}
            for name in (await store.summary())["vcs"]:
                info = await store.vc(name)
                leaves = info["leaves"]
                vcs[name] = (leaves["used"], leaves["total"], info["groups"])
            state.vcs = vcs
        await asyncio.sleep(0.5)


async def _refresh(live: Any, state: DemoState, stop: asyncio.Event) -> None:
    while not stop.is_set():
        live.update(_render(state))
        await asyncio.sleep(0.25)


# ---------------------------------------------------------------------------- checks


async def _check(cluster: Any, state: DemoState, ledger: GpuLedger, store: Any) -> dict[str, Any]:
    from cluster_state.client import AllocationStore

    # every replica converged on one state (local reads, so each replica answers for itself)
    states: list[Any] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = []
        for replica in _ids(cluster, state):
            local = AllocationStore.connect([cluster.client_addresses[replica]],
                                            client_id=950 + replica, home=0)
            try:
                states.append(await local.allocations(stale=True))
            finally:
                await local.close()
        if all(s == states[0] for s in states):
            break
        await asyncio.sleep(0.5)
    identical = bool(states) and all(s == states[0] for s in states)
    final = await store.allocations()
    present = {group["name"]: group for group in final}
    lost = sorted(
        name for name in state.acked
        if name not in state.released and name not in present
    )
    double_now = double_allocations(final)
    over_quota = [name for name, (used, total, _) in state.vcs.items() if used > total]
    checks = {
        "replicas_identical": identical,
        "no_gpu_allocated_twice": not ledger.violations and not double_now,
        "vc_quotas_respected": not over_quota,
        "no_acknowledged_placement_lost": not lost,
    }
    per_site = {}
    for site, stats in state.sites.items():
        lat = stats.latencies_ms
        per_site[site] = {
            "submitted": stats.submitted, "placed": stats.placed,
            "preempting": stats.preempting, "waiting": stats.waiting, "errors": stats.errors,
            "p50_ms": round(statistics.median(lat), 2) if lat else None,
            "p99_ms": round(sorted(lat)[int(0.99 * (len(lat) - 1))], 2) if lat else None,
        }
    return {
        "ok": all(checks.values()),
        "checks": checks,
        "problems": (ledger.violations + double_now)[:10] + [f"lost {n}" for n in lost[:10]],
        "sites": per_site,
        "placements_seen": ledger.placements,
        "failover_s": state.failover_s,
        "events": state.events,
        "seconds": round(time.monotonic() - state.started, 1),
    }


# ---------------------------------------------------------------------------- helpers


async def _wait_serving(cluster: Any, timeout: float = 60.0) -> None:
    from consensus.runtime.cluster_ops import check_health

    deadline = time.monotonic() + timeout
    for replica in _ids(cluster):
        while not await check_health(cluster.config, replica, timeout_s=1.0):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not start serving:\n" + cluster.logs())
            await asyncio.sleep(0.2)


def _ids(cluster: Any, state: DemoState | None = None) -> list[int]:
    """The replicas (without those a replace removed)."""
    removed = state.removed if state is not None else set()
    return [spec.id for spec in cluster.config.replicas if spec.id not in removed]


def _site(cluster: Any, replica: int) -> str:
    if replica < 0:
        return "?"
    return str(cluster.config.replica(replica).site)


def _metric(cluster: Any, replica: int, name: str) -> float | None:
    address = cluster.config.replica(replica).metrics_address
    if address is None:
        return None
    try:
        with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=0.3) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def _render(state: DemoState) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table

    now = time.monotonic()
    sites = Table(title="schedulers (one per site, at the replica of their site)")
    for column in ("site", "submitted", "placed", "preempting", "waiting", "p50 ms",
                   "p99 ms", "allocs/s"):
        sites.add_column(column, justify="right")
    for stats in state.sites.values():
        p50, p99 = stats.percentile(0.5), stats.percentile(0.99)
        sites.add_row(
            stats.site, str(stats.submitted), str(stats.placed), str(stats.preempting),
            str(stats.waiting), f"{p50:.1f}" if p50 is not None else "-",
            f"{p99:.1f}" if p99 is not None else "-", f"{stats.rate(now):.1f}",
        )
    vcs = Table(title="GPU use per virtual cluster")
    for column in ("vc", "GPUs used", "quota", "groups"):
        vcs.add_column(column, justify="right")
    for name, (used, total, groups) in sorted(state.vcs.items()):
        vcs.add_row(name, str(used), str(total), str(groups))
    header = (
        f"[bold]{state.phase}[/]   sequencer: replica {state.sequencer}   view {state.view}   "
        f"t={now - state.started:.0f}s"
    )
    return Panel(Group(header, sites, vcs, "\n".join(state.events[-6:])),
                 title="sdpaxos demo — geo-replicated GPU allocation store")


def _print_report(console: Any, report: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="checks")
    table.add_column("check")
    table.add_column("result")
    for name, ok in report["checks"].items():
        table.add_row(name.replace("_", " "), "[green]ok[/]" if ok else "[red]FAILED[/]")
    console.print(table)
    for problem in report["problems"]:
        console.print(f"[red]{problem}[/]")
    console.print(f"{report['placements_seen']} placements watched in {report['seconds']}s; "
                  + ("all checks passed" if report["ok"] else "[red]checks failed[/]"))


# ---------------------------------------------------------------------------- sdpaxos scheduler


def add_scheduler_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the cluster file")
    parser.add_argument("--site", required=True, help="schedule through this site's replica")
    parser.add_argument("--schedulers", type=int, default=4, help="scheduler clients to run")
    parser.add_argument("--seed", type=int, default=None,
                        help="the workload's seed (default: random)")


def run_scheduler(args: argparse.Namespace) -> int:
    """The compose demo's scheduler service: the demo's job mix, forever, at one site."""
    from consensus.errors import ConfigError
    from consensus.runtime.cluster_config import load_cluster_config

    if args.schedulers < 1:
        print("sdpaxos scheduler: error: --schedulers must be positive", file=sys.stderr)
        return 2
    try:
        config = load_cluster_config(args.config)
    except ConfigError as exc:
        print(f"sdpaxos scheduler: {exc}")
        return 2
    homes = [spec.id for spec in config.replicas if spec.site == args.site]
    if not homes:
        print(f"sdpaxos scheduler: no replica at site {args.site!r}")
        return 2
    return asyncio.run(_schedule_forever(config, homes[0], args))


async def _schedule_forever(config: Any, home: int, args: argparse.Namespace) -> int:
    import signal

    from cluster_state.client import AllocationStore

    addresses = [spec.client_address for spec in config.replicas]
    stats = SiteStats(args.site)
    state = DemoState(sites={args.site: stats})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    rng = random.Random(args.seed)
    # a TLS cluster (the compose demo): the schedulers present the cluster's client
    # certificate (its [tls] client_cert)
    tls = config.tls.tool() if config.tls is not None else None
    stores = [
        AllocationStore.connect(addresses, client_id=(home + 1) * 10_000 + k + rng.randrange(
            1 << 20) * 100, home=home, tls=tls)
        for k in range(args.schedulers)
    ]
    tasks = [
        asyncio.create_task(_scheduler(store, state, stats, f"{args.site.lower()}{k}-"
                                       f"{rng.getrandbits(24):06x}", random.Random(rng.random()),
                                       stop))
        for k, store in enumerate(stores)
    ]
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await stop.wait()
        p50, p99 = stats.percentile(0.5), stats.percentile(0.99)
        print(json.dumps({"site": args.site, "submitted": stats.submitted, "placed": stats.placed,
                          "waiting": stats.waiting, "errors": stats.errors, "p50_ms": p50,
                          "p99_ms": p99, "allocs_per_s": stats.rate(time.monotonic(), 10)}),
              flush=True)
    await asyncio.gather(*tasks, return_exceptions=True)
    for store in stores:
        await store.close()
    return 0
