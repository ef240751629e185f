"""Apply-time cost of the allocation store (``cluster_state``) on a large synthetic cluster.

One ``ClusterStore`` on a ``synthetic_config`` cluster (DGX-like 8-GPU nodes in racks, VCs with
rack, node and half-node cells, a quarter of them with a pinned node) receives a seeded stream
of commands exactly as a replica would apply them: ``store.apply(position, Command)``, msgpack
decoding and encoding and the session table included. The stream first fills the cluster to
``fill`` of its leaves, then keeps it there: each step either releases a random live group or
submits a new one — gangs of 1 to 32 leaves (several pod sizes), guaranteed priorities 0..1000
in a random VC, one in ten opportunistic. A submit that preempts is followed by releases of its
victims (what their schedulers would do), which may place the preemptor. With
``--in-flight N`` the stream is alloc-e2e's load on the store instead: N groups of the demo's
job mix (``cluster_state.workload``) in flight, each submit followed, once N are held, by the
release of a random one (the cluster mostly free).

Reported: p50/p99/max/mean apply time of submits and of releases (µs; ``submit_cpu`` and
``release_cpu``: the same in this thread's CPU time, which a shared machine's other processes
do not inflate by preempting it; ``apply_cpu_per_submit_us``: all of it per submit), outcome
counts, and for the
final state the snapshot size, ``snapshot()`` time (wall and this process's CPU), the same
again with nothing changed (``snapshot_again_s``: every piece kept), ``restore()`` time into a
fresh store (wall and CPU) and the restored store's first ``snapshot()``
(``snapshot_after_restore_s``: every group and event packed again, the longest a snapshot
holds a replica's event loop), which must give the same bytes. Then, after ``ops / 20`` more
steps, a snapshot taken as a replica takes it: ``capture_on_loop_s`` (``capture_snapshot()``,
what runs on the replica's event loop) and ``finish_off_loop_s`` (the bytes made from the
capture, in the replica's snapshot thread).

By default the garbage collector's view of the loaded store is frozen (``gc.freeze()`` after
building it), as a long-running replica would do after loading its configuration: otherwise a
full collection walks the whole cell tree and shows up as multi-millisecond outliers in the
maximum (not in p99). ``--no-gc-freeze`` measures without it.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack

from cluster_state import ClusterStore, GpuConfigError, release, submit, synthetic_config
from cluster_state.workload import next_job
from consensus.messages import Command

__all__ = ["run"]

SHAPES: list[list[tuple[int, int]]] = [
    [(1, 1)],
    [(1, 1)],
    [(1, 2)],
    [(1, 4)],
    [(1, 8)],
    [(1, 8)],
    [(2, 8)],
    [(4, 8)],
    [(2, 8), (1, 4)],
    [(4, 2)],
    [(2, 4), (2, 2)],
]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "count": len(values),
        "p50_us": round(_percentile(values, 0.50) * 1e6, 1),
        "p99_us": round(_percentile(values, 0.99) * 1e6, 1),
        "max_us": round(max(values, default=0.0) * 1e6, 1),
        "mean_us": round(sum(values) / len(values) * 1e6, 1) if values else 0.0,
    }


_T = TypeVar("_T")


def _timed(call: Callable[[], _T]) -> tuple[_T, float, float]:
    """``call()``, its wall time and this process's CPU time for it (seconds: the CPU time
    says less about the other processes of a shared machine)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = call()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def run(
    nodes: int = 1024,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 8,
    vcs: int = 16,
    ops: int = 20_000,
    fill: float = 0.8,
    seed: int = 1,
    freeze_gc: bool = True,
    in_flight: int = 0,
) -> dict[str, Any]:
    """Run the workload; return the measurements as a JSON-able dict. ``in_flight``: keep
    that many groups instead (alloc-e2e's load on the store: its job mix, each group
    released again, the cluster mostly free), ``fill`` unused."""
    rng = random.Random(seed)
    config = synthetic_config(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        nodes_per_rack=nodes_per_rack,
        vcs=vcs,
        pinned=vcs // 4,
    )
    started = time.perf_counter()
    store = ClusterStore(config)
    build_s = time.perf_counter() - started
    if freeze_gc:
        gc.collect()
        gc.freeze()
    names = [vc.name for vc in config.virtual_clusters]
    capacity = nodes * gpus_per_node
    live: dict[str, int] = {}  # group -> leaves
    used = 0
    position = 0
    submit_times: list[float] = []
    release_times: list[float] = []
    # the same, in this thread's CPU time: a shared machine's other processes preempt a
    # wall-clock measure for milliseconds, which then is all its p99 shows
    submit_cpu: list[float] = []
    release_cpu: list[float] = []
    outcomes: dict[str, int] = {}

    def apply(op: bytes) -> tuple[list[Any], float, float]:
        nonlocal position
        position += 1
        command = Command(client_id=1 + position % 7, seq=position, op=op)
        t0, cpu0 = time.perf_counter(), time.thread_time()
        out = store.apply(position, command)
        cpu = time.thread_time() - cpu0
        elapsed = time.perf_counter() - t0
        return msgpack.unpackb(out), elapsed, cpu

    def do_release(name: str) -> list[Any]:
        nonlocal used
        result, elapsed, cpu = apply(release(name))
        release_times.append(elapsed)
        release_cpu.append(cpu)
        used -= live.pop(name, 0)
        for promoted in result[2] if result[0] == "released" else []:
            live[promoted] = pending.pop(promoted)
            used += live[promoted]
        return result

    pending: dict[str, int] = {}  # preempting group -> leaves
    counter = 0

    def wants_submit() -> bool:
        if in_flight:
            return len(live) + len(pending) < in_flight
        return used < fill * capacity or rng.random() < 0.5

    def step() -> None:
        nonlocal counter, used
        if not live or wants_submit():
            counter += 1
            name = f"job{counter:07d}"
            if in_flight:  # alloc-e2e's scheduler: the demo's job mix
                job = next_job(rng, name, names, mean_duration_s=1.0)
                members, priority, vc = [list(m) for m in job.members], job.priority, job.vc
            else:
                members = rng.choice(SHAPES)
                priority = -1 if rng.random() < 0.1 else rng.randint(0, 1000)
                vc = rng.choice(names)
            leaves = sum(p * n for p, n in members)
            op = submit(name, vc, priority, members)
            result, elapsed, cpu = apply(op)
            submit_times.append(elapsed)
            submit_cpu.append(cpu)
            kind = result[0]
            outcomes[kind] = outcomes.get(kind, 0) + 1
            if kind == "placed":
                live[name] = leaves
                used += leaves
            elif kind == "preempting":
                pending[name] = leaves
                for victim in result[2]:
                    if victim in live:
                        do_release(victim)
        else:
            do_release(rng.choice(sorted(live)))

    for _ in range(ops):
        step()
    snap, snapshot_s, snapshot_cpu_s = _timed(store.snapshot)
    _, again_s, _ = _timed(store.snapshot)  # nothing changed: every piece kept
    # a replica's snapshot: captured on its event loop, finished in a worker thread
    # (``consensus.runtime.snapshot_writer``), after an interval of changes
    changes = max(1, ops // CAPTURE_INTERVAL_FRACTION)
    for _ in range(changes):
        step()
    finish, capture_s, capture_cpu_s = _timed(store.capture_snapshot)
    _, finish_s, _ = _timed(finish)
    fresh = ClusterStore(store.topology)
    _, restore_s, restore_cpu_s = _timed(lambda: fresh.restore(snap))
    # the restored store's first snapshot packs every group and event again: the worst
    # case of a snapshot's time on a replica's event loop
    restored, after_restore_s, _ = _timed(fresh.snapshot)
    assert restored == snap, "restore must reproduce the snapshot byte for byte"
    if freeze_gc:
        gc.unfreeze()
    summary = msgpack.unpackb(store.query(msgpack.packb(["summary"])))[2]
    chain = summary["chains"][0]
    return {
        "cluster": {
            "nodes": nodes,
            "gpus": capacity,
            "racks": nodes // nodes_per_rack,
            "vcs": vcs,
            "build_s": round(build_s, 3),
        },
        "ops": ops,
        "in_flight": in_flight,
        "gc_frozen": freeze_gc,
        "submit": _summary(submit_times),
        "release": _summary(release_times),
        "submit_cpu": _summary(submit_cpu),
        "release_cpu": _summary(release_cpu),
        # every apply's CPU (submits and releases) per submit: what a submit costs with its
        # share of the releases, as alloc-e2e's CPU per allocation counts it
        "apply_cpu_per_submit_us": round(
            (sum(submit_cpu) + sum(release_cpu)) / max(1, len(submit_cpu)) * 1e6, 1),
        "outcomes": outcomes,
        "final": {
            "groups": summary["groups"],
            "guaranteed_leaves": chain["guaranteed"],
            "opportunistic_leaves": chain["opportunistic"],
            "free_leaves": chain["free"],
        },
        "snapshot": {
            "bytes": len(snap),
            "snapshot_s": round(snapshot_s, 4),
            "snapshot_cpu_s": round(snapshot_cpu_s, 4),
            "snapshot_again_s": round(again_s, 4),
            "snapshot_after_restore_s": round(after_restore_s, 4),
            "capture_after_ops": changes,
            "capture_on_loop_s": round(capture_s, 4),
            "capture_on_loop_cpu_s": round(capture_cpu_s, 4),
            "finish_off_loop_s": round(finish_s, 4),
            "restore_s": round(restore_s, 4),
            "restore_cpu_s": round(restore_cpu_s, 4),
        },
    }


#: the snapshot captured as a replica does it follows this fraction of ``ops`` more steps
CAPTURE_INTERVAL_FRACTION = 20

#: the exit status of a usage error (argparse's)
USAGE_ERROR = 2


def check_arguments(args: argparse.Namespace) -> str | None:
    """What makes these parameters impossible (one line), or None."""
    if min(args.nodes, args.gpus_per_node, args.nodes_per_rack, args.vcs) < 1:
        return "--nodes, --gpus-per-node, --nodes-per-rack and --vcs must be positive"
    if args.ops < 1:
        return f"--ops must be positive, not {args.ops}"
    if args.in_flight < 0:
        return f"--in-flight must be 0 or more, not {args.in_flight}"
    if not 0 < args.fill <= 1:
        return f"--fill must be in (0, 1], not {args.fill}"
    try:
        synthetic_config(nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                         nodes_per_rack=args.nodes_per_rack, vcs=args.vcs,
                         pinned=args.vcs // 4)
    except GpuConfigError as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--nodes-per-rack", type=int, default=8)
    parser.add_argument("--vcs", type=int, default=16)
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--fill", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-gc-freeze", dest="freeze_gc", action="store_false")
    parser.add_argument("--in-flight", type=int, default=0,
                        help="keep this many groups of alloc-e2e's job mix in flight "
                        "(submit, then release a random one) instead of filling to --fill")
    args = parser.parse_args(argv)
    problem = check_arguments(args)
    if problem is not None:
        print(f"alloc_bench: error: {problem}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR)
    print(
        json.dumps(
            run(
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                nodes_per_rack=args.nodes_per_rack,
                vcs=args.vcs,
                ops=args.ops,
                fill=args.fill,
                seed=args.seed,
                freeze_gc=args.freeze_gc,
                in_flight=args.in_flight,
            ),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
