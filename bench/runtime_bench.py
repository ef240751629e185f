"""``sdpaxos bench runtime``: replicas as real processes on loopback, fsync on, clients here.

Modes (all 16-byte blind writes unless ``--reads``):

* ``peak``: closed loop, ``--clients`` connections with ``--outstanding`` pipelined requests
  each; reports throughput and latency percentiles;
* ``single``: one client, one request at a time: the latency floor;
* ``rate``: open loop at ``--rate`` requests/s (Poisson), e.g. half the measured peak;
* ``restart``: ``--writes`` writes at peak, then kill -9 one replica, restart it from its
  snapshot and log, and time until it has caught up and answers a linearizable read.

Every process started is stopped on exit, also on Ctrl-C or failure.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import time
from collections.abc import Callable
from typing import Any

import msgpack

from bench.harness import (
    BenchSession,
    interrupts_to_exit_code,
    run_interruptible,
    scrape_metrics,
)
from consensus.codec import FrameReader, frame_to_wire
from consensus.runtime.cli import milliseconds_arg
from consensus.runtime.local_cluster import LocalCluster
from consensus.statemachine import kv_put

__all__ = ["add_arguments", "run"]


#: what a response's ``req_id`` is matched with: when the request went out, and what to call
#: with its latency (seconds) and the time it came back
_Waiting = tuple[float, Callable[[float, float], None]]


class PipelinedConnection:
    """A raw pipelined client connection (the bench's own, to keep client CPU low).

    Requests are packed straight from their fields (no ``Command``, no ``ClientRequest``),
    written once per loop turn however many go out in it, and answered through a callback
    rather than a future and a woken coroutine per request: the load generator shares the
    machine's CPUs with the replicas it measures, so what it spends per request caps the peak
    it can observe."""

    def __init__(self, client_id: int) -> None:
        self.client_id = client_id
        self.seq = 0
        self.waiting: dict[int, _Waiting] = {}
        self._out: list[bytes] = []
        self._packer = msgpack.Packer()

    async def open(self, address: tuple[str, int]) -> None:
        self.reader, self.writer = await asyncio.open_connection(*address)
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        frames = FrameReader()
        waiting = self.waiting
        while True:
            data = await self.reader.read(1 << 16)
            if not data:
                return
            now = time.perf_counter()
            for payload in frames.feed(data):
                # [req_id, status, payload, position]: only the id matters to the bench
                started, answered = waiting.pop(msgpack.unpackb(payload)[0])
                answered(now - started, now)

    def request(self, op: bytes, key: str, answered: Callable[[float, float], None]) -> None:
        """Send a blind write of ``op`` to ``key``; ``answered(latency, now)`` is called with
        its answer."""
        self.seq += 1
        seq = self.seq
        self.waiting[seq] = (time.perf_counter(), answered)
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(frame_to_wire(
            self._packer.pack((seq, "cmd", self.client_id, seq, op, (key,), True))
        ))

    def _flush(self) -> None:
        self.writer.write(b"".join(self._out))
        self._out.clear()

    def send(self, op: bytes, key: str) -> asyncio.Future[float]:
        """``request`` with a future of the latency."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        def answered(latency: float, _now: float) -> None:
            if not future.done():
                future.set_result(latency)

        self.request(op, key, answered)
        return future

    async def close(self) -> None:
        self.writer.close()
        self.task.cancel()


class ClosedLoop:
    """``outstanding`` requests kept in flight on one connection until ``deadline``: each
    answer sends the next request at once, from the read callback."""

    def __init__(
        self, connection: PipelinedConnection, ops: list[bytes], keys: list[str],
        deadline: float, measure_from: float, latencies: list[float],
    ) -> None:
        self.connection = connection
        self.rng = random.Random(connection.client_id)
        self.ops, self.keys = ops, keys
        self.deadline, self.measure_from = deadline, measure_from
        self.latencies = latencies
        self.in_flight = 0
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def start(self, outstanding: int) -> None:
        for _ in range(outstanding):
            self._issue()

    def _issue(self) -> None:
        i = self.rng.randrange(len(self.ops))
        self.in_flight += 1
        self.connection.request(self.ops[i], self.keys[i], self._answered)

    def _answered(self, latency: float, now: float) -> None:
        self.in_flight -= 1
        if now >= self.measure_from:
            self.latencies.append(latency)
        if now < self.deadline:
            self._issue()
        elif self.in_flight == 0 and not self.finished.done():
            self.finished.set_result(None)


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    if not ordered:
        return {"p50_ms": float("nan"), "p99_ms": float("nan")}
    return {
        "p50_ms": round(ordered[len(ordered) // 2] * 1000, 3),
        "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000, 3),
    }


@functools.cache
def _writes() -> tuple[list[bytes], list[str]]:
    """The writes every mode sends: 16-byte puts over 4,096 keys (8,192 ops), and each one's
    key (made when a run starts, not when the command line is parsed)."""
    ops = [kv_put(f"k{i % 4096:05d}", f"{i:06d}") for i in range(8192)]
    return ops, [f"k{i % 4096:05d}" for i in range(len(ops))]


async def _connect(
    addresses: list[tuple[str, int]], count: int, first_id: int
) -> list[PipelinedConnection]:
    """``count`` client connections (ids from ``first_id``), spread over the replicas."""
    connections = [PipelinedConnection(first_id + i) for i in range(count)]
    for i, connection in enumerate(connections):
        await connection.open(addresses[i % len(addresses)])
    return connections


async def drive(args: argparse.Namespace, addresses: list[tuple[str, int]]) -> dict[str, object]:
    ops, keys = _writes()
    latencies: list[float] = []
    done = 0
    clients = 1 if args.mode == "single" else args.clients
    connections = await _connect(addresses, clients, 1000)
    await asyncio.sleep(0.2)
    deadline = time.perf_counter() + args.warmup + args.duration
    measure_from = time.perf_counter() + args.warmup

    started = time.perf_counter()
    if args.mode == "rate":
        # Poisson arrivals; every ~0.5 ms, send whatever is due (one sleep per request would
        # cost the generator more CPU than the replicas it measures).
        rng = random.Random(1)
        pending: list[asyncio.Future[float]] = []
        next_at = time.perf_counter()
        while next_at < deadline:
            now = time.perf_counter()
            while next_at <= now:
                connection = connections[rng.randrange(len(connections))]
                i = rng.randrange(len(ops))
                future = connection.send(ops[i], keys[i])
                if next_at >= measure_from:
                    pending.append(future)
                next_at += rng.expovariate(args.rate)
            await asyncio.sleep(0.0005)
        results = await asyncio.gather(*pending)
        latencies.extend(results)
        done = len(results)
    else:
        outstanding = 1 if args.mode == "single" else args.outstanding
        loops = [
            ClosedLoop(c, ops, keys, deadline, measure_from, latencies) for c in connections
        ]
        for closed_loop in loops:
            closed_loop.start(outstanding)
        await asyncio.gather(*(closed_loop.finished for closed_loop in loops))
        done = len(latencies)
    elapsed = time.perf_counter() - max(started, measure_from)
    for connection in connections:
        await connection.close()
    return {
        "mode": args.mode,
        "replicas": len(addresses),
        "completed": done,
        "throughput_per_s": round(done / elapsed),
        **percentiles(latencies),
    }


async def restart(
    args: argparse.Namespace, session: BenchSession, cluster: LocalCluster
) -> dict[str, object]:
    from consensus.errors import SDPaxosError
    from consensus.runtime.client import Client
    from consensus.statemachine import kv_get

    addresses = cluster.client_addresses
    ops, keys = _writes()
    connections = await _connect(addresses, args.clients, 2000)
    written = 0
    started = time.perf_counter()

    async def load(connection: PipelinedConnection) -> None:
        nonlocal written
        rng = random.Random(connection.client_id)

        async def one() -> None:
            nonlocal written
            while written < args.writes:
                written += 1
                i = rng.randrange(len(ops))
                await connection.send(ops[i], keys[i])

        await asyncio.gather(*(one() for _ in range(args.outstanding)))

    await asyncio.gather(*(load(c) for c in connections))
    load_seconds = time.perf_counter() - started
    for connection in connections:
        await connection.close()
    victim = len(addresses) - 1
    cluster.kill(victim)
    target = _executed_slots(cluster, 0)
    session.start_replica(cluster, victim)
    restarted = time.perf_counter()
    caught_up = None
    while time.perf_counter() - restarted < 60:
        if caught_up is None and _executed_slots(cluster, victim) >= target:
            caught_up = time.perf_counter() - restarted
        if caught_up is not None:
            client = Client(1 << 42, [addresses[victim]], timeout_s=1.0, attempts=1)
            try:
                await client.read(kv_get("k00001"), ["k00001"])
                break
            except SDPaxosError:
                pass
            finally:
                await client.close()
        await asyncio.sleep(0.02)
    serving = time.perf_counter() - restarted
    return {
        "mode": "restart",
        "replicas": len(addresses),
        "writes": written,
        "load_seconds": round(load_seconds, 1),
        "completed": written,
        "throughput_per_s": round(written / load_seconds),
        "caught_up_s": None if caught_up is None else round(caught_up, 2),
        "serving_s": round(serving, 2),
        "p50_ms": float("nan"),
        "p99_ms": float("nan"),
    }


class TimedLoop(ClosedLoop):
    """A closed loop that also notes when each answer came (a throughput timeline)."""

    def __init__(self, *args: Any, times: list[float], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.times = times

    def _answered(self, latency: float, now: float) -> None:
        self.times.append(now)
        super()._answered(latency, now)


async def join(
    args: argparse.Namespace, session: BenchSession, cluster: LocalCluster
) -> dict[str, object]:
    """``--writes`` writes, then under a closed loop of writes a new member is added: the
    time from ``member add`` to its promotion, and the throughput while it joins against the
    same load before."""
    from consensus.protocol.membership import Change, encode_change
    from consensus.protocol.membership.config import ADD
    from consensus.runtime.client import Client
    from consensus.runtime.members import info_of_spec

    addresses = cluster.client_addresses
    ops, keys = _writes()
    connections = await _connect(addresses, args.clients, 3000)
    written = 0
    started = time.perf_counter()

    async def fill(connection: PipelinedConnection) -> None:
        rng = random.Random(connection.client_id)

        async def one() -> None:
            nonlocal written
            while written < args.writes:
                written += 1
                i = rng.randrange(len(ops))
                await connection.send(ops[i], keys[i])

        await asyncio.gather(*(one() for _ in range(args.outstanding)))

    await asyncio.gather(*(fill(c) for c in connections))
    load_seconds = time.perf_counter() - started
    # the same closed loop before and while the member joins
    times: list[float] = []
    loops = [TimedLoop(c, ops, keys, float("inf"), 0.0, [], times=times) for c in connections]
    for closed_loop in loops:
        closed_loop.start(args.outstanding)
    await asyncio.sleep(args.warmup + args.duration)
    spec = cluster.add_member_entry(cluster.config.replica(0).site)
    change = Change(ADD, spec.id, info=info_of_spec(spec).encode())
    added_at = time.perf_counter()
    async with Client(1 << 43, addresses, timeout_s=5.0, attempts=len(addresses)) as client:
        await client.execute(encode_change(change), ())
        session.start_replica(cluster, spec.id)
        promoted_at = None
        while time.perf_counter() - added_at < 300:
            status = await client.status()
            members = (status.get("membership") or {}).get("members", [])
            if any(m[0] == spec.id and m[2] for m in members):
                promoted_at = time.perf_counter()
                break
            await asyncio.sleep(0.05)
    settled = time.perf_counter()
    for closed_loop in loops:
        closed_loop.deadline = settled + 1.0
    await asyncio.gather(*(closed_loop.finished for closed_loop in loops))
    for connection in connections:
        await connection.close()
    before_from = added_at - args.duration

    def rate(start: float, end: float) -> float:
        return sum(1 for t in times if start <= t < end) / max(end - start, 1e-9)

    before = rate(before_from, added_at)
    during = rate(added_at, settled)
    return {
        "mode": "join",
        "replicas": len(addresses),
        "writes": written,
        "load_seconds": round(load_seconds, 1),
        "throughput_per_s": round(written / load_seconds),
        "completed": len(times),
        "promoted_s": None if promoted_at is None else round(promoted_at - added_at, 2),
        "before_per_s": round(before),
        "during_per_s": round(during),
        "during_over_before": round(during / before, 3) if before else None,
        "p50_ms": float("nan"),
        "p99_ms": float("nan"),
    }


def _executed_slots(cluster: LocalCluster, replica: int) -> int:
    return int(scrape_metrics(cluster, replica).get("sdpaxos_executed_slots", -1))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=("peak", "single", "rate", "restart", "join"),
                        default="peak",
                        help="peak: closed-loop throughput; single: one client's latency; rate: "
                        "open loop at --rate; restart: recovery after --writes; join: a member "
                        "added under load after --writes (time to promotion, throughput dip)")
    parser.add_argument("--writes", type=int, default=1_000_000,
                        help="before the restart (restart) or the new member (join)")
    parser.add_argument("--replicas", type=int, choices=(3, 5), default=3,
                        help="how many replicas (sites CA, OR, OH, VA, JP in that order)")
    parser.add_argument("--clients", type=int, default=6, help="client connections")
    parser.add_argument("--outstanding", type=int, default=200, help="per client (peak)")
    parser.add_argument("--rate", type=float, default=1000.0, help="requests/s (rate mode)")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.0,
                        help="seconds of load before measuring")
    parser.add_argument("--no-fsync", action="store_true", help="unsafe: the replicas skip fsync")
    parser.add_argument(
        "--emulate-fsync-ms", type=milliseconds_arg, default=0.0, metavar="MS",
        help="each replica's log fsync takes this much longer: a slower disk (a cloud volume's "
        "milliseconds) than this machine's",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--workdir", metavar="DIR",
        help="keep the cluster's files and replica logs here (default: a temporary directory)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    with interrupts_to_exit_code("runtime") as code:
        with BenchSession("runtime", args.workdir, fsync=not args.no_fsync,
                          emulate_fsync_ms=args.emulate_fsync_ms) as session:
            cluster = session.start_cluster("kv", args.replicas, "sdpaxos")
            if args.mode == "restart":
                result = run_interruptible(restart(args, session, cluster))
            elif args.mode == "join":
                result = run_interruptible(join(args, session, cluster))
            else:
                result = run_interruptible(drive(args, cluster.client_addresses))
        result["fsync"] = not args.no_fsync
        if args.emulate_fsync_ms:
            result["emulated_fsync_ms"] = args.emulate_fsync_ms
        if args.json:
            print(json.dumps(result))
        elif args.mode == "join":
            print(
                f"join after {result['writes']:,} writes ({result['throughput_per_s']:,}/s): "
                f"promoted {result['promoted_s']} s after member add; throughput while it "
                f"joined {result['during_per_s']:,}/s against {result['before_per_s']:,}/s "
                f"before (x{result['during_over_before']})"
            )
        elif args.mode == "restart":
            print(
                f"restart after {result['writes']:,} writes ({result['throughput_per_s']:,}/s): "
                f"caught up in {result['caught_up_s']} s, serving linearizable reads after "
                f"{result['serving_s']} s"
            )
        else:
            print(
                f"{result['mode']}: {result['completed']} writes, "
                f"{result['throughput_per_s']:,}/s, p50 {result['p50_ms']} ms, "
                f"p99 {result['p99_ms']} ms ({result['replicas']} replicas as processes, "
                f"fsync {'on' if result['fsync'] else 'off'}"
                + (f", {args.emulate_fsync_ms} ms more per fsync)" if args.emulate_fsync_ms
                   else ")")
            )
    return code[0]
