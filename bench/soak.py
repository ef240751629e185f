"""``sdpaxos bench soak``: real replica processes for ``--duration`` seconds under the mixed
life of a GPU cluster, sampled over time, then checked (issue 38, point 8).

**The clusters** (``bench.soak_cluster``): the GPU allocation store (``cluster_state``, a
synthetic configuration of ``--nodes`` 8-GPU nodes in ``--vcs`` virtual clusters plus a spare
rack, gRPC on) and, beside it, a key-value cluster (``kv``: the store's state machine serves
no key-value operations, and ``sdpaxos put`` and ``sdpaxos lincheck`` are about those);
``--replicas`` processes each, fsync on, snapshots every ``--snapshot-every`` commands.

**The life** (``bench.soak_load``): ``--schedulers`` scheduler sessions submit gangs at
``--rate`` per second, hold each about ``--hold`` seconds and release it, renewing their
sessions every ``--session`` seconds; ``--watchers`` watchers follow the store, each feeding
its own GPU ledger; ``--kv-clients`` key-value clients put, get and compare-and-set a few keys;
a one-shot command-line write every ``--cli-every`` seconds (``sdpaxos put``; every fourth a
``sdpaxos ctl submit`` or ``release`` of a one-GPU gang), as subprocesses or in-process
(``--cli-mode``). Every ``--every`` seconds an operator action, in turn: a replica killed
(SIGKILL) and restarted; a backup (``sdpaxos snapshot save``); the GPU configuration edited
(``sdpaxos ctl config apply`` of a file that gives the spare rack to one virtual cluster,
then splits it between two, and back: it drops no group, which its dry run must confirm, and
never returns to the file the replicas started with, so a restart that reverted it would
show); a member replaced (``sdpaxos member replace``, the new replica started, the old one
retired). Rounds alternate between the GPU store and the key-value cluster (the configuration
edit is the store's). One action at a time, each ending once every member serves.

**Sampled** every ``--sample-every`` seconds, per replica process: resident memory, open
files, write-ahead log and snapshot bytes, the longest loop stall
(``sdpaxos_loop_stall_longest_seconds``), the session table's size where the build exposes
it (``sdpaxos_sessions``); and the scheduler operations' latencies.

**Checked** at the end (exit status 1 if one fails): the key-value history is linearizable
(``sdpaxos lincheck``'s checker; ``history.jsonl`` re-checks with it); the replicas of each
cluster converge (the store's digests equal; the same key-value data at the same slot); no GPU
given twice (the final allocations, and every watcher's ledger); every acknowledged allocation
not released since is there with its fencing token; every watcher took every event to the end
and its ledger's owners are the final allocations'; the store runs the last configuration
applied; every operator action completed; no replica exited by itself; the load made progress.

**Targets** (reported, and enforced with ``--enforce-targets``): issue 38's, for an hour,
scaled to the run (``bench.soak_samples``): resident memory and open files grow at most 10 %
from the end of the warm-up to the end; the scheduler operations' p99 in the last window is at
most 1.5x the first window's. The session table's size at the end is reported.

    sdpaxos bench soak --duration 3600 --workdir /tmp/soak --json soak.json --plot soak.png
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import yaml

from bench.harness import machine_info, run_interruptible, write_json
from bench.nemesis import Record, positive, tally
from bench.soak_checks import Evidence, judge
from bench.soak_cluster import ActionFailed, SoakCluster, base_ports
from bench.soak_load import (
    KEYS,
    PRIORITY,
    AckedAllocations,
    KVClients,
    OneShotWriter,
    Schedulers,
    Watchers,
    now_us,
)
from bench.soak_samples import Windows, percentile, sample_replica
from bench.soak_samples import targets as soak_targets

__all__ = ["Options", "add_arguments", "edited_config", "gpu_config_text", "run"]

ActionKind = Literal["kill", "backup", "config", "replace"]
#: the operator's actions, in turn
ROTATION: tuple[ActionKind, ...] = ("kill", "backup", "config", "replace")
#: the virtual clusters the spare rack is given to, by configuration: the replicas' file
#: gives it to none; the edits give it to one, then split it between two, and back
SPARE_VCS: tuple[tuple[str, ...], ...] = ((), ("spare",), ("spare-a", "spare-b"))
#: seconds a cluster has to converge at the end, the watchers to take the last event
SETTLE_S = 60.0
#: seconds the load's clients have to stop (their last requests answered)
STOP_S = 60.0
#: default time budget of the linearizability check, seconds
CHECK_TIMEOUT_S = 300.0
#: the key-value probe's key (a read of it tells a replica serves; nobody writes it)
PROBE_KEY = "soak-probe"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    duration_s: float
    every_s: float
    sample_s: float
    replicas: int
    nodes: int
    vcs: int
    schedulers: int
    rate: float
    hold_s: float
    session_s: float
    watchers: int
    kv_clients: int
    kv_pause_s: float
    cli_every_s: float
    cli_mode: Literal["subprocess", "in-process"]
    snapshot_every: int
    kill_down_s: float
    fsync: bool
    seed: int
    check_timeout_s: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bench.alloc_e2e import NODES_PER_RACK

    parser.add_argument("--duration", type=positive, default=3600.0, metavar="SECONDS",
                        help="seconds of load (default 3600)")
    parser.add_argument("--every", type=positive, default=None, metavar="SECONDS",
                        help="seconds between operator actions (default: duration / 48, at "
                        "least 20: each kind every 5 minutes of an hour)")
    parser.add_argument("--sample-every", type=positive, default=None, metavar="SECONDS",
                        help="seconds between samples (default: duration / 120, 5 to 30)")
    parser.add_argument("--replicas", type=int, choices=(3, 5), default=3,
                        help="replicas per cluster")
    parser.add_argument("--nodes", type=int, default=64,
                        help=f"8-GPU nodes of the store, a multiple of {NODES_PER_RACK} "
                        "(plus a spare rack)")
    parser.add_argument("--vcs", type=int, default=4, help="virtual clusters the load uses")
    parser.add_argument("--schedulers", type=int, default=3, help="scheduler sessions")
    parser.add_argument("--rate", type=positive, default=1.0,
                        help="gangs submitted per second, over all schedulers")
    parser.add_argument("--hold", type=positive, default=None, metavar="SECONDS",
                        help="mean seconds a placed gang is held (default: duration / 8, at "
                        "most 30)")
    parser.add_argument("--session", type=positive, default=300.0, metavar="SECONDS",
                        help="a scheduler or key-value client renews its session this often")
    parser.add_argument("--watchers", type=int, default=4, help="watchers of the store")
    parser.add_argument("--kv-clients", type=int, default=2, help="key-value clients")
    parser.add_argument("--kv-pause", type=positive, default=0.5, metavar="SECONDS",
                        help="mean pause between a key-value client's operations")
    parser.add_argument("--cli-every", type=positive, default=3.0, metavar="SECONDS",
                        help="seconds between one-shot command-line writes")
    parser.add_argument("--cli-mode", choices=("subprocess", "in-process"),
                        default="subprocess",
                        help="one-shot writes as sdpaxos subprocesses (default) or their "
                        "client session in this process")
    parser.add_argument("--snapshot-every", type=int, default=2000, metavar="COMMANDS",
                        help="replicas snapshot every this many commands (their --snapshot-"
                        "every)")
    parser.add_argument("--kill-down", type=positive, default=2.0, metavar="SECONDS",
                        help="how long a killed replica stays down")
    parser.add_argument("--check-timeout", type=positive, default=CHECK_TIMEOUT_S,
                        help="time budget of the linearizability check, seconds")
    parser.add_argument("--enforce-targets", action="store_true",
                        help="exit 1 when a target is missed too (default: reported only)")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON to FILE "
                        "('-': print it instead of the table)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the samples to FILE")
    parser.add_argument("--workdir", metavar="DIR",
                        help="keep the clusters, logs, backups and history here (default: a "
                        "temporary directory, kept only if a check failed)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the load")
    parser.add_argument("--no-fsync", action="store_true", help="replicas skip fsync (unsafe)")


def _options(args: argparse.Namespace) -> Options | str:
    from bench.alloc_e2e import NODES_PER_RACK

    duration = args.duration
    if args.nodes < NODES_PER_RACK or args.nodes % NODES_PER_RACK:
        return f"--nodes must be a positive multiple of {NODES_PER_RACK}, not {args.nodes}"
    if not 1 <= args.vcs <= args.nodes // NODES_PER_RACK:
        return f"--vcs must be in 1..{args.nodes // NODES_PER_RACK}, not {args.vcs}"
    if args.schedulers < 1 or args.watchers < 1 or args.kv_clients < 1:
        return "--schedulers, --watchers and --kv-clients must be at least 1"
    if args.snapshot_every < 1:
        return f"--snapshot-every must be positive, not {args.snapshot_every}"
    return Options(
        duration_s=duration,
        every_s=args.every or max(20.0, duration / 48),
        sample_s=args.sample_every or min(30.0, max(5.0, duration / 120)),
        replicas=args.replicas, nodes=args.nodes, vcs=args.vcs, schedulers=args.schedulers,
        rate=args.rate, hold_s=args.hold or min(30.0, duration / 8),
        session_s=min(args.session, duration / 2), watchers=args.watchers,
        kv_clients=args.kv_clients, kv_pause_s=args.kv_pause, cli_every_s=args.cli_every,
        cli_mode=args.cli_mode, snapshot_every=args.snapshot_every,
        kill_down_s=args.kill_down, fsync=not args.no_fsync, seed=args.seed,
        check_timeout_s=args.check_timeout,
    )


def run(args: argparse.Namespace) -> int:
    """The ``sdpaxos bench soak`` entry point (see the module)."""
    from bench.soak_report import print_report, soak_figure

    options = _options(args)
    if isinstance(options, str):
        print(f"sdpaxos bench soak: error: {options}", file=sys.stderr)
        return 2
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="sdpaxos-soak-"))
    if args.workdir and root.exists() and any(root.iterdir()):
        print(f"sdpaxos bench soak: error: --workdir {root} is not empty (a run's clusters "
              "would be reused)", file=sys.stderr)
        return 2
    root.mkdir(parents=True, exist_ok=True)
    progress = sys.stderr
    print(f"sdpaxos bench soak: {options.duration_s:g} s, an action every "
          f"{options.every_s:g} s, a sample every {options.sample_s:g} s; work in {root}",
          file=progress, flush=True)
    try:
        report = run_interruptible(Soak(options, root).run())
    except KeyboardInterrupt:
        print(f"sdpaxos bench soak: interrupted; every process it started was stopped "
              f"(work in {root})", file=sys.stderr)
        return 130
    except RuntimeError as exc:  # a cluster that did not start: nothing to judge
        print(f"sdpaxos bench soak: {exc}\n(work in {root})", file=sys.stderr)
        return 1
    failed = [c for c in report["checks"] if not c["ok"]]
    missed = [t for t in report["targets"] if t["met"] is False]
    if args.json == "-":
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
        write_json(args.json, report)
    if args.plot:
        soak_figure(report, args.plot)
    if not args.workdir and not failed:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed or (args.enforce_targets and missed) else 0


# ----------------------------------------------------------------------- the GPU configuration


def gpu_config_text(nodes: int, vcs: int, *, spare: int) -> str:
    """The store's configuration: ``synthetic_config(nodes, vcs)`` and a spare rack, given
    to the virtual clusters ``SPARE_VCS[spare]`` (0: none, the replicas' file)."""
    from cluster_state.config import synthetic_config

    doc = yaml.safe_load(synthetic_config(nodes=nodes, vcs=vcs).to_yaml())
    return edited_config(doc, SPARE_VCS[spare])


def edited_config(doc: dict[str, Any], spare_vcs: tuple[str, ...]) -> str:
    """``doc`` (a configuration without the spare rack) with it, its nodes shared equally by
    ``spare_vcs`` (a whole rack for one)."""
    doc = copy.deepcopy(doc)
    physical = doc["physicalCluster"]
    rack_type = physical["physicalCells"][0]["cellType"]
    size = physical["cellTypes"][rack_type]["childCellNumber"]
    node_type = physical["cellTypes"][rack_type]["childCellType"]
    physical["physicalCells"].append({
        "cellType": rack_type, "cellAddress": "rack-spare",
        "cellChildren": [{"cellAddress": f"spare-node{i:02d}"} for i in range(size)]})
    for name in spare_vcs:
        cells = ({"cellType": rack_type, "cellNumber": 1} if len(spare_vcs) == 1 else
                 {"cellType": f"{rack_type}.{node_type}", "cellNumber": size // len(spare_vcs)})
        doc["virtualClusters"][name] = {"virtualCells": [cells]}
    text: str = yaml.safe_dump(doc, sort_keys=False)
    return text


# ----------------------------------------------------------------------- the run


class Soak:
    """One soak run in ``root`` (see the module)."""

    def __init__(self, options: Options, root: Path) -> None:
        from cluster_state import ops
        from consensus.statemachine import kv_get

        self.options = options
        self.root = root
        gpu_dir, kv_dir = root / "gpu", root / "kv"
        gpu_dir.mkdir(parents=True, exist_ok=True)
        self.vcs = [f"vc{k:02d}" for k in range(options.vcs)]
        self.config_text = gpu_config_text(options.nodes, options.vcs, spare=0)
        (gpu_dir / "gpu.yaml").write_text(self.config_text)
        extra: tuple[str, ...] = ("--snapshot-every", str(options.snapshot_every))
        if not options.fsync:
            extra += ("--no-fsync",)
        gpu_base, kv_base = base_ports(2, options.seed)
        self.gpu = SoakCluster(
            "gpu", gpu_dir, options.replicas, gpu_base, grpc=True, extra_args=extra,
            state_machine={"kind": "cluster_state", "gpu_config": "gpu.yaml"},
            probe_op=ops.get_events(1 << 62))
        self.kv = SoakCluster("kv", kv_dir, options.replicas, kv_base, extra_args=extra,
                              probe_op=kv_get(PROBE_KEY))
        self.began = time.monotonic()
        self.load_s = 0.0  # how long the load ran (set when it stops)
        self.acked = AckedAllocations()
        self.records: list[Record] = []
        self.samples: list[dict[str, Any]] = []
        self.actions: list[dict[str, Any]] = []
        self.crashes: list[str] = []
        self.edits = 0
        self.spare = 0  # the configuration applied last: SPARE_VCS[spare]
        self.backups: dict[str, Path] = {}

    def clock(self) -> float:
        """Seconds since the load began."""
        return time.monotonic() - self.began

    async def run(self) -> dict[str, Any]:
        clusters = (self.gpu, self.kv)
        try:
            for cluster in clusters:
                cluster.start()
            for cluster in clusters:
                try:
                    await cluster.wait_serving()
                except ActionFailed as exc:
                    raise RuntimeError(f"{exc}\n{cluster.logs()}") from None
            load = await self._load()
            final = await self._final()
        finally:
            for cluster in clusters:
                cluster.stop()
        return self._report(load, final)

    # ------------------------------------------------------------------ the load phase

    async def _load(self) -> dict[str, Any]:
        o = self.options
        self.began = time.monotonic()
        watchers = Watchers(lambda: self.gpu.client_addresses, lambda: self.gpu.grpc_targets,
                            o.watchers)
        schedulers = Schedulers(lambda: self.gpu.client_addresses, self.vcs,
                                sessions=o.schedulers, rate=o.rate, hold_s=o.hold_s,
                                session_s=o.session_s, seed=o.seed, clock=self.clock,
                                acked=self.acked)
        kv = KVClients(lambda: self.kv.client_addresses, o.kv_clients, o.kv_pause_s,
                       o.session_s, o.seed, self.records)
        one_shot = OneShotWriter(o.cli_mode, o.cli_every_s, kv_config=self.kv.config_path,
                                 kv_addresses=lambda: self.kv.client_addresses,
                                 gpu_config=self.gpu.config_path, vc=self.vcs[0], seed=o.seed,
                                 records=self.records, acked=self.acked, clock=self.clock)
        watchers.start()
        tasks = [asyncio.ensure_future(c) for c in (schedulers.run(), kv.run(), one_shot.run())]
        sampler = asyncio.ensure_future(self._sample_every())
        try:
            await self._operate()
            await asyncio.sleep(max(0.0, o.duration_s - self.clock()))
            self.load_s = self.clock()
            for stopping in (schedulers, kv, one_shot):
                stopping.stop.set()
            done, pending = await asyncio.wait(tasks, timeout=STOP_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            watched = await self._last_event(watchers)
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await schedulers.close()
        await self._sample()  # the state at the end of the load
        return {"schedulers": schedulers, "watchers": watchers, "watched_to_end": watched,
                "one_shot": one_shot}

    async def _last_event(self, watchers: Watchers) -> bool:
        """A last gang placed and released, so that every watcher has an event to reach;
        whether every one took it."""
        from cluster_state.client import AllocationStore
        from cluster_state.errors import ClusterStateError
        from cluster_state.ops import GroupSpec, Member, Placed
        from consensus.errors import SDPaxosError

        watchers.last_group = "soak-end"
        addresses = self.gpu.client_addresses
        # the spare rack's VCs first: no scheduler uses them, so they have room
        candidates = [*SPARE_VCS[self.spare], *self.vcs]
        async with AllocationStore.connect(addresses, attempts=len(addresses)) as store:
            deadline = time.monotonic() + SETTLE_S
            while candidates:
                try:
                    placed = await store.submit(GroupSpec(
                        name="soak-end", vc=candidates[0], priority=PRIORITY,
                        members=(Member(1, 1),)))
                    if isinstance(placed, Placed):
                        await store.release("soak-end")
                        return await watchers.finish(SETTLE_S)
                    candidates.pop(0)  # waiting: no room there
                except (SDPaxosError, ClusterStateError):
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.5)
                    try:  # the submit may have placed it: its release is the last event
                        await store.release("soak-end")
                        return await watchers.finish(SETTLE_S)
                    except (SDPaxosError, ClusterStateError):
                        continue  # (not found: it was not placed)
        await watchers.finish(0.0)
        return False

    async def _operate(self) -> None:
        """The operator's actions, one at a time, every ``every_s`` (see the module); none
        starts in the last ``every_s`` of the run."""
        o = self.options
        for k in range(int(o.duration_s // o.every_s)):
            due = (k + 1) * o.every_s
            if due >= o.duration_s - o.every_s / 2:
                return
            await asyncio.sleep(max(0.0, due - self.clock()))
            kind = ROTATION[k % len(ROTATION)]
            cluster = self.gpu if (k // len(ROTATION)) % 2 == 0 or kind == "config" else self.kv
            await self._act(kind, cluster)

    async def _act(self, kind: ActionKind, cluster: SoakCluster) -> None:
        entry: dict[str, Any] = {"kind": kind, "cluster": cluster.name,
                                 "start_s": round(self.clock(), 3)}
        print(f"  [{self.clock():7.1f} s] {kind} ({cluster.name}) ...", file=sys.stderr,
              flush=True)
        try:
            if kind == "kill":
                detail = await cluster.kill_and_restart(cluster.next_victim(),
                                                        self.options.kill_down_s)
            elif kind == "replace":
                detail = await cluster.replace(cluster.next_victim())
            elif kind == "backup":
                detail = await self._backup(cluster)
            else:
                detail = await self._edit_config()
            entry.update(ok=True, **detail)
        except Exception as exc:
            entry.update(ok=False, error=(str(exc) or repr(exc))[-2000:])
        entry["end_s"] = round(self.clock(), 3)
        self.actions.append(entry)
        print(f"  [{self.clock():7.1f} s] {kind} ({cluster.name}) "
              f"{'done' if entry['ok'] else 'FAILED: ' + entry['error'][:300]}",
              file=sys.stderr, flush=True)

    async def _backup(self, cluster: SoakCluster) -> dict[str, Any]:
        """A backup; the previous one of the cluster is removed once this one checked out."""
        directory = self.root / "backups"
        directory.mkdir(exist_ok=True)
        path = directory / f"{cluster.name}-{len(self.actions):04d}.backup"
        detail = await cluster.backup(path)
        previous = self.backups.get(cluster.name)
        if previous is not None:
            previous.unlink(missing_ok=True)
        self.backups[cluster.name] = path
        return detail

    async def _edit_config(self) -> dict[str, Any]:
        """The spare rack given to one VC (odd edits) or split between two (even): a change
        every time, never back to the replicas' file, and one that drops no group
        (``apply_config`` checks the dry run)."""
        self.edits += 1
        spare = 2 - self.edits % 2
        text = gpu_config_text(self.options.nodes, self.options.vcs, spare=spare)
        path = self.root / "gpu" / f"gpu-edit-{self.edits:03d}.yaml"
        path.write_text(text)
        detail = await self.gpu.apply_config(path)
        self.config_text, self.spare = text, spare
        return detail

    # ------------------------------------------------------------------ sampling

    async def _sample_every(self) -> None:
        while True:
            await self._sample()
            await asyncio.sleep(self.options.sample_s)

    async def _sample(self) -> None:
        at = round(self.clock(), 3)
        for cluster in (self.gpu, self.kv):
            self.crashes.extend(cluster.exited())
        targets = [(c, r, pid, c.data_dir(r), c.spec(r).metrics_address)
                   for c in (self.gpu, self.kv) for r in c.members
                   if (pid := c.pid(r)) is not None]

        def read() -> list[dict[str, Any]]:
            return [sample_replica(c.name, r, pid, path, metrics).to_json()
                    for c, r, pid, path, metrics in targets]

        self.samples.append({"t": at, "replicas": await asyncio.to_thread(read)})

    # ------------------------------------------------------------------ the checks

    async def _final(self) -> dict[str, Any]:
        gpu_digests = await self._gpu_converged()
        listing, plan = await self._store_at_end()
        kv_state, final_call, final_ret = await self._kv_converged()
        sessions = self._sessions_at_end()
        return {"gpu_digests": gpu_digests, "listing": listing, "config_plan": plan,
                "kv_state": kv_state, "final_call_us": final_call, "final_ret_us": final_ret,
                "sessions": sessions}

    async def _store_at_end(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The store's allocations (linearizable) and its dry run of the last configuration
        applied; ``RuntimeError`` if it does not answer within ``SETTLE_S``."""
        from cluster_state.client import AllocationStore
        from cluster_state.errors import ClusterStateError
        from consensus.errors import SDPaxosError

        addresses = self.gpu.client_addresses
        deadline = time.monotonic() + SETTLE_S
        async with AllocationStore.connect(addresses, attempts=len(addresses)) as store:
            while True:
                try:
                    listing = await store.allocations()
                    return listing, await store.plan_reconfiguration(self.config_text)
                except (SDPaxosError, ClusterStateError) as exc:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the store did not answer at the end: {exc}\n"
                                           f"{self.gpu.logs()}") from None
                    await asyncio.sleep(0.5)

    async def _gpu_converged(self) -> dict[int, str] | None:
        """Every store member's digest, once they agree (None if they did not in time)."""
        from cluster_state.client import AllocationStore
        from cluster_state.errors import ClusterStateError
        from consensus.errors import SDPaxosError

        deadline = time.monotonic() + SETTLE_S
        while True:
            digests: dict[int, str] = {}
            for replica in self.gpu.members:
                async with AllocationStore.connect([self.gpu.spec(replica).client_address],
                                                   attempts=1) as store:
                    with contextlib.suppress(SDPaxosError, ClusterStateError, OSError):
                        info = await store.digest(stale=True)
                        digests[replica] = f"{info['revision']}:{info['sha256']}"
            if len(digests) == len(self.gpu.members) and len(set(digests.values())) == 1:
                return digests
            if time.monotonic() > deadline:
                return digests or None
            await asyncio.sleep(0.5)

    async def _kv_converged(self) -> tuple[dict[int, Any], int, int]:
        """Every key-value member's executed slot and data once they agree (or the last seen
        after ``SETTLE_S``), and when that read began and ended (µs)."""
        import msgpack

        from bench.soak_samples import scrape
        from consensus.errors import SDPaxosError
        from consensus.runtime.client import Client
        from consensus.statemachine import kv_get

        call = now_us()
        deadline = time.monotonic() + SETTLE_S
        while True:
            states: dict[int, Any] = {}
            for replica in self.kv.members:
                spec = self.kv.spec(replica)
                metrics = await asyncio.to_thread(scrape, spec.metrics_address)  # type: ignore[arg-type]
                executed = sum(metrics.get("sdpaxos_executed_slots", {}).values())
                data: dict[str, str | None] = {}
                async with Client(1 << 41, [spec.client_address], attempts=1) as client:
                    with contextlib.suppress(SDPaxosError, OSError):
                        for key in KEYS:
                            reply = await client.read(kv_get(key), [key], stale=True)
                            data[key] = msgpack.unpackb(reply.payload)[1]
                states[replica] = {"executed": executed, "data": data}
            values = [json.dumps(s, sort_keys=True) for s in states.values()]
            if len(set(values)) == 1 and len(states[self.kv.members[0]]["data"]) == len(KEYS):
                return states, call, now_us()
            if time.monotonic() > deadline:
                return states, call, now_us()
            await asyncio.sleep(0.5)

    def _sessions_at_end(self) -> dict[str, Any]:
        """Per cluster: the session table's size at the end (its largest member's, from the
        last sample's ``sdpaxos_sessions``), by state."""
        out: dict[str, Any] = {}
        last = self.samples[-1]["replicas"] if self.samples else []
        for cluster in (self.gpu, self.kv):
            reported = [s for s in last if s["cluster"] == cluster.name
                        and s["sessions"] is not None]
            largest = max(reported, key=lambda s: s["sessions"], default=None)
            out[cluster.name] = {
                "sessions": None if largest is None else largest["sessions"],
                "by_state": None if largest is None else largest["sessions_by_state"]}
        return out

    # ------------------------------------------------------------------ the report

    def _report(self, load: dict[str, Any], final: dict[str, Any]) -> dict[str, Any]:
        from consensus.sim.history import dump_jsonl

        o = self.options
        schedulers: Schedulers = load["schedulers"]
        watchers: Watchers = load["watchers"]
        one_shot: OneShotWriter = load["one_shot"]
        judgement = judge(Evidence(
            records=self.records, kv_states=final["kv_state"],
            final_call_us=final["final_call_us"], final_ret_us=final["final_ret_us"],
            gpu_digests=final["gpu_digests"], gpu_members=len(self.gpu.members),
            listing=final["listing"], acked=self.acked, ledgers=watchers.ledgers,
            watched_to_end=load["watched_to_end"], config_plan=final["config_plan"],
            edits=self.edits, actions=self.actions, crashes=self.crashes,
            placed=schedulers.counts["placed"]), check_timeout_s=o.check_timeout_s)
        with (self.root / "history.jsonl").open("w") as out:
            dump_jsonl(judgement.history, out)
        latencies = schedulers.latencies
        targets = soak_targets(self.samples, ((t, v) for t, _, v in latencies),
                               Windows(self.load_s), (self.gpu.name, self.kv.name))
        return {
            "options": o.to_json(), "machine": machine_info(), "directory": str(self.root),
            "load_s": round(self.load_s, 1), "cli_mode": o.cli_mode,
            "checks": judgement.checks, "targets": targets,
            "sessions_at_end": final["sessions"],
            "schedulers": {**schedulers.counts, "sessions_renewed": schedulers.renewed,
                           "p99_ms": _ms(percentile([v for _, _, v in latencies], 0.99))},
            "one_shot": {**one_shot.counts, "mode": one_shot.mode,
                         "p50_ms": _ms(percentile([v for _, _, v in one_shot.latencies], 0.5))},
            "kv": {"operations": tally(self.records),
                   "history_checked": judgement.history_counts,
                   "lincheck_s": round(judgement.lincheck_s, 2)},
            "watchers": [{"events": watchers.events[k], "resumed": watchers.resumed[k],
                          "relisted": watchers.relisted[k],
                          "violations": watchers.ledgers[k].violations[:5]}
                         for k in range(len(watchers.ledgers))],
            "watch_errors": watchers.errors,
            "actions": self.actions, "crashes": self.crashes, "samples": self.samples,
            "latency_timeline": _latency_timeline(latencies, o.sample_s),
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _latency_timeline(latencies: list[tuple[float, str, float]], step_s: float
                      ) -> list[dict[str, Any]]:
    """Per ``step_s`` interval: how many scheduler operations completed, their p50 and p99."""
    bins: dict[int, list[float]] = {}
    for t, _, value in latencies:
        bins.setdefault(int(t // step_s), []).append(value)
    return [{"t": round((k + 1) * step_s, 3), "count": len(v),
             "p50_ms": _ms(percentile(v, 0.5)), "p99_ms": _ms(percentile(v, 0.99))}
            for k, v in sorted(bins.items())]



if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="sdpaxos bench soak")
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
