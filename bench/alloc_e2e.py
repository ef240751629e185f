"""``sdpaxos bench alloc-e2e``: allocations per second through replicated GPU store processes.

Three (or five) replica processes on loopback, fsync on, serving the allocation store on a
synthetic cluster (``--nodes`` x 8 GPUs, ``--vcs`` virtual clusters). ``--schedulers`` scheduler
clients (default: one per site), spread round-robin over the sites, each one session (client
id) with its own site's replica, keep ``--outstanding`` jobs in flight each: submit a gang from
the demo's job mix (``cluster_state.workload``), release it as soon as the store answers.
Counted: placements per second (each also costs a release through the log, so the log runs
twice as many commands) and the submit latency, in total and per site. At the end every group
must be gone and every replica must hold the same state (snapshot hashes), or the report says
so. The replicas' WAN emulation is off unless ``wan``.

Also reported: ``startup_s``, from starting the replica processes to every replica serving (the
configuration written, parsed and validated in each of them); each replica's resident memory
(``rss_mb``, from /proc) at the end. ``--watchers N`` opens N pushed watch streams (gRPC
``WatchAcked``, acknowledged as ``AllocationStore.watch`` does, spread over the replicas) for the
whole run: each must see every event once,
in order (checked against replica 0's event log), and the report gives the event delay (from
the apply of the command, as the submitting scheduler's answer marks it, to the watcher)
percentiles, the CPU share the watcher processes took (they share the machine with the
replicas) and their acknowledgements per second; ``--slow-watchers K`` of them stop reading
after their first page until the load ends and must be dropped with ``EventsCompacted`` (their
stream's last message, read then) rather than slow anything down. ``--profile DIR`` records every
replica and this process with py-spy (``pip install .[bench]``) and prints the top entries.

Impossible parameters are usage errors (exit 2, one line), checked before anything starts.

    python -m bench.alloc_e2e [--seconds 10] [--outstanding 64]   # prints one JSON object
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "check_arguments", "measure", "run"]

#: GPUs per synthetic node and nodes per rack (``synthetic_config``'s DGX-like defaults)
GPUS_PER_NODE = 8
NODES_PER_RACK = 8
#: the session table remembers this many results per client id (consensus.statemachine): a
#: scheduler with more in flight could see a retry answered "expired"
from consensus.statemachine import SESSION_WINDOW  # noqa: E402  (a constant, kept near its use)

#: the exit status of a usage error (argparse's)
USAGE_ERROR = 2
#: how long the replicas get to start serving before the bench gives up
START_TIMEOUT_S = 300.0
#: py-spy's sampling rate for --profile (samples/s): low, the machine is shared
PROFILE_RATE = 50
#: entries of each profile printed
PROFILE_TOP = 12
#: gRPC connections from the bench to each replica for the watchers
WATCH_CONNECTIONS_PER_REPLICA = 4
#: after the watch streams opened, before the load starts
WATCH_SETTLE_S = 1.0
#: how long the watchers get to see the last change after the load stopped
WATCH_DRAIN_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, choices=(3, 5), default=3,
                        help="how many replicas (sites CA, OR, OH, VA, JP in that order)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of measured load")
    parser.add_argument("--outstanding", type=int, default=64,
                        help=f"jobs in flight per scheduler (below the session window of "
                             f"{SESSION_WINDOW})")
    parser.add_argument("--schedulers", type=int, default=0,
                        help="scheduler clients, round-robin over the sites (default: one "
                             "per site)")
    parser.add_argument("--nodes", type=int, default=1024,
                        help=f"{GPUS_PER_NODE}-GPU nodes, a multiple of {NODES_PER_RACK}")
    parser.add_argument("--vcs", type=int, default=16, help="virtual clusters")
    parser.add_argument("--watchers", type=int, default=0,
                        help="pushed gRPC watch streams open during the run")
    parser.add_argument("--slow-watchers", type=int, default=0,
                        help="of the watchers, how many stop reading after one page")
    parser.add_argument("--wan", action="store_true", help="emulate the paper's WAN delays")
    parser.add_argument("--seed", type=int, default=1, help="the workload's seed")
    parser.add_argument("--profile", metavar="DIR", default="",
                        help="record the replicas and the load generator with py-spy")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def check_arguments(args: argparse.Namespace) -> str | None:
    """What makes these parameters impossible (one line), or None."""
    if not args.seconds > 0:
        return f"--seconds must be positive, not {args.seconds}"
    if not 1 <= args.outstanding < SESSION_WINDOW:
        return (f"--outstanding must be in 1..{SESSION_WINDOW - 1} (a session remembers "
                f"{SESSION_WINDOW} results), not {args.outstanding}")
    if args.schedulers < 0:
        return f"--schedulers must be positive, not {args.schedulers}"
    if args.nodes < NODES_PER_RACK or args.nodes % NODES_PER_RACK:
        return (f"--nodes must be a positive multiple of {NODES_PER_RACK} (racks of "
                f"{NODES_PER_RACK} nodes), not {args.nodes}")
    if args.vcs < 1 or args.nodes // args.vcs < 1:
        return f"--vcs must be in 1..{args.nodes} (a node each at least), not {args.vcs}"
    if args.watchers < 0 or not 0 <= args.slow_watchers <= args.watchers:
        return (f"--watchers must be >= 0 and --slow-watchers in 0..--watchers, not "
                f"{args.watchers} and {args.slow_watchers}")
    if args.profile and shutil.which("py-spy") is None:
        return "--profile needs py-spy (pip install .[bench])"
    return None


def run(args: argparse.Namespace) -> int:
    """The ``sdpaxos bench`` entry point: measure, print, exit 0 if the end state checks out."""
    problem = check_arguments(args)
    if problem is not None:
        print(f"sdpaxos bench alloc-e2e: error: {problem}", file=sys.stderr)
        return USAGE_ERROR
    from cluster_state.errors import GpuConfigError

    try:
        report = measure(args.replicas, args.seconds, args.outstanding, nodes=args.nodes,
                         vcs=args.vcs, wan=args.wan, seed=args.seed,
                         schedulers=args.schedulers or args.replicas, watchers=args.watchers,
                         slow_watchers=args.slow_watchers,
                         profile=Path(args.profile) if args.profile else None)
    except GpuConfigError as exc:  # the synthetic cluster cannot be built (checked above too)
        print(f"sdpaxos bench alloc-e2e: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['allocations_per_s']:.0f} allocations/s through {args.replicas} replicas "
              f"({report['placed']} placed of {report['submitted']} submitted in "
              f"{report['seconds']:.1f}s, {report['gpus']} GPUs, {report['schedulers']} "
              f"schedulers); submit latency p50 {report['p50_ms']:.1f} ms, "
              f"p99 {report['p99_ms']:.1f} ms; start-up {report['startup_s']:.1f} s; "
              f"replicas identical: {report['replicas_identical']}")
        cpu = report["cpu_ms_per_allocation"]
        print(f"  CPU ms per allocation: {json.dumps(cpu)} (total "
              f"{sum(cpu.values()):.2f}); RSS MB: {report['rss_mb']}")
        for site, figures in report["sites"].items():
            print(f"  site {site}: {figures['allocations_per_s']:.0f} allocations/s, "
                  f"p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms")
        if report.get("watch"):
            print(f"  watch: {json.dumps(report['watch'])}")
    for name, top in report.get("profile", {}).items():
        print(f"profile {name}:", file=sys.stderr)
        for line in top:
            print(f"  {line}", file=sys.stderr)
    return 0 if report["ok"] else 1


def measure(replicas: int = 3, seconds: float = 10.0, outstanding: int = 64, *,
            nodes: int = 1024, vcs: int = 16, wan: bool = False, seed: int = 1,
            schedulers: int = 0, watchers: int = 0, slow_watchers: int = 0,
            profile: Path | None = None) -> dict[str, Any]:
    """Start the replicas, run the load for ``seconds``, stop them; the report as a dict."""
    from cluster_state.config import synthetic_config
    from consensus.runtime.local_cluster import LocalCluster

    schedulers = schedulers or replicas
    with tempfile.TemporaryDirectory(prefix="sdpaxos-alloc-") as tmp:
        directory = Path(tmp)
        (directory / "gpu.yaml").write_text(synthetic_config(nodes=nodes, vcs=vcs).to_yaml())
        cluster = LocalCluster(directory, replicas, wan=wan, grpc=watchers > 0,
                               state_machine='kind = "cluster_state"\ngpu_config = "gpu.yaml"')
        began = time.monotonic()
        cluster.start_all()
        try:
            report = asyncio.run(_load(cluster, began, seconds, outstanding, vcs, seed,
                                       schedulers, watchers, slow_watchers, profile))
        finally:
            cluster.stop_all()
    report.update(replicas=replicas, nodes=nodes, gpus=nodes * GPUS_PER_NODE, vcs=vcs, wan=wan,
                  fsync=True, outstanding_per_scheduler=outstanding, schedulers=schedulers)
    return report


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    # after the command name: state is field 3, utime and stime fields 14 and 15 (proc(5))
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_now(cluster: Any) -> dict[str, float]:
    """CPU seconds so far of every replica process and of this one (the load generator)."""
    used = {f"replica{r}": _cpu_s(p.pid) for r, p in sorted(cluster.processes.items())}
    used["loadgen"] = _cpu_s(os.getpid())
    return used


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))], 2),
        "max_ms": round(ordered[-1], 2),
    }


async def _load(cluster: Any, began: float, seconds: float, outstanding: int, vcs: int,
                seed: int, schedulers: int, watchers: int, slow_watchers: int,
                profile: Path | None) -> dict[str, Any]:
    from cluster_state.client import AllocationStore
    from cluster_state.demo import _wait_serving
    from cluster_state.ops import GroupSpec, Member, Placed, Preempting, Waiting
    from cluster_state.workload import next_job

    await _wait_serving(cluster, timeout=START_TIMEOUT_S)
    startup_s = time.monotonic() - began
    addresses = cluster.client_addresses
    names = [f"vc{k:02d}" for k in range(vcs)]
    sites = [str(spec.site) for spec in cluster.config.replicas]
    latencies: dict[int, list[float]] = collections.defaultdict(list)
    placed_at: dict[int, int] = collections.Counter()
    outcomes = {"placed": 0, "preempting": 0, "waiting": 0}
    applied_at: dict[int, float] = {}  # revision -> when its submitter heard of it
    rng = random.Random(seed)
    watch = _WatcherProcesses(cluster, watchers, slow_watchers) if watchers else None
    if watch is not None:
        await watch.start(names[0])
    recorders = _start_profiles(cluster, profile, seconds)
    stop_at = time.monotonic() + seconds

    async def job_loop(store: AllocationStore, home: int, prefix: str,
                       worker_rng: random.Random) -> None:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            job = next_job(worker_rng, f"{prefix}-{n}", names, mean_duration_s=1.0)
            spec = GroupSpec(name=job.name, vc=job.vc, priority=job.priority,
                             members=tuple(Member(p, g) for p, g in job.members))
            started = time.monotonic()
            result = await store.submit(spec)
            answered = time.monotonic()
            latencies[home].append((answered - started) * 1000)
            if isinstance(result, Placed):
                outcomes["placed"] += 1
                placed_at[home] += 1
                applied_at[result.token] = answered
            elif isinstance(result, Preempting):
                outcomes["preempting"] += 1
            elif isinstance(result, Waiting):
                outcomes["waiting"] += 1
                continue  # nothing to release
            await store.release(job.name)  # placed or reserving: free it again

    stores = [AllocationStore.connect(addresses, home=k % len(addresses))
              for k in range(schedulers)]
    started = time.monotonic()
    cpu_before = _cpu_now(cluster)
    await asyncio.gather(*[
        job_loop(store, k % len(addresses), f"s{k}w{j}", random.Random(rng.getrandbits(64)))
        for k, store in enumerate(stores) for j in range(outstanding)
    ])
    elapsed = time.monotonic() - started
    cpu_used = {name: used - cpu_before[name] for name, used in _cpu_now(cluster).items()}
    profiles = _finish_profiles(recorders)
    leftover = len(await stores[0].allocations())
    identical = await _replicas_identical(addresses)
    watch_report = await watch.finish(applied_at) if watch is not None else None
    for store in stores:
        await store.close()
    everything = [v for values in latencies.values() for v in values]
    report: dict[str, Any] = {
        "ok": identical and leftover == 0 and (watch_report is None or watch_report["ok"]),
        "allocations_per_s": outcomes["placed"] / elapsed,
        "submits_per_s": len(everything) / elapsed,
        "submitted": len(everything),
        **outcomes,
        "seconds": elapsed,
        "p50_ms": statistics.median(everything),
        "p99_ms": sorted(everything)[int(0.99 * (len(everything) - 1))],
        "sites": {
            sites[home]: {"allocations_per_s": placed_at[home] / elapsed,
                          **_percentiles(latencies[home])}
            for home in sorted(latencies)
        },
        # the machine is shared: CPU time per placement says what the load cost whatever
        # else ran, and 2 cores / its sum what this machine would give to the bench alone
        "cpu_ms_per_allocation": {
            name: round(1000 * used / max(1, outcomes["placed"]), 3)
            for name, used in cpu_used.items()
        },
        "cpu_share": {name: round(used / elapsed, 2) for name, used in cpu_used.items()},
        "startup_s": round(startup_s, 2),
        "rss_mb": [round(_rss_mb(p.pid), 1) for _, p in sorted(cluster.processes.items())],
        "groups_left": leftover,
        "replicas_identical": identical,
    }
    if watch_report is not None:
        report["watch"] = watch_report
    if profiles:
        report["profile"] = profiles
    return report


#: watchers that check every event (a running hash of each, and the delay of placements);
#: the others check that each page follows the last one (revisions) and count the events:
#: 1,000 streams at 2,000 events/s is 2 million events/s, more than Python looks at
WATCHERS_CHECKED = 50
#: watch streams per watcher process
WATCHERS_PER_PROCESS = 250
#: the longest report line of a watcher process (its marks: revision and time per placement)
WATCH_REPORT_LIMIT = 1 << 28


class _Watcher:
    __slots__ = ("count", "digest", "last", "ordered")

    def __init__(self) -> None:
        self.count = 0
        self.last = -1
        self.ordered = True
        self.digest: Any = None


class _Watchers:
    """``count`` pushed watch streams (gRPC ``WatchPushed``) over the replicas' ``targets``,
    round-robin from ``offset``; the first ``slow`` stop reading after their first page, the
    next ``checked`` check every event. Runs in a watcher process (``_watch_child``)."""

    def __init__(self, targets: list[str], count: int, slow: int, checked: int,
                 offset: int) -> None:
        import grpc

        from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc

        # a few connections per replica: one would funnel every stream through one socket
        self._channels = [grpc.aio.insecure_channel(t) for t in targets
                          for _ in range(WATCH_CONNECTIONS_PER_REPLICA)]
        # the slow watchers' own connections keep HTTP/2's initial 64 KiB window (no BDP
        # probing), so what they leave unread backs up to the replica sooner
        self._slow_channels = [grpc.aio.insecure_channel(t, options=[("grpc.http2.bdp_probe",
                                                                       0)])
                               for t in targets] if slow else []
        self._stubs = [pb_grpc.AllocationServiceStub(c)  # type: ignore[no-untyped-call]
                       for c in self._channels]
        self._slow_stubs = [pb_grpc.AllocationServiceStub(c)  # type: ignore[no-untyped-call]
                            for c in self._slow_channels]
        self._count, self._slow, self._checked, self._offset = count, slow, checked, offset
        self._tasks: list[asyncio.Task[None]] = []
        self.state = [_Watcher() for _ in range(count)]
        # (placement revision, seen at, the replica's index in targets)
        self.marks: list[tuple[int, float, int]] = []
        self.compacted = 0
        self.acks = 0  # acknowledgements written
        self._cpu_at_ready = (0.0, 0.0)  # (CPU seconds of this process, monotonic time)
        self.errors: list[str] = []
        self._resume = asyncio.Event()  # the slow watchers read again

    def start(self) -> None:
        import hashlib

        for k in range(self._count):
            if self._slow <= k < self._slow + self._checked:
                self.state[k].digest = hashlib.sha256()
            self._tasks.append(asyncio.ensure_future(self._one(k)))

    async def ready(self) -> None:
        """Once every watcher saw an event (the parent's warm-up job)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while any(w.count == 0 for w in self.state) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self._cpu_at_ready = (time.process_time(), time.monotonic())
        self.acks = 0

    async def _one(self, k: int) -> None:
        from cluster_state.grpc_api import cluster_state_pb2 as pb

        me = self.state[k]
        if k < self._slow:
            stub = self._slow_stubs[(k + self._offset) % len(self._slow_stubs)]
        else:
            stub = self._stubs[(k + self._offset) % len(self._stubs)]
        # the channels are the targets', a few each in order
        replica = (k + self._offset) % len(self._stubs) // WATCH_CONNECTIONS_PER_REPLICA
        from cluster_state.watch_hub import ACK_EVERY

        # the acknowledged stream, as AllocationStore's watch reads it
        call = stub.WatchAcked()
        consumed = 0
        try:
            await call.write(pb.WatchControl(start=pb.WatchRequest(since=-1, typed=True)))
            async for batch in call:
                if batch.compacted:
                    self.compacted += 1
                    return
                consumed += len(batch.events) + batch.skipped
                if consumed >= ACK_EVERY and not call.done():
                    await call.write(pb.WatchControl(ack=batch.through))
                    self.acks += 1
                    consumed = 0
                events = batch.events
                if not events:
                    continue
                if events[0].revision <= me.last:
                    me.ordered = False
                me.last = events[-1].revision
                me.count += len(events)
                if me.digest is not None:
                    now = time.monotonic()
                    for event in events:
                        if event.kind == "placed":
                            self.marks.append((event.revision, now, replica))
                    # the events alone serialize as their encodings one after the other,
                    # however the replica split them into messages: one call per message
                    batch.ClearField("through")
                    batch.ClearField("skipped")
                    me.digest.update(batch.SerializeToString())
                if k < self._slow and not self._resume.is_set():
                    # stops reading (and acknowledging) until the load is over: the replica
                    # must drop it, and the stream's last message, read then, says so
                    await self._resume.wait()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.errors.append(f"watcher {k + self._offset}: {exc!r}")

    async def drain(self, final: int) -> dict[str, Any]:
        """Wait for every reading watcher to reach revision ``final``; their figures."""
        cpu_at, began = self._cpu_at_ready
        cpu_s, seconds = time.process_time() - cpu_at, time.monotonic() - began
        acks = self.acks
        fast = self.state[self._slow:]
        self._resume.set()
        deadline = time.monotonic() + WATCH_DRAIN_S
        while time.monotonic() < deadline and (
            any(w.last < final for w in fast) or self.compacted < self._slow
        ):
            await asyncio.sleep(0.1)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self._channels + self._slow_channels:
            await channel.close()
        return {
            "counts": [w.count for w in fast],
            "lasts": [w.last for w in fast],
            "ordered": all(w.ordered for w in fast),
            "digests": [w.digest.hexdigest() for w in fast if w.digest is not None],
            "marks": self.marks,
            "compacted": self.compacted,
            "errors": self.errors[:5],
            # from every stream open to the end of the load
            "cpu_s": cpu_s,
            "seconds": seconds,
            "acks": acks,
        }


def _watch_child(spec: str) -> None:
    """A watcher process: the streams of ``_Watchers(**json spec)``; prints "ready" once they
    all saw an event, then reads the final revision from stdin and prints its figures."""

    async def main() -> None:
        watchers = _Watchers(**json.loads(spec))
        watchers.start()
        await watchers.ready()
        print("ready", flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        print(json.dumps(await watchers.drain(int(line))), flush=True)

    asyncio.run(main())


class _WatcherProcesses:
    """The watchers, split over processes of ``WATCHERS_PER_PROCESS`` (one Python process
    decodes only so many messages per second); the slow ones all in the first."""

    def __init__(self, cluster: Any, count: int, slow: int) -> None:
        self._targets = [f"{host}:{port}" for host, port in cluster.grpc_addresses]
        self._addresses = cluster.client_addresses
        self._count, self._slow = count, slow
        self._children: list[asyncio.subprocess.Process] = []

    async def start(self, vc: str) -> None:
        """Start the watcher processes, then place and release one job: once every watcher
        saw it, every stream is open (and the slow ones stopped reading)."""
        from cluster_state.client import AllocationStore
        from cluster_state.ops import GroupSpec, Member

        processes = max(1, -(-self._count // WATCHERS_PER_PROCESS))
        share = -(-self._count // processes)
        offset = 0
        for k in range(processes):
            count = min(share, self._count - offset)
            slow = self._slow if k == 0 else 0
            spec = {"targets": self._targets, "count": count, "slow": slow,
                    "checked": -(-WATCHERS_CHECKED // processes), "offset": offset}
            self._children.append(await asyncio.create_subprocess_exec(
                sys.executable, "-c",
                f"from bench.alloc_e2e import _watch_child; _watch_child({json.dumps(spec)!r})",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                limit=WATCH_REPORT_LIMIT))
            offset += count
        await asyncio.sleep(WATCH_SETTLE_S)
        store = AllocationStore.connect(self._addresses)
        try:
            await store.submit(GroupSpec(name="warm-up", vc=vc, priority=0,
                                         members=(Member(1, 1),)))
            await store.release("warm-up")
        finally:
            await store.close()
        for child in self._children:
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), START_TIMEOUT_S)
            if line.strip() != b"ready":
                raise RuntimeError(f"a watcher process did not start: {line!r}")

    async def finish(self, applied_at: dict[int, float]) -> dict[str, Any]:
        from cluster_state.client import AllocationStore

        store = AllocationStore.connect(self._addresses)
        try:
            final = (await store.digest())["revision"]  # linearizable: the last change
        finally:
            await store.close()
        parts = []
        for child in self._children:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(f"{final}\n".encode())
            await child.stdin.drain()
        for child in self._children:
            assert child.stdout is not None
            parts.append(json.loads(await child.stdout.readline()))
            await child.wait()
        counts = {n for part in parts for n in part["counts"]}
        digests = {d for part in parts for d in part["digests"]}
        lasts = [last for part in parts for last in part["lasts"]]
        compacted = sum(part["compacted"] for part in parts)
        errors = [e for part in parts for e in part["errors"]]
        same = len(counts) == 1 and len(digests) <= 1 and all(p["ordered"] for p in parts)
        by_replica: dict[int, list[float]] = collections.defaultdict(list)
        for part in parts:
            for rev, at, replica in part["marks"]:
                if rev in applied_at:
                    by_replica[replica].append((at - applied_at[rev]) * 1000)
        delays = [delay for values in by_replica.values() for delay in values]
        return {
            "ok": same and not errors and compacted == self._slow
            and all(last >= final for last in lasts),
            "watchers": self._count,
            "watcher_processes": len(self._children),
            "slow_watchers": self._slow,
            "slow_dropped_with_compacted": compacted,
            "events_per_watcher": sorted(counts),
            "checked_event_by_event": sum(len(p["digests"]) for p in parts),
            # the watcher processes share the machine with the replicas: what they took
            "watcher_processes_cpu_share": round(
                sum(p["cpu_s"] for p in parts) / max(p["seconds"] for p in parts), 2),
            "acks_per_s": round(sum(p["acks"] / p["seconds"] for p in parts)),
            "all_same_events_in_order": same,
            "errors": errors[:5],
            # from the submitting scheduler hearing of its placement to a watcher seeing it
            "delay": _percentiles(delays),
            # a watcher at the replica that led the command or at one that learned it later
            "delay_by_replica": {str(r): _percentiles(v) for r, v in sorted(by_replica.items())},
        }


def _start_profiles(cluster: Any, profile: Path | None,
                    seconds: float) -> list[tuple[str, Path, subprocess.Popen[bytes]]]:
    if profile is None:
        return []
    profile.mkdir(parents=True, exist_ok=True)
    pids = {f"replica{r}": p.pid for r, p in sorted(cluster.processes.items())}
    pids["loadgen"] = os.getpid()
    recorders = []
    for name, pid in pids.items():
        out = profile / f"{name}.txt"
        recorders.append((name, out, subprocess.Popen(
            ["py-spy", "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))),
             "--rate", str(PROFILE_RATE), "--format", "raw", "--nonblocking", "-o", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    return recorders


def _finish_profiles(
    recorders: list[tuple[str, Path, subprocess.Popen[bytes]]],
) -> dict[str, list[str]]:
    tops: dict[str, list[str]] = {}
    for name, out, process in recorders:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        tops[name] = top_entries(out) if out.exists() else ["(no profile written)"]
    return tops


def top_entries(collapsed: Path, count: int = PROFILE_TOP) -> list[str]:
    """The functions most often on top of the stack in a py-spy raw (collapsed) profile,
    as "share% function (file:line)" lines; idle waiting (select/epoll) included."""
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        n = int(samples)
        total += n
        own[stack.split(";")[-1]] += n
    return [f"{100 * n / total:5.1f}% {frame}" for frame, n in own.most_common(count)]


async def _replicas_identical(addresses: list[tuple[str, int]], timeout: float = 30.0) -> bool:
    """Every replica's snapshot hash, read locally at each, agrees (waiting for laggards)."""
    from cluster_state.client import AllocationStore

    locals_ = [AllocationStore.connect([address]) for address in addresses]
    try:
        deadline = time.monotonic() + timeout
        while True:
            digests = [(await store.digest(stale=True))["sha256"] for store in locals_]
            if len(set(digests)) == 1:
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.2)
    finally:
        for store in locals_:
            await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="allocations/s through replica processes")
    add_arguments(parser)
    options = parser.parse_args()
    options.json = True
    raise SystemExit(run(options))
