"""``sdpaxos bench watch``: what watchers cost at a steady allocation rate (issue 37's target:
1,000 watchers in a few processes at 500 allocations/s, server CPU per delivered event
<= 5 us and event delay p99 <= 100 ms, the watchers' CPU counted).

Three (or five) replica processes on loopback, fsync on, serving the allocation store on a
synthetic cluster (``--nodes`` x 8 GPUs, ``--vcs`` virtual clusters). ``--watchers`` watchers
in ``--processes`` watcher processes, each watching through the client library
(``cluster_state.client.PushedWatch``, one per process, every watcher from revision -1,
spread round-robin over the replicas) for the whole run. The load is paced: a job of the
demo's mix (``cluster_state.workload``) submitted every 1/``--rate`` seconds by one of the
scheduler sessions (round-robin over the sites, a session per 64 jobs in flight), released as
soon as the store answers, at most ``--max-in-flight`` at a time (a job that would exceed it
is not started and counted as ``skipped``, one whose submit fails as ``failed``: the rate
asked was more than the cluster answered).

Measured over the paced ``--seconds``:

* ``delivered_events``: the events the reading watchers took (each watcher's count, summed);
* ``server_cpu_us_per_delivered_event``: the replicas' CPU (user + system, every thread,
  from /proc) divided by it, everything a replica did included (the allocations too:
  ``server_cpu_ms_per_allocation`` says how much that is, and ``--watchers 0`` measures it
  alone);
* ``watcher_cpu_us_per_delivered_event``: the same for the watcher processes (decoding, the
  local fan-out, the watchers' own loop over their events), and the two summed;
* ``delay``: from the submitting scheduler's answer for a placement (the leading replica
  applied it) to a watcher taking its ``placed`` event, sampled at every ``--watchers //
  40``-th watcher, percentiles in ms; ``delay_by_replica`` by the replica the watcher reads.

Checked: every reading watcher took the same number of events, in revision order, and the
sampled ones the same events (a running hash); ``--slow-watchers K`` (in the first process)
stop reading after their first page until the load is over and must end with
``EventsCompacted``; at the end every group is gone and the replicas are identical.

``--source DIR`` runs the replicas and the watcher processes from another checkout (the
build before this one, say: ``git archive COMMIT | tar -x -C DIR``), so the two builds can be
measured alternately in one sitting by the same harness; the load generator is this tree's
(the client protocol is the same).

    python -m bench.watch_fanout --watchers 1000 --processes 4 --rate 500 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "check_arguments", "measure", "run"]

#: how many watchers record the delay of every placement they take (and hash every event)
SAMPLED_WATCHERS = 40
#: how long the reading watchers get to take the last change once the load stopped
DRAIN_S = 60.0
#: the longest line a watcher process reports (its delay marks)
REPORT_LIMIT = 1 << 28
#: the ``workload`` mix's mean job duration does not matter (a job is released at once)
_MEAN_DURATION_S = 1.0
#: jobs in flight per scheduler session (each is a client id with its own session table)
JOBS_PER_SESSION = 64
#: how long a request waits before it is sent again (long: the bench paces, a retry is load)
REQUEST_TIMEOUT_S = 10.0
#: the checkout this file is in: what runs unless ``--source`` names another
_TREE = Path(__file__).resolve().parents[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bench.alloc_e2e import GPUS_PER_NODE, NODES_PER_RACK

    parser.add_argument("--replicas", type=int, choices=(3, 5), default=3,
                        help="how many replicas")
    parser.add_argument("--watchers", type=int, default=1000, help="watchers in all")
    parser.add_argument("--processes", type=int, default=4,
                        help="watcher processes the watchers are split over")
    parser.add_argument("--slow-watchers", type=int, default=0,
                        help="of the watchers, how many stop reading after their first page")
    parser.add_argument("--rate", type=float, default=500.0,
                        help="jobs submitted per second (each placed one is an allocation)")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of paced load")
    parser.add_argument("--max-in-flight", type=int, default=512,
                        help="jobs in flight at most (beyond: skipped and counted)")
    parser.add_argument("--nodes", type=int, default=1024,
                        help=f"{GPUS_PER_NODE}-GPU nodes, a multiple of {NODES_PER_RACK}")
    parser.add_argument("--vcs", type=int, default=16, help="virtual clusters")
    parser.add_argument("--seed", type=int, default=1, help="the workload's seed")
    parser.add_argument("--source", default="",
                        help="run the replicas and watchers from this checkout (another build)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def check_arguments(args: argparse.Namespace) -> str | None:
    """What makes these parameters impossible (one line), or None."""
    from bench.alloc_e2e import NODES_PER_RACK

    if args.watchers < 0 or not 0 <= args.slow_watchers < max(args.watchers, 1):
        return (f"--watchers must be >= 0 and --slow-watchers fewer than them, not "
                f"{args.watchers} and {args.slow_watchers}")
    if args.watchers and not 1 <= args.processes <= args.watchers:
        return f"--processes must be in 1..--watchers, not {args.processes}"
    if not args.rate > 0 or not args.seconds > 0:
        return f"--rate and --seconds must be positive, not {args.rate} and {args.seconds}"
    if args.max_in_flight < 1:
        return f"--max-in-flight must be positive, not {args.max_in_flight}"
    if args.nodes < NODES_PER_RACK or args.nodes % NODES_PER_RACK:
        return (f"--nodes must be a positive multiple of {NODES_PER_RACK}, not {args.nodes}")
    if not 1 <= args.vcs <= args.nodes:
        return f"--vcs must be in 1..{args.nodes}, not {args.vcs}"
    if args.source and not (Path(args.source) / "cluster_state" / "client.py").is_file():
        return f"--source {args.source} is not a checkout of this project"
    return None


def run(args: argparse.Namespace) -> int:
    """The ``sdpaxos bench watch`` entry point: measure, print, exit 0 if every check passed."""
    from bench.alloc_e2e import USAGE_ERROR

    problem = check_arguments(args)
    if problem is not None:
        print(f"sdpaxos bench watch: error: {problem}", file=sys.stderr)
        return USAGE_ERROR
    report = measure(args.replicas, args.watchers, args.processes, args.rate, args.seconds,
                     slow=args.slow_watchers, max_in_flight=args.max_in_flight,
                     nodes=args.nodes, vcs=args.vcs, seed=args.seed,
                     source=Path(args.source).resolve() if args.source else None)
    if args.json:
        print(json.dumps(report))
    else:
        print(_summary(report))
    return 0 if report["ok"] else 1


def _summary(report: dict[str, Any]) -> str:
    delay = report.get("delay", {})
    lines = [
        f"{report['watchers']} watchers in {report['processes']} processes, "
        f"{report['allocations_per_s']:.0f} allocations/s ({report['events_per_s'] or 0:.0f} "
        f"events/s; asked {report['rate']:.0f} jobs/s, {report['skipped']} skipped, "
        f"{report['failed']} failed) over "
        f"{report['replicas']} replicas, {report['seconds']:.1f} s"
        + (f", source {report['source']}" if report["source"] else ""),
        f"  delivered {report['delivered_events']} events "
        f"({report['delivered_per_s']:.0f}/s)",
        f"  server CPU per delivered event: {report['server_cpu_us_per_delivered_event']} us; "
        f"watchers' {report['watcher_cpu_us_per_delivered_event']} us; "
        f"both {report['cpu_us_per_delivered_event']} us",
        f"  server CPU per allocation: {report['server_cpu_ms_per_allocation']} ms; "
        f"CPU share (cores): {json.dumps(report['cpu_share'])}",
        f"  event delay: p50 {delay.get('p50_ms')} ms, p99 {delay.get('p99_ms')} ms, "
        f"max {delay.get('max_ms')} ms ({delay.get('count', 0)} samples)",
        f"  checks: {json.dumps(report['checks'])}",
    ]
    return "\n".join(lines)


def measure(replicas: int = 3, watchers: int = 1000, processes: int = 4, rate: float = 500.0,
            seconds: float = 30.0, *, slow: int = 0, max_in_flight: int = 512,
            nodes: int = 1024, vcs: int = 16, seed: int = 1,
            source: Path | None = None) -> dict[str, Any]:
    """Start the replicas and the watchers, run the paced load, stop everything; the report."""
    from cluster_state.config import synthetic_config
    from consensus.runtime.local_cluster import LocalCluster

    code = source or _TREE  # what the replicas and the watcher processes run
    with tempfile.TemporaryDirectory(prefix="sdpaxos-watch-") as tmp:
        directory = Path(tmp)
        (directory / "gpu.yaml").write_text(synthetic_config(nodes=nodes, vcs=vcs).to_yaml())
        cluster = LocalCluster(directory, replicas, grpc=True, source=code,
                               state_machine='kind = "cluster_state"\ngpu_config = "gpu.yaml"')
        cluster.start_all()
        try:
            report = asyncio.run(_measure(cluster, watchers, processes, slow, rate, seconds,
                                          max_in_flight, vcs, seed, code))
        finally:
            cluster.stop_all()
    report.update(replicas=replicas, nodes=nodes, vcs=vcs, rate=rate,
                  source=str(source) if source else "")
    return report


async def _measure(cluster: Any, watchers: int, processes: int, slow: int, rate: float,
                   seconds: float, max_in_flight: int, vcs: int, seed: int,
                   code: Path) -> dict[str, Any]:
    from bench.alloc_e2e import START_TIMEOUT_S, _cpu_s, _replicas_identical
    from cluster_state.client import AllocationStore
    from cluster_state.demo import _wait_serving
    from cluster_state.ops import GroupSpec, Member

    await _wait_serving(cluster, timeout=START_TIMEOUT_S)
    addresses = cluster.client_addresses
    names = [f"vc{k:02d}" for k in range(vcs)]
    children = _WatcherProcesses(cluster, watchers, processes, slow, code)
    try:
        if watchers:
            await children.start(names[0])
        # a session per JOBS_PER_SESSION jobs in flight (and one per replica at least): a
        # slow request's retry stays within what its session table remembers
        sessions = max(len(addresses), -(-max_in_flight // JOBS_PER_SESSION))
        stores = [AllocationStore.connect(addresses, home=k % len(addresses),
                                          timeout_s=REQUEST_TIMEOUT_S)
                  for k in range(sessions)]
        replica_pids = [p.pid for _, p in sorted(cluster.processes.items())]

        def cpu() -> dict[str, float]:
            return {"replicas": sum(_cpu_s(pid) for pid in replica_pids),
                    "watchers": sum(_cpu_s(pid) for pid in children.pids),
                    "loadgen": _cpu_s(os.getpid())}

        delivered_before = await children.delivered()
        cpu_before, began = cpu(), time.monotonic()
        load = await _paced_load(stores, names, rate, seconds, max_in_flight, seed)
        elapsed = time.monotonic() - began
        cpu_used = {k: v - cpu_before[k] for k, v in cpu().items()}
        delivered = await children.delivered() - delivered_before
        # a last job, so that the last change is an event every watcher must take
        await stores[0].submit(GroupSpec(name="the-end", vc=names[0], priority=0,
                                         members=(Member(1, 1),)))
        await stores[0].release("the-end")
        final = await stores[0].revision()  # linearizable: the release's
        leftover = len(await stores[0].allocations())
        identical = await _replicas_identical(addresses)
        for store in stores:
            await store.close()
        watched = await children.finish(final, load["applied_at"]) if watchers else {}
    finally:
        await children.stop()
    placed = load["placed"]

    def per_event(used: float) -> float | None:
        return round(1e6 * used / delivered, 3) if delivered else None

    checks = {"groups_left": leftover, "replicas_identical": identical,
              **watched.get("checks", {})}
    return {
        "ok": leftover == 0 and identical and watched.get("ok", True),
        "watchers": watchers, "processes": processes if watchers else 0,
        "slow_watchers": slow, "seconds": round(elapsed, 2),
        "allocations_per_s": placed / elapsed,
        # every reading watcher takes every event
        "events_per_s": delivered / (watchers - slow) / elapsed if watchers else None,
        "submitted": load["submitted"], "placed": placed, "skipped": load["skipped"],
        "failed": load["failed"],
        "delivered_events": delivered, "delivered_per_s": delivered / elapsed,
        "server_cpu_us_per_delivered_event": per_event(cpu_used["replicas"]),
        "watcher_cpu_us_per_delivered_event": per_event(cpu_used["watchers"]),
        "cpu_us_per_delivered_event": per_event(cpu_used["replicas"] + cpu_used["watchers"]),
        "server_cpu_ms_per_allocation": round(1000 * cpu_used["replicas"] / max(placed, 1), 3),
        "cpu_share": {k: round(v / elapsed, 2) for k, v in cpu_used.items()},
        "delay": watched.get("delay", {"count": 0}),
        "delay_by_replica": watched.get("delay_by_replica", {}),
        "streams_per_process": watched.get("streams", []),
        "checks": checks,
    }


async def _paced_load(stores: list[Any], names: list[str], rate: float, seconds: float,
                      max_in_flight: int, seed: int) -> dict[str, Any]:
    """A job every 1/``rate`` s, round-robin over the stores; each released once answered."""
    from cluster_state.errors import ClusterStateError
    from cluster_state.ops import GroupSpec, Member, Placed, Waiting
    from cluster_state.workload import next_job
    from consensus.errors import SDPaxosError

    rng = random.Random(seed)
    applied_at: dict[int, float] = {}  # a placement's revision -> when its submitter heard
    counts = {"submitted": 0, "placed": 0, "skipped": 0, "failed": 0}
    in_flight: set[asyncio.Task[None]] = set()

    async def one(store: Any, name: str) -> None:
        job = next_job(rng, name, names, mean_duration_s=_MEAN_DURATION_S)
        spec = GroupSpec(name=job.name, vc=job.vc, priority=job.priority,
                         members=tuple(Member(p, g) for p, g in job.members))
        try:
            result = await store.submit(spec)
        except (ClusterStateError, SDPaxosError):  # an overloaded cluster: counted
            counts["failed"] += 1
            with contextlib.suppress(ClusterStateError, SDPaxosError):
                await store.release(job.name)  # if it was placed after all
            return
        answered = time.monotonic()
        counts["submitted"] += 1
        if isinstance(result, Waiting):
            return
        if isinstance(result, Placed):
            counts["placed"] += 1
            applied_at[result.token] = answered
        await store.release(job.name)  # placed or reserving: free it again

    began = time.monotonic()
    n = 0
    while (due := began + n / rate) < began + seconds:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        if len(in_flight) < max_in_flight:
            task = asyncio.ensure_future(one(stores[n % len(stores)], f"job-{n}"))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        else:
            counts["skipped"] += 1
        n += 1
    if in_flight:
        await asyncio.gather(*in_flight)
    return {**counts, "applied_at": applied_at}


class _WatcherProcesses:
    """The watcher processes (``_watcher_process``), driven over their stdin and stdout."""

    def __init__(self, cluster: Any, count: int, processes: int, slow: int,
                 code: Path) -> None:
        self._targets = [f"{host}:{port}" for host, port in cluster.grpc_addresses]
        self._addresses = cluster.client_addresses
        self._count, self._processes, self._slow = count, processes, slow
        self._code = code
        self._children: list[asyncio.subprocess.Process] = []

    @property
    def pids(self) -> list[int]:
        return [child.pid for child in self._children]

    async def start(self, vc: str) -> None:
        """Start the processes, then place and release one job: once every watcher took it,
        every stream is open (and the slow ones stopped reading)."""
        from bench.alloc_e2e import START_TIMEOUT_S
        from cluster_state.client import AllocationStore
        from cluster_state.ops import GroupSpec, Member

        share = -(-self._count // self._processes)
        step = max(1, self._count // SAMPLED_WATCHERS)
        env = {**os.environ, "PYTHONPATH": str(self._code)}
        code = ("import runpy, sys; sys.argv = ['watcher', '--watcher-process', sys.argv[1]]; "
                f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')")
        for offset in range(0, self._count, share):
            spec = {"targets": self._targets, "first": offset,
                    "count": min(share, self._count - offset),
                    "slow": self._slow if offset == 0 else 0, "step": step}
            self._children.append(await asyncio.create_subprocess_exec(
                sys.executable, "-c", code, json.dumps(spec), env=env,
                cwd=str(self._code), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, limit=REPORT_LIMIT))
        store = AllocationStore.connect(self._addresses)
        try:
            await asyncio.sleep(1.0)  # the streams open
            await store.submit(GroupSpec(name="warm-up", vc=vc, priority=0,
                                         members=(Member(1, 1),)))
            await store.release("warm-up")
        finally:
            await store.close()
        for child in self._children:
            line = await asyncio.wait_for(self._line(child), START_TIMEOUT_S)
            if line != "ready":
                raise RuntimeError(f"a watcher process did not start: {line!r}")

    async def _line(self, child: asyncio.subprocess.Process) -> str:
        assert child.stdout is not None
        return (await child.stdout.readline()).decode().strip()

    async def _ask(self, line: str) -> list[dict[str, Any]]:
        for child in self._children:
            assert child.stdin is not None
            child.stdin.write(f"{line}\n".encode())
            await child.stdin.drain()
        return [json.loads(await self._line(child)) for child in self._children]

    async def delivered(self) -> int:
        """Events the reading watchers took so far, summed."""
        return sum(part["delivered"] for part in await self._ask("count"))

    async def finish(self, final: int, applied_at: dict[int, float]) -> dict[str, Any]:
        """Let every reading watcher take revision ``final``; their checks and delays."""
        from bench.alloc_e2e import _percentiles

        parts = await self._ask(f"final {final}")
        counts = {n for part in parts for n in part["counts"]}
        digests = {d for part in parts for d in part["digests"]}
        lasts = [last for part in parts for last in part["lasts"]]
        compacted = sum(part["compacted"] for part in parts)
        errors = [e for part in parts for e in part["errors"]]
        ordered = all(part["ordered"] for part in parts)
        by_replica: dict[int, list[float]] = collections.defaultdict(list)
        for part in parts:
            for revision, at, replica in part["marks"]:
                if revision in applied_at:
                    by_replica[replica].append((at - applied_at[revision]) * 1000)
        delays = [d for values in by_replica.values() for d in values]
        checks = {"same_event_count": len(counts) == 1, "in_order": ordered,
                  "sampled_same_events": len(digests) <= 1,
                  "all_reached_the_end": all(last >= final for last in lasts),
                  "slow_ended_compacted": f"{compacted}/{self._slow}", "errors": errors[:5]}
        return {
            "ok": len(counts) == 1 and ordered and len(digests) <= 1 and not errors
            and compacted == self._slow and all(last >= final for last in lasts),
            "checks": checks,
            "delay": _percentiles(delays),
            "delay_by_replica": {str(r): _percentiles(v) for r, v in sorted(by_replica.items())},
            "streams": [part["streams"] for part in parts],
        }

    async def stop(self) -> None:
        for child in self._children:
            if child.returncode is None:
                child.kill()
            await child.wait()


# ---------------------------------------------------------------------- the watcher process
# Runs in a process of its own, from the measured build (``--source``): it imports nothing of
# this tree but the client library's ``PushedWatch(targets).watch(since, first)``, which
# every build since the pushed stream has.

class _Watcher:
    __slots__ = ("count", "digest", "last", "ordered")

    def __init__(self, sampled: bool) -> None:
        self.count = 0
        self.last = -1
        self.ordered = True
        self.digest = hashlib.sha256() if sampled else None


async def _watch_all(spec: dict[str, Any]) -> None:
    from cluster_state.client import PushedWatch
    from cluster_state.errors import EventsCompacted

    targets, first, count = spec["targets"], spec["first"], spec["count"]
    slow, step = spec["slow"], spec["step"]
    pushed = PushedWatch(targets)
    watchers = [_Watcher(sampled=(first + k) % step == 0 and k >= slow) for k in range(count)]
    marks: list[tuple[int, float, int]] = []  # (placement revision, taken at, replica)
    errors: list[str] = []
    compacted = 0
    resume = asyncio.Event()  # the slow watchers read again

    async def watch(k: int) -> None:
        nonlocal compacted
        me, replica = watchers[k], (first + k) % len(targets)
        try:
            async for page in pushed.watch(-1, replica):
                if page[0].revision <= me.last:
                    me.ordered = False
                me.last = page[-1].revision
                me.count += len(page)
                if me.digest is not None:
                    now = time.monotonic()
                    for event in page:
                        if event.kind == "placed":
                            marks.append((event.revision, now, replica))
                        me.digest.update(f"{event.revision} {event.kind} {event.subject}\n"
                                         .encode())
                if k < slow:
                    await resume.wait()
        except EventsCompacted:
            compacted += 1
        except Exception as exc:
            errors.append(f"watcher {first + k}: {exc!r}")

    tasks = [asyncio.ensure_future(watch(k)) for k in range(count)]
    reading = watchers[slow:]
    while any(w.count == 0 for w in watchers) and not errors:
        await asyncio.sleep(0.05)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if not line:
            break
        if line[0] == "count":
            print(json.dumps({"delivered": sum(w.count for w in reading)}), flush=True)
            continue
        final = int(line[1])
        resume.set()
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and (
            any(w.last < final for w in reading) or compacted < slow
        ) and not errors:
            await asyncio.sleep(0.1)
        print(json.dumps({
            "counts": [w.count for w in reading], "lasts": [w.last for w in reading],
            "ordered": all(w.ordered for w in reading),
            "digests": [w.digest.hexdigest() for w in reading if w.digest is not None],
            "marks": marks, "compacted": compacted, "errors": errors[:5],
            "streams": getattr(pushed, "streams", None),  # builds that share a stream
        }), flush=True)
        break
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await pushed.close()


def _watcher_process(spec: str) -> None:
    asyncio.run(_watch_all(json.loads(spec)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--watcher-process"]:
        _watcher_process(sys.argv[2])
    else:
        parser = argparse.ArgumentParser(description="watchers at a paced allocation rate")
        add_arguments(parser)
        raise SystemExit(run(parser.parse_args()))
