"""CPU per loop turn and per write of three replica nodes in one process (issue 37 point 5).

Three ``ReplicaNode``s with the key-value store on loopback, one client of the sequencer's
replica, 16-byte blind writes numbered as ``bench runtime`` and ``bench throughput`` number
theirs (a pinned session: acknowledged when ready):
``--outstanding 1`` is the low-load case (one write at a time: every turn carries at most a
command or a few messages), a large ``--outstanding`` the loaded one. Reported:

* ``turn_us``: CPU (``time.thread_time``, the loop's thread) per loop turn, summed over the
  turn's parts the driver runs — taking the inbox to the core (``TurnLoop._feed``), ticking,
  ``core.ready()`` and carrying the ``Ready`` out — averaged over every node's turns;
* ``process_us_per_write``: the whole process's CPU (``time.process_time``: the three
  replicas, their sockets and the client) per write;
* ``peer_frames_per_write``: frames the replicas handed their peer connections per write
  (one per peer per turn that had messages for it);
* with ``--profile FILE``: a cProfile of the measured part, written to FILE.

The event loop is uvloop's and the collector's thresholds a serving replica's, as in
``sdpaxos serve``.

``sdpaxos bench turn-cost`` (or ``python -m bench.turn_cost`` from a checkout root, with
``PYTHONPATH=.``: the same file measures an older checkout when copied into its ``bench``
directory, as it patches nothing but ``TurnLoop`` methods that both have). It prints one JSON
object.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from consensus.runtime.cli import SERVE_GC_THRESHOLDS, cluster_toml
from consensus.runtime.client import Client
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.runtime.turns import TurnLoop
from consensus.statemachine import KVStore, kv_put

__all__ = ["add_arguments", "main", "measure", "run"]


class _TurnClock:
    """Thread CPU spent in the turn's parts, patched onto ``TurnLoop`` while measuring."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self.on = False

    @property
    def seconds(self) -> float:
        return sum(self.parts.values())

    def timed(self, part: str, function: Callable[..., Any]) -> Callable[..., Any]:
        clock = self
        self.parts[part] = 0.0

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not clock.on:
                return function(*args, **kwargs)
            started = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                clock.parts[part] += time.thread_time() - started

        return wrapper

    def timed_async(self, part: str, function: Callable[..., Any]) -> Callable[..., Any]:
        clock = self
        self.parts[part] = 0.0

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not clock.on:
                return await function(*args, **kwargs)
            started = time.thread_time()  # (a turn yields only in long applies: not here)
            try:
                return await function(*args, **kwargs)
            finally:
                clock.parts[part] += time.thread_time() - started

        return wrapper


async def measure(writes: int, outstanding: int, *, fsync: bool, warmup: int,
                  profile: str | None) -> dict[str, Any]:
    clock = _TurnClock()
    feed, carry_out = TurnLoop._feed, TurnLoop._carry_out
    TurnLoop._feed = clock.timed("feed", feed)  # type: ignore[method-assign]
    TurnLoop._carry_out = clock.timed_async("carry_out", carry_out)  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory(prefix="turn-cost-") as tmp:
        path = Path(tmp) / "cluster.toml"
        path.write_text(cluster_toml(3, free_base_port(), wan=False))
        config = load_cluster_config(path)
        nodes = [ReplicaNode(config, i, KVStore(), fsync=fsync) for i in range(3)]
        for node in nodes:
            await node.start()
            node.core.ready = clock.timed("ready", node.core.ready)  # type: ignore[method-assign]
            node.core.tick = clock.timed("tick", node.core.tick)  # type: ignore[method-assign]
        client = Client(7, [spec.client_address for spec in config.replicas], home=0,
                        timeout_s=30.0)
        try:
            async def write_all(count: int, first: int) -> None:
                queue = iter(range(first, first + count))

                async def one_by_one() -> None:
                    for n in queue:
                        await client.execute(kv_put(f"k{n % 1000}", "v" * 16), [f"k{n % 1000}"],
                                             blind=True, seq=n + 1)

                await asyncio.gather(*(one_by_one() for _ in range(outstanding)))

            await write_all(warmup, 0)
            turns_before = sum(node.stats.turns for node in nodes)
            frames_before = sum(node.transport.stats.frames_sent for node in nodes)
            cpu_before, wall_before = time.process_time(), time.perf_counter()
            profiler = cProfile.Profile() if profile else None
            clock.on = True
            if profiler is not None:
                profiler.enable()
            await write_all(writes, warmup)
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(profile)  # type: ignore[arg-type]
            clock.on = False
            cpu = time.process_time() - cpu_before
            wall = time.perf_counter() - wall_before
            turns = sum(node.stats.turns for node in nodes) - turns_before
            frames = sum(node.transport.stats.frames_sent for node in nodes) - frames_before
        finally:
            await client.close()
            for node in nodes:
                await node.stop()
            TurnLoop._feed, TurnLoop._carry_out = feed, carry_out  # type: ignore[method-assign]
    return {
        "writes": writes, "outstanding": outstanding, "fsync": fsync,
        "turns": turns, "turns_per_write": round(turns / writes, 2),
        "peer_frames_per_write": round(frames / writes, 2),
        "turn_us": round(clock.seconds / turns * 1e6, 1),
        "turn_parts_us": {part: round(seconds / turns * 1e6, 1)
                          for part, seconds in clock.parts.items()},
        "turn_cpu_us_per_write": round(clock.seconds / writes * 1e6, 1),
        "process_us_per_write": round(cpu / writes * 1e6, 1),
        "writes_per_s": round(writes / wall),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--writes", type=int, default=2000, help="measured writes")
    parser.add_argument("--warmup", type=int, default=200, help="writes before measuring")
    parser.add_argument("--outstanding", type=int, default=1,
                        help="writes in flight (1: one at a time, the low-load case)")
    parser.add_argument("--fsync", action="store_true", help="replicas fsync (default: not)")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the run")
    parser.add_argument("--asyncio", action="store_true",
                        help="the standard event loop (default: uvloop, as a replica serves)")


def run(args: argparse.Namespace) -> int:
    if not args.asyncio:
        import uvloop

        uvloop.install()
    gc.set_threshold(*SERVE_GC_THRESHOLDS)  # as a serving replica
    result = asyncio.run(measure(args.writes, args.outstanding, fsync=args.fsync,
                                 warmup=args.warmup, profile=args.profile))
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
