"""``sdpaxos bench restart``: how long recovery takes at real log sizes, with real replica
processes on loopback and fsync on.

Every experiment runs on a fresh 3-replica cluster (key-value state machine) whose replicas run
with ``serve --snapshot-every`` far above the load, so the whole load stays in the write-ahead
log since the last snapshot (the replica directories are checked for snapshot files anyway and
the count is reported). The load: ``--commands N`` 16-byte blind writes from ``--clients``
pipelined connections spread over the replicas, ``--outstanding`` in flight each (the fast
path of ``sdpaxos bench runtime --mode peak``), until N were acknowledged; the load rate is
reported. Then the bench waits until every replica has executed the same slot. The replicas
batch many commands per slot; ``--max-batch 1`` makes every command its own slot, for logs that
are long in slots (what a restart re-runs instances for) rather than in commands.

* **Full restart** (per size and per ``--signals``: ``kill`` = SIGKILL, ``term`` = SIGTERM):
  every replica is stopped with the signal, then all are started again. Per replica: seconds
  from its start until its client port accepts connections (``listening``) and until a
  linearizable write and a linearizable read sent to it alone both succeeded (``serving``); the
  cluster serves again when every replica does (the largest of these). Snapshot files are
  counted after the load and again after the stop (a clean stop may take one, so that the start
  has nothing to execute again; a SIGKILL replays the log).
* **One replica restarted under load** (per size, unless ``--no-under-load``): closed-loop
  blind writes at the two replicas that are not restarted; after a one-second baseline a
  follower (never the sequencer, which the metrics endpoint names) is killed with SIGKILL and
  started at once. Reported: completed writes per 100 ms at the others from one second before
  the kill until one second after the restarted replica answered a linearizable read again,
  the longest gap between completions and the largest request latency in that window, and the
  time until the restarted replica served the read.

Every wait is bounded: a restart that does not serve within ``--timeout`` seconds is reported as
such (``null`` in the JSON) and the bench moves on. Every process started is stopped at the end,
also on error or Ctrl-C (``BenchSession``); the cluster files live in a temporary directory
unless ``--workdir`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import random
import signal
import subprocess
import sys
import time
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, Literal, cast

from rich.console import Console

from bench.harness import (
    BenchSession,
    _interrupts_deferred,
    interrupts_to_exit_code,
    machine_info,
    print_table,
    run_interruptible,
    scrape_metrics,
    sequencer_of,
    wait_ready,
    write_json,
)
from consensus.codec import FrameReader, frame_to_wire
from consensus.errors import DecodeError, SDPaxosError
from consensus.messages import Command
from consensus.runtime.client import Client
from consensus.runtime.client_protocol import ClientRequest, decode_response
from consensus.runtime.local_cluster import LocalCluster
from consensus.statemachine import kv_get, kv_put

__all__ = ["add_arguments", "run"]

REPLICAS = 3
DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
#: ``serve --snapshot-every``: far above any load, so no snapshot is taken during it
NO_SNAPSHOTS = 1 << 62
#: distinct keys the load writes (the state machine stays small; the log is what grows)
KEYS = 4096
#: client ids: load connections from here, probes from PROBE_ID_BASE (disjoint ranges)
LOAD_ID_BASE = 10_000
PROBE_ID_BASE = 1 << 41
PROBE_KEY = "restart-probe"
#: a probe request not answered this long is given up and sent again
PROBE_TIMEOUT_S = 2.0
PROBE_INTERVAL_S = 0.05
#: how long a load may take at the least: the bound is this plus N at LOAD_MIN_RATE per second
LOAD_BASE_S = 60.0
LOAD_MIN_RATE = 1000.0
#: after the load, every replica must reach the same executed slot within this
SETTLE_TIMEOUT_S = 60.0
SETTLE_POLL_S = 0.2
#: a replica that does not exit this long after SIGTERM is killed (and that is reported)
TERM_TIMEOUT_S = 30.0
#: the under-load experiment: baseline before the kill, load kept after the replica serves
BASELINE_S = 1.0
AFTER_S = 1.0
BUCKET_S = 0.1
#: the under-load experiment waits this long at most for a sequencer to be named
SEQUENCER_WAIT_S = 10.0
#: at the end of a load, requests still unanswered after this long are given up
DRAIN_S = 10.0
START_TIMEOUT_S = 60.0
#: the largest ``[protocol] max_batch`` the configuration accepts
MAX_BATCH_LIMIT = 65536

Signal = Literal["kill", "term"]
SIGNALS: dict[str, signal.Signals] = {"kill": signal.SIGKILL, "term": signal.SIGTERM}


# ---------------------------------------------------------------------------- load


class _Pipe(asyncio.Protocol):
    """One pipelined client connection (one client id) sending 16-byte blind writes."""

    def __init__(self, load: _Load, client_id: int, address: tuple[str, int]) -> None:
        self.load = load
        self.client_id = client_id
        self.address = address
        self.rng = random.Random(client_id)
        self.seq = 0
        self.waiting: dict[int, float] = {}
        self.frames = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError):
            await loop.create_connection(lambda: self, *self.address)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.frames = FrameReader()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.load.lost += len(self.waiting)
        self.load.issued -= len(self.waiting)  # sent again elsewhere in the count
        self.waiting.clear()

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        try:
            payloads = self.frames.feed(data)
        except DecodeError:
            if self.transport is not None:
                self.transport.close()
            return
        for payload in payloads:
            try:
                response = decode_response(payload)
            except DecodeError:
                continue
            sent = self.waiting.pop(response.req_id, None)
            if sent is not None:
                self.load.done(sent, now, ok=response.status == "ok")
        self.fill(now)

    def fill(self, now: float) -> None:
        load = self.load
        while (
            self.transport is not None
            and len(self.waiting) < load.outstanding
            and load.may_issue()
        ):
            index = self.rng.randrange(2 * KEYS)
            key = f"k{index % KEYS:05d}"
            self.seq += 1
            command = Command(
                client_id=self.client_id, seq=self.seq, op=load.ops[index], keys=(key,),
                blind=True,
            )  # fmt: skip
            self.out.append(frame_to_wire(ClientRequest(self.seq, "cmd", command).encode()))
            self.waiting[self.seq] = now
            load.issued += 1
        if self.out and self.transport is not None:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def expire(self, now: float, timeout_s: float) -> None:
        stale = [seq for seq, sent in self.waiting.items() if now - sent > timeout_s]
        for seq in stale:
            del self.waiting[seq]
        self.load.timeouts += len(stale)
        self.load.issued -= len(stale)


class _Load:
    """Closed-loop blind writes over ``connections`` pipelined connections to ``addresses``
    (round-robin): until ``target`` were acknowledged, or (target None) until stopped."""

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        connections: int,
        outstanding: int,
        target: int | None,
        *,
        record: bool = False,
        id_base: int = LOAD_ID_BASE,
    ) -> None:
        # 16-byte operations, as in ``bench runtime``
        self.ops = [kv_put(f"k{i % KEYS:05d}", f"{i:06d}") for i in range(2 * KEYS)]
        self.outstanding = outstanding
        self.target = target
        self.record = record
        self.pipes = [
            _Pipe(self, id_base + i, addresses[i % len(addresses)]) for i in range(connections)
        ]
        self.issued = 0
        self.ok = 0
        self.errors = 0
        self.lost = 0
        self.timeouts = 0
        self.stopped = False
        self.finished = asyncio.Event()
        #: with ``record``: completion time and latency of every acknowledged write
        self.done_at: array[float] = array("d")
        self.latency: array[float] = array("d")

    def may_issue(self) -> bool:
        if self.stopped:
            return False
        return self.target is None or self.issued < self.target

    def done(self, sent: float, now: float, *, ok: bool) -> None:
        if not ok:
            self.errors += 1
            self.issued -= 1  # sent again: the count is of acknowledged writes
            return
        self.ok += 1
        if self.record:
            self.done_at.append(now)
            self.latency.append(now - sent)
        if self.target is not None and self.ok >= self.target:
            self.finished.set()

    def pending(self) -> int:
        return sum(len(pipe.waiting) for pipe in self.pipes)

    async def run(self, deadline: float, request_timeout_s: float) -> None:
        """Until the target is reached (or ``stop()``), at most until ``deadline``."""
        for pipe in self.pipes:
            await pipe.connect()
        now = time.monotonic()
        for pipe in self.pipes:
            pipe.fill(now)
        while not self.finished.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.finished.wait(), 0.1)
            now = time.monotonic()
            for pipe in self.pipes:  # lost connections come back; stale requests go again
                pipe.expire(now, request_timeout_s)
                if pipe.transport is None and not self.stopped:
                    await pipe.connect()
                pipe.fill(now)

    def stop(self) -> None:
        self.stopped = True
        self.finished.set()

    async def drain(self, bound_s: float) -> None:
        give_up = time.monotonic() + bound_s
        while self.pending() and time.monotonic() < give_up:
            await asyncio.sleep(0.01)
        for pipe in self.pipes:
            if pipe.transport is not None:
                pipe.transport.close()
        await asyncio.sleep(0)


# ---------------------------------------------------------------------------- probes


async def _until_serving(
    address: tuple[str, int],
    process: subprocess.Popen[bytes],
    since: float,
    deadline: float,
    ids: Iterator[int],
    *,
    write: bool,
) -> tuple[float | None, float | None, int | None]:
    """(seconds from ``since`` until ``address`` accepted a connection, ... until it answered a
    linearizable write (if ``write``) and a linearizable read sent to it alone, the replica
    process's exit status if it exited meanwhile); None: not by ``deadline``."""
    listening: float | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:  # it will not serve: no need to wait for the deadline
            return listening, None, process.returncode
        tried = time.monotonic()
        if listening is None:
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    _, writer = await asyncio.open_connection(*address)
                writer.close()
                listening = time.monotonic() - since
            except (OSError, TimeoutError):
                await asyncio.sleep(max(0.0, tried + PROBE_INTERVAL_S - time.monotonic()))
                continue
        client = Client(next(ids), [address], timeout_s=PROBE_TIMEOUT_S, attempts=1)
        try:
            if write:
                await client.execute(kv_put(PROBE_KEY, f"{tried:.6f}"), [PROBE_KEY])
            await client.read(kv_get(PROBE_KEY), [PROBE_KEY])
            return listening, time.monotonic() - since, None
        except (OSError, TimeoutError, SDPaxosError):
            await asyncio.sleep(max(0.0, tried + PROBE_INTERVAL_S - time.monotonic()))
        finally:
            await client.close()
    return listening, None, None


# ---------------------------------------------------------------------------- one experiment


class _Experiment:
    def __init__(self, args: argparse.Namespace, session: BenchSession, console: Console) -> None:
        self.args = args
        self.session = session
        self.console = console
        self.probe_ids = itertools.count(PROBE_ID_BASE)
        self.load_ids = itertools.count(LOAD_ID_BASE, 1000)

    def note(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    async def start_cluster(self, label: str) -> LocalCluster:
        extra: tuple[str, ...] = ("--snapshot-every", str(NO_SNAPSHOTS))
        if not self.session.fsync:
            extra += ("--no-fsync",)
        protocol = 'name = "sdpaxos"'
        if self.args.max_batch is not None:
            protocol += f"\nmax_batch = {self.args.max_batch}"
        cluster = LocalCluster(
            self.session.next_dir(label), REPLICAS, protocol=protocol, extra_args=extra
        )
        self.session.clusters.append(cluster)
        with _interrupts_deferred():
            cluster.start_all()
        try:
            await wait_ready(cluster.client_addresses, START_TIMEOUT_S)
        except SDPaxosError as exc:
            raise RuntimeError(f"cluster did not start: {exc}\n{cluster.logs()}") from None
        return cluster

    async def load(self, cluster: LocalCluster, commands: int) -> dict[str, Any]:
        """``commands`` acknowledged blind writes, then until every replica executed as far."""
        load = _Load(
            cluster.client_addresses, self.args.clients, self.args.outstanding, commands,
            id_base=next(self.load_ids),
        )  # fmt: skip
        started = time.monotonic()
        await load.run(started + LOAD_BASE_S + commands / LOAD_MIN_RATE, DRAIN_S)
        elapsed = time.monotonic() - started
        await load.drain(DRAIN_S)
        if load.ok < commands:
            raise RuntimeError(
                f"load: only {load.ok:,} of {commands:,} writes acknowledged in {elapsed:.0f} s"
            )
        slots = await self.settle(cluster)
        return {
            "commands": commands,
            "acknowledged": load.ok,
            "load_s": round(elapsed, 2),
            "load_rate_per_s": round(load.ok / elapsed),
            "load_errors": load.errors,
            "executed_slots": slots,
            "snapshot_files": _snapshot_files(cluster),
        }

    async def settle(self, cluster: LocalCluster) -> list[int]:
        """Until every replica reports the same executed slot twice in a row (bounded)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        previous: list[int] = []
        while True:
            slots = [
                int(scrape_metrics(cluster, r).get("sdpaxos_executed_slots", -1))
                for r in range(REPLICAS)
            ]
            if slots == previous and len(set(slots)) == 1 and slots[0] >= 0:
                return slots
            if time.monotonic() > deadline:
                self.note(f"  replicas did not settle on one executed slot: {slots}")
                return slots
            previous = slots
            await asyncio.sleep(SETTLE_POLL_S)

    # ------------------------------------------------------------------ full restart
    async def full_restart(self, commands: int, how: Signal) -> dict[str, Any]:
        cluster = await self.start_cluster(f"full-{how}-{commands}")
        try:
            self.note(f"[full restart, {how}] loading {commands:,} commands")
            entry: dict[str, Any] = {"signal": how, **await self.load(cluster, commands)}
            self.note(
                f"  {entry['load_rate_per_s']:,} commands/s; executed slot "
                f"{entry['executed_slots'][0]:,}; stopping every replica ({how})"
            )
            stopped = time.monotonic()
            forced = self.stop_all(cluster, SIGNALS[how])
            entry["shutdown_s"] = round(time.monotonic() - stopped, 3)
            entry["killed_after_term"] = forced
            # a clean stop may snapshot on its way out, so the start has nothing to execute again
            entry["snapshot_files_after_stop"] = _snapshot_files(cluster)
            started: dict[int, float] = {}
            with _interrupts_deferred():
                for replica in range(REPLICAS):
                    started[replica] = time.monotonic()
                    cluster.start(replica)
            first = min(started.values())
            deadline = first + self.args.timeout
            results = await asyncio.gather(*(
                _until_serving(cluster.client_addresses[r], cluster.processes[r], started[r],
                               deadline, self.probe_ids, write=True)
                for r in range(REPLICAS)
            ))  # fmt: skip
            entry["replicas"] = [
                {"replica": r, "listening_s": _round(listening), "serving_s": _round(serving),
                 "exited_with": exited}
                for r, (listening, serving, exited) in enumerate(results)
            ]  # fmt: skip
            served = [serving for _, serving, _ in results]
            entry["cluster_serving_s"] = (
                None if None in served
                else round(max(started[r] - first + cast(float, served[r])
                               for r in range(REPLICAS)), 3)
            )  # fmt: skip
            entry["timeout_s"] = self.args.timeout
            self.note(f"  serving again: {_describe_serving(entry)}")
            return entry
        finally:
            self.session.stop_cluster(cluster)

    def stop_all(self, cluster: LocalCluster, how: signal.Signals) -> list[int]:
        """Signal every replica at once and wait for them; those still running
        ``TERM_TIMEOUT_S`` after a SIGTERM are killed (returned)."""
        processes = dict(cluster.processes)
        cluster.processes.clear()
        for process in processes.values():
            process.send_signal(how)
        forced = []
        for replica, process in processes.items():
            try:
                process.wait(TERM_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                forced.append(replica)
        return forced

    # ------------------------------------------------------------------ one replica under load
    async def under_load(self, commands: int) -> dict[str, Any]:
        cluster = await self.start_cluster(f"under-load-{commands}")
        try:
            self.note(f"[one replica under load] loading {commands:,} commands")
            entry: dict[str, Any] = await self.load(cluster, commands)
            sequencer = None
            wait_until = time.monotonic() + SEQUENCER_WAIT_S
            while sequencer is None and time.monotonic() < wait_until:
                sequencer = sequencer_of(cluster)
                if sequencer is None:
                    await asyncio.sleep(SETTLE_POLL_S)
            if sequencer is None:
                raise RuntimeError("no replica says it is the sequencer")
            victim = max(r for r in range(REPLICAS) if r != sequencer)
            others = [r for r in range(REPLICAS) if r != victim]
            entry.update({"sequencer": sequencer, "restarted": victim, "others": others})
            self.note(f"  sequencer {sequencer}; killing follower {victim} under load")
            background = _Load(
                [cluster.client_addresses[r] for r in others], self.args.bg_clients,
                self.args.bg_outstanding, None, record=True, id_base=next(self.load_ids),
            )  # fmt: skip
            window_start = time.monotonic()
            hard_stop = window_start + BASELINE_S + self.args.timeout + AFTER_S + 1
            runner = asyncio.create_task(background.run(hard_stop, self.args.timeout))
            try:
                await asyncio.sleep(BASELINE_S)
                killed = time.monotonic()
                cluster.kill(victim)
                with _interrupts_deferred():
                    cluster.start(victim)
                restarted = time.monotonic()
                listening, serving, exited = await _until_serving(
                    cluster.client_addresses[victim], cluster.processes[victim], restarted,
                    restarted + self.args.timeout, self.probe_ids, write=False,
                )  # fmt: skip
                await asyncio.sleep(AFTER_S)
            finally:
                window_end = time.monotonic()  # the drain after it is not service time
                background.stop()
                await runner
                await background.drain(DRAIN_S)
            # its own account of the catch-up (read once the load stopped: the read blocks):
            # the longest piece of work between two yields to its event loop, and how late
            # its loop's probe timer fired
            restarted_metrics = scrape_metrics(cluster, victim)
            entry.update({
                "restart_listening_s": _round(listening),
                "restart_serving_s": _round(serving),
                "restart_exited_with": exited,
                "timeout_s": self.args.timeout,
                "restarted_busy_longest_ms": _ms(
                    restarted_metrics.get("sdpaxos_busy_longest_seconds")),
                "restarted_stall_longest_ms": _ms(
                    restarted_metrics.get("sdpaxos_loop_stall_longest_seconds")),
                **_service_at_others(background, window_start, killed, window_end),
            })  # fmt: skip
            self.note(
                f"  restarted replica serving after {entry['restart_serving_s']} s; longest gap "
                f"at the others {entry['longest_gap_ms']} ms"
            )
            return entry
        finally:
            self.session.stop_cluster(cluster)


def _service_at_others(load: _Load, start: float, killed: float, end: float) -> dict[str, Any]:
    """Per-100 ms completions at the others from ``BASELINE_S`` before the kill to ``end``,
    the longest gap between completions and the largest latency after the kill."""
    buckets = [0] * (int((end - start) / BUCKET_S) + 1)
    longest_gap = 0.0
    largest_latency = 0.0
    previous = killed
    baseline = 0
    for done_at, latency in zip(load.done_at, load.latency, strict=True):
        if done_at > end:
            break  # answered in the drain, after the window (completions come in time order)
        index = int((done_at - start) / BUCKET_S)
        if 0 <= index < len(buckets):
            buckets[index] += 1
        if done_at < killed:
            baseline += 1
            continue
        longest_gap = max(longest_gap, done_at - previous)
        previous = done_at
        largest_latency = max(largest_latency, latency)
    longest_gap = max(longest_gap, end - previous) if load.ok else end - killed
    kill_bucket = int((killed - start) / BUCKET_S)
    after = buckets[kill_bucket:-1] or [0]  # the last bucket is partial
    return {
        "bucket_s": BUCKET_S,
        "kill_at_s": round(killed - start, 3),
        "completed_per_bucket": buckets,
        "baseline_per_s": round(baseline / max(killed - start, BUCKET_S)),
        "fewest_per_bucket_after_kill": min(after),
        "longest_gap_ms": round(longest_gap * 1000, 1),
        "max_latency_after_kill_ms": round(largest_latency * 1000, 1),
        "background_errors": load.errors,
        "background_timeouts": load.timeouts,
        "background_lost": load.lost,
    }


def _snapshot_files(cluster: LocalCluster) -> list[int]:
    """Per replica: the files in its snapshot directory."""
    return [
        len(list((cluster.config.replica_dir(r) / "snapshots").glob("*")))
        for r in range(REPLICAS)
    ]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _describe_serving(entry: dict[str, Any]) -> str:
    exits = [f"r{r['replica']} exited ({r['exited_with']})" for r in entry["replicas"]
             if r["exited_with"] is not None]
    if exits:
        return "did not serve: " + ", ".join(exits)
    if entry["cluster_serving_s"] is None:
        return f"did not serve within {entry['timeout_s']:g} s"
    return f"{entry['cluster_serving_s']} s"


# ---------------------------------------------------------------------------- command line


def _size(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of commands, got {text!r}")
    return value


def _max_batch(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_BATCH_LIMIT:
        raise argparse.ArgumentTypeError(f"expected 1..{MAX_BATCH_LIMIT}, got {text!r}")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--commands", type=_size, nargs="+", default=list(DEFAULT_SIZES), metavar="N",
        help="commands since the last snapshot, one fresh cluster per size "
        f"(default: {' '.join(str(s) for s in DEFAULT_SIZES)})",
    )  # fmt: skip
    parser.add_argument(
        "--signals", nargs="+", choices=tuple(SIGNALS), default=["kill", "term"],
        help="how every replica is stopped in the full restart (kill: SIGKILL, term: SIGTERM)",
    )  # fmt: skip
    parser.add_argument("--no-under-load", action="store_true",
                        help="skip the one-replica-restarted-under-load experiment")
    parser.add_argument("--timeout", type=_positive, default=120.0, metavar="S",
                        help="a restart not serving within this is reported as such")
    parser.add_argument("--clients", type=int, default=6, help="load connections")
    parser.add_argument("--outstanding", type=int, default=200, help="per load connection")
    parser.add_argument("--bg-clients", type=int, default=4,
                        help="connections of the constant load while one replica restarts")
    parser.add_argument("--bg-outstanding", type=int, default=8, help="per such connection")
    parser.add_argument(
        "--max-batch", type=_max_batch, default=None, metavar="K",
        help="[protocol] max_batch: most commands per C-instance (default: the config's); "
        "1 makes every command its own slot, for logs long in slots rather than commands",
    )  # fmt: skip
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    parser.add_argument(
        "--workdir", metavar="DIR",
        help="keep cluster files and replica logs here (default: a temporary directory)",
    )  # fmt: skip
    parser.add_argument("--no-fsync", action="store_true", help="replicas skip fsync (unsafe)")


async def _run_all(args: argparse.Namespace, session: BenchSession) -> dict[str, Any]:
    console = Console(stderr=True)
    experiment = _Experiment(args, session, console)
    full: list[dict[str, Any]] = []
    under: list[dict[str, Any]] = []
    for commands in args.commands:
        for how in args.signals:
            try:
                full.append(await experiment.full_restart(commands, how))
            except RuntimeError as exc:
                console.print(f"  failed: {exc}", markup=False, highlight=False)
                full.append({"commands": commands, "signal": how, "error": str(exc)[:2000]})
        if not args.no_under_load:
            try:
                under.append(await experiment.under_load(commands))
            except RuntimeError as exc:
                console.print(f"  failed: {exc}", markup=False, highlight=False)
                under.append({"commands": commands, "error": str(exc)[:2000]})
    return {
        "bench": "restart",
        "replicas": REPLICAS,
        "fsync": session.fsync,
        "timeout_s": args.timeout,
        "load": {"clients": args.clients, "outstanding": args.outstanding},
        "max_batch": args.max_batch,
        "background_load": {"clients": args.bg_clients, "outstanding": args.bg_outstanding},
        "machine": machine_info(),
        "full_restart": full,
        "under_load": under,
    }


def _print(report: dict[str, Any]) -> None:
    rows = []
    for entry in report["full_restart"]:
        if "error" in entry:
            rows.append([entry["commands"], entry["signal"], *["-"] * 6, entry["error"][:60]])
            continue
        per_replica = " / ".join(
            "-" if r["serving_s"] is None else f"{r['serving_s']:.2f}" for r in entry["replicas"]
        )
        listening = " / ".join(
            "-" if r["listening_s"] is None else f"{r['listening_s']:.2f}"
            for r in entry["replicas"]
        )
        rows.append([
            entry["commands"], entry["signal"], entry["load_rate_per_s"],
            entry["executed_slots"][0],
            f"{sum(entry['snapshot_files'])} / {sum(entry['snapshot_files_after_stop'])}",
            entry["shutdown_s"],
            listening, per_replica, _describe_serving(entry),
        ])  # fmt: skip
    print_table(
        "Full restart: every replica stopped, all started again (seconds from start)",
        ["commands", "signal", "load/s", "executed slot", "snapshot files load/stop",
         "shutdown s",
         "listening r0/r1/r2 s", "serving r0/r1/r2 s", "cluster serving"],
        rows,
    )  # fmt: skip
    if not report["under_load"]:
        return
    rows = []
    for entry in report["under_load"]:
        if "error" in entry:
            rows.append([entry["commands"], *["-"] * 8, entry["error"][:60]])
            continue
        serving = entry["restart_serving_s"]
        rows.append([
            entry["commands"], entry["load_rate_per_s"],
            f"{entry['restarted']} (seq {entry['sequencer']})", entry["baseline_per_s"],
            entry["fewest_per_bucket_after_kill"], entry["longest_gap_ms"],
            entry["max_latency_after_kill_ms"],
            entry["restart_listening_s"] if entry["restart_listening_s"] is not None else "-",
            serving if serving is not None
            else f"exited ({entry['restart_exited_with']})"
            if entry["restart_exited_with"] is not None
            else f"did not serve within {entry['timeout_s']:g} s",
            f"{entry['restarted_busy_longest_ms']} / {entry['restarted_stall_longest_ms']}",
        ])  # fmt: skip
    print_table(
        "One follower killed (SIGKILL) and restarted under load at the others",
        ["commands", "load/s", "restarted", "others ops/s before", "fewest ops/100 ms",
         "longest gap ms", "max latency ms", "listening s", "serving a read s",
         "restarted: busy / stall ms"],
        rows,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    with interrupts_to_exit_code("restart") as code:
        with contextlib.suppress(ImportError):
            import uvloop

            uvloop.install()
        with BenchSession("restart", args.workdir, fsync=not args.no_fsync) as session:
            report = run_interruptible(_run_all(args, session))
        _print(report)
        write_json(args.json, report)
        failed = any("error" in e for e in report["full_restart"] + report["under_load"])
        if failed:
            print("sdpaxos bench restart: some experiments failed (see above)", file=sys.stderr)
            code[0] = 1
    return code[0]
