"""Shared machinery of the process benchmarks (throughput, latency, failover, reads).

* ``BenchSession`` owns everything a bench starts — replica clusters, load-generator
  processes, cgroups, its work directory — and stops and removes all of it on exit, also on
  Ctrl-C, SIGTERM or an error (SIGTERM and SIGHUP are turned into ``KeyboardInterrupt`` so the
  same ``finally`` runs; a second Ctrl-C during cleanup is ignored).
* ``LoadPlan`` / ``run_load`` drive one measurement with ``bench.loadgen`` processes and merge
  their HDR histograms, counts and timelines per site; the replicas' and clients' CPU use over
  the measured window comes from ``/proc``.
* ``BenchProgress`` (a rich progress bar on stderr), ``summary_ms``, ``print_table``,
  ``write_json`` and the common command-line options.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal, TypeVar

from hdrh.histogram import HdrHistogram
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from bench.cgroups import CpuLimiter
from bench.loadgen import STREAMS, new_histogram
from consensus.runtime.local_cluster import LocalCluster

__all__ = [
    "BenchProgress",
    "BenchSession",
    "LoadPlan",
    "LoadResult",
    "SiteLoad",
    "add_common_arguments",
    "print_table",
    "run_load",
    "summary_ms",
    "write_json",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: time the load generators get to start and connect before ``start_at``
SPAWN_S = 1.0


# ---------------------------------------------------------------------------- command line


QUICK_HELP = "short settings: the whole bench in under a minute"


def add_common_arguments(parser: argparse.ArgumentParser, quick: str = QUICK_HELP) -> None:
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    parser.add_argument("--plot", metavar="FILE.png", help="draw a figure (matplotlib) to FILE")
    parser.add_argument("--seed", type=int, default=1, help="seed of the request streams")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument(
        "--workdir", metavar="DIR",
        help="keep cluster files, replica logs and load specs here (default: a temporary "
        "directory, removed at the end)",
    )  # fmt: skip
    parser.add_argument("--no-fsync", action="store_true", help="replicas skip fsync (unsafe)")


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on (the machine may be shared: see the load average)."""
    return {"cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}


def parse_protocols(text: str) -> list[str]:
    from consensus.protocol.registry import PROTOCOLS

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PROTOCOLS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown protocols {unknown}; choose from {', '.join(sorted(PROTOCOLS))}"
        )
    return names


# ---------------------------------------------------------------------------- session


class BenchSession:
    """Everything one bench run started; ``with BenchSession(...) as session:``."""

    def __init__(self, name: str, workdir: str | None, *, fsync: bool = True,
                 emulate_fsync_ms: float = 0.0) -> None:
        self.keep = workdir is not None
        if workdir is not None:
            self.root = Path(workdir)
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            self.root = Path(tempfile.mkdtemp(prefix=f"sdpaxos-bench-{name}-"))
        self.fsync = fsync
        #: the replicas' emulated slower disk (``sdpaxos serve --emulate-fsync-ms``)
        self.emulate_fsync_ms = emulate_fsync_ms
        self.limiter = CpuLimiter.detect()
        self.clusters: list[LocalCluster] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self._counter = 0
        self._saved: dict[int, Any] = {}

    # ------------------------------------------------------------------ context
    def __enter__(self) -> BenchSession:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._saved[sig] = signal.signal(sig, _interrupt)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # finish the cleanup
        try:
            self.close()
        finally:
            signal.signal(signal.SIGINT, previous)
            for sig, handler in self._saved.items():
                signal.signal(sig, handler)

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(OSError):
                process.terminate()
        deadline = time.monotonic() + 3
        for process in self.processes:
            try:
                process.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()
        for cluster in self.clusters:
            cluster.stop_all()
        self.clusters.clear()
        self.limiter.close()
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def next_dir(self, label: str) -> Path:
        self._counter += 1
        return self.root / f"{self._counter:03d}-{label}"

    # ------------------------------------------------------------------ clusters
    def start_cluster(
        self,
        label: str,
        replicas: int,
        protocol: str,
        *,
        wan: bool = False,
        cpus: Sequence[float] = (),
        ready_timeout: float = 60.0,
        tls: bool = False,
    ) -> LocalCluster:
        """Start ``replicas`` processes running ``protocol``, wait until every one answers a
        read, then apply the CPU limits (``cpus[i]`` CPUs for replica i; 0: unlimited)."""
        extra = () if self.fsync else ("--no-fsync",)
        if self.emulate_fsync_ms:
            extra += ("--emulate-fsync-ms", str(self.emulate_fsync_ms))
        cluster = LocalCluster(
            self.next_dir(label), replicas, protocol=f'name = "{protocol}"', wan=wan,
            extra_args=extra, tls=tls,
        )  # fmt: skip
        self.clusters.append(cluster)
        with _interrupts_deferred():
            cluster.start_all()
        try:
            tls_files = cluster.config.tls
            asyncio.run(wait_ready(cluster.client_addresses, ready_timeout,
                                   tls_files.tool() if tls_files is not None else None))
        except Exception as exc:
            raise RuntimeError(f"cluster did not start: {exc}\n{cluster.logs()}") from None
        for replica, limit in enumerate(cpus):
            if limit > 0:
                self.limiter.limit(cluster.processes[replica].pid, limit, f"r{replica}")
        return cluster

    def start_replica(self, cluster: LocalCluster, replica: int) -> None:
        """(Re)start one replica of ``cluster``, e.g. after killing it."""
        with _interrupts_deferred():
            cluster.start(replica)

    def stop_cluster(self, cluster: LocalCluster) -> None:
        cluster.stop_all()
        if cluster in self.clusters:
            self.clusters.remove(cluster)
        self.limiter.close()
        shutil.rmtree(cluster.config.data_dir, ignore_errors=True)  # WALs: keep only logs

    # ------------------------------------------------------------------ load generators
    def spawn_loadgen(self, spec_path: Path) -> subprocess.Popen[bytes]:
        log = open(spec_path.with_suffix(".log"), "ab")  # noqa: SIM115
        with _interrupts_deferred():
            process = subprocess.Popen(
                [sys.executable, "-m", "bench.loadgen", str(spec_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            self.processes.append(process)
        log.close()
        return process

    def reap(self, process: subprocess.Popen[bytes], timeout: float) -> int:
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        if process in self.processes:
            self.processes.remove(process)
        return code


class _Deferral:
    """Inside ``_interrupts_deferred()``: the signal that arrived meanwhile, if any."""

    depth = 0
    pending: int | None = None


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if _Deferral.depth:
        _Deferral.pending = signum
        return
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold an interrupt until a started process is on record: raised between ``Popen``
    returning and the bookkeeping, it would leave that process running after teardown."""
    _Deferral.depth += 1
    try:
        yield
    finally:
        _Deferral.depth -= 1
        if not _Deferral.depth and _Deferral.pending is not None:
            signum, _Deferral.pending = _Deferral.pending, None
            raise KeyboardInterrupt(f"signal {signum}")


_T = TypeVar("_T")
_INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_interruptible(coro: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run(coro)`` for a bench that drives load from this process: an interrupt
    cancels the coroutine (its tasks end quietly instead of dying mid-step with tracebacks)
    and then comes out as ``KeyboardInterrupt``, for the session's cleanup."""
    interrupted: list[int] = []

    async def main() -> _T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        saved = {sig: signal.getsignal(sig) for sig in _INTERRUPTS}

        def on_signal(signum: int) -> None:
            interrupted.append(signum)
            task.cancel()

        for sig in _INTERRUPTS:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await coro
        finally:
            for sig in _INTERRUPTS:
                loop.remove_signal_handler(sig)
                signal.signal(sig, saved[sig])

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt(f"signal {interrupted[0]}") from None
        raise


#: ``bench throughput|latency --tls``: the label of a protocol's runs over mutual TLS
TLS_SUFFIX = "+tls"


async def wait_ready(
    addresses: Sequence[tuple[str, int]], timeout: float, tls: ssl.SSLContext | None = None
) -> None:
    """Until every replica answers a linearizable read (``tls``: a TLS cluster's context)."""
    from consensus.errors import SDPaxosError
    from consensus.runtime.client import Client
    from consensus.statemachine import kv_get

    deadline = time.monotonic() + timeout
    for home in range(len(addresses)):
        while True:
            client = Client(1 << 40, addresses, home=home, timeout_s=2.0, attempts=1, tls=tls)
            try:
                await client.read(kv_get("probe"), ["probe"])
                break
            except SDPaxosError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
            finally:
                await client.close()


def scrape_metrics(cluster: LocalCluster, replica: int) -> dict[str, float]:
    """The replica's Prometheus gauges and counters (no histograms); {} if it does not answer."""
    address = cluster.config.replica(replica).metrics_address
    if address is None:
        return {}
    try:
        with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=2) as r:
            body = r.read().decode()
    except OSError:
        return {}
    values = {}
    for line in body.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[name] = float(value)
    return values


def sequencer_of(cluster: LocalCluster) -> int | None:
    """The replica that says it is the SDPaxos sequencer now (None if none does)."""
    for spec in cluster.config.replicas:
        if spec.id in cluster.processes and scrape_metrics(cluster, spec.id).get(
            "sdpaxos_is_sequencer"
        ):
            return spec.id
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` (all threads), None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# ---------------------------------------------------------------------------- progress


class BenchProgress:
    """One rich progress bar over the bench's steps (on stderr: stdout keeps the results)."""

    def __init__(self, title: str, steps: int) -> None:
        self.console = Console(stderr=True)
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
            TaskProgressColumn(), TimeElapsedColumn(), console=self.console,
        )  # fmt: skip
        self.steps = max(1, steps)
        self.task = self.progress.add_task(title, total=self.steps * 100)
        self.title = title
        self.step = 0

    def __enter__(self) -> BenchProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def begin(self, label: str) -> None:
        self.progress.update(
            self.task, description=f"{self.title}: {label}", completed=self.step * 100
        )

    def fraction(self, value: float) -> None:
        value = min(1.0, max(0.0, value))
        self.progress.update(self.task, completed=self.step * 100 + int(value * 99))

    def end(self) -> None:
        self.step += 1
        self.progress.update(self.task, completed=self.step * 100)

    def note(self, text: str) -> None:
        self.console.print(text)


# ---------------------------------------------------------------------------- load


@dataclass(frozen=True, slots=True)
class SiteLoad:
    """Load aimed at one replica: ``connections`` client connections with ``outstanding``
    requests each (closed loop) or ``rate`` requests/s in all (open loop)."""

    site: str
    replica: int
    connections: int
    outstanding: int = 1
    rate: float = 0.0
    #: which load-generator process drives it
    process: int = 0


@dataclass(frozen=True, slots=True)
class LoadPlan:
    mode: Literal["closed", "open"]
    sites: tuple[SiteLoad, ...]
    warmup: float
    duration: float
    drain: float = 5.0
    size: int = 16
    reads: float = 0.0
    keys: int = 100_000
    dist: str = "uniform"
    theta: float = 0.99
    executed_share: float = 0.0
    bin_s: float = 0.1
    request_timeout: float = 10.0
    seed: int = 1


@dataclass(slots=True)
class SiteResult:
    site: str
    histograms: dict[str, HdrHistogram]
    completed: dict[str, int]
    sent: int = 0
    errors: int = 0
    timeouts: int = 0
    lost: int = 0
    timeline: list[int] = field(default_factory=list)
    gaps: list[tuple[float, float]] = field(default_factory=list)
    max_send_lag_ms: float = 0.0
    #: what the first error answer said, to tell errors apart ("" if there was none)
    first_error: str = ""

    def summary(self, stream: str) -> dict[str, float | int | None]:
        return summary_ms(self.histograms[stream])


@dataclass(slots=True)
class LoadResult:
    sites: list[SiteResult]
    window_s: float
    bin_s: float
    #: process name -> CPUs used over the measured window (replica-<i>, loadgen-<k>)
    cpu: dict[str, float]
    #: when the measured window started, on the shared monotonic clock
    measure_from: float

    def site(self, name: str) -> SiteResult:
        return next(s for s in self.sites if s.site == name)

    def histogram(self, *streams: str) -> HdrHistogram:
        merged = new_histogram()
        for site in self.sites:
            for stream in streams or STREAMS:
                merged.add(site.histograms[stream])
        return merged

    def completed(self, *streams: str) -> int:
        return sum(s.completed[x] for s in self.sites for x in (streams or STREAMS))

    def throughput(self, *streams: str) -> float:
        return self.completed(*streams) / self.window_s

    def problems(self) -> dict[str, int]:
        return {
            "errors": sum(s.errors for s in self.sites),
            "timeouts": sum(s.timeouts for s in self.sites),
            "lost": sum(s.lost for s in self.sites),
        }

    def first_error(self) -> str:
        """The first error answer of the first site that got one, with the site's name."""
        return next((f"{s.site}: {s.first_error}" for s in self.sites if s.first_error), "")


def run_load(
    session: BenchSession,
    cluster: LocalCluster,
    plan: LoadPlan,
    progress: BenchProgress | None = None,
    *,
    events: Sequence[tuple[float, Callable[[], None]]] = (),
) -> LoadResult:
    """Run ``plan`` against ``cluster``; ``events`` are (seconds after the measured window
    opens, action) pairs run from this process (e.g. kill the sequencer)."""
    directory = cluster.directory
    addresses = cluster.client_addresses
    start_at = time.monotonic() + SPAWN_S
    measure_from = start_at + plan.warmup
    stop_at = measure_from + plan.duration
    processes = sorted({s.process for s in plan.sites})
    spawned: list[tuple[int, subprocess.Popen[bytes], Path]] = []
    client_base = 10_000
    for index in processes:
        loads = [s for s in plan.sites if s.process == index]
        out_path = directory / f"load-{index}.out.json"
        spec = {
            "out": str(out_path),
            "mode": plan.mode, "start_at": start_at, "warmup": plan.warmup,
            "duration": plan.duration, "drain": plan.drain, "size": plan.size,
            "reads": plan.reads, "keys": plan.keys, "dist": plan.dist, "theta": plan.theta,
            "executed_share": plan.executed_share, "bin_s": plan.bin_s,
            "request_timeout": plan.request_timeout, "seed": plan.seed * 1000 + index,
            "client_id_base": client_base,
            # a TLS cluster: the load generators present its admin certificate
            "tls": None if cluster.config.tls is None or cluster.config.tls.client is None else {
                "ca": str(cluster.config.tls.ca), "cert": str(cluster.config.tls.client.cert),
                "key": str(cluster.config.tls.client.key),
            },
            "sites": [
                {"site": s.site, "address": list(addresses[s.replica]),
                 "connections": s.connections, "outstanding": s.outstanding, "rate": s.rate}
                for s in loads
            ],
        }  # fmt: skip
        client_base += sum(s.connections for s in loads) + 1
        path = directory / f"load-{index}.json"
        path.write_text(json.dumps(spec, indent=1))
        spawned.append((index, session.spawn_loadgen(path), out_path))
    pending = sorted(events, key=lambda e: e[0])
    began = time.monotonic()

    def wait_until(moment: float) -> None:
        while True:
            now = time.monotonic()
            while pending and measure_from + pending[0][0] <= now:
                pending.pop(0)[1]()
            if now >= moment:
                return
            if progress is not None:
                progress.fraction((now - began) / (stop_at - began + 0.5))
            next_event = measure_from + pending[0][0] if pending else moment
            time.sleep(max(0.0, min(0.05, moment - now, next_event - now)))

    wait_until(measure_from)
    pids = {f"replica-{i}": p.pid for i, p in cluster.processes.items()}
    pids.update({f"loadgen-{i}": p.pid for i, p, _ in spawned})
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    wait_until(stop_at)
    while pending:  # events scheduled after the window
        wait_until(measure_from + pending[0][0])
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    cpu = {}
    for name in pids:
        start, end = before[name], after[name]
        if start is not None and end is not None:
            cpu[name] = round((end - start) / plan.duration, 3)
    merged: dict[str, SiteResult] = {}
    for index, process, out in spawned:
        code = session.reap(process, plan.drain + 20)
        if code != 0 or not out.exists():
            log = out.with_name(f"load-{index}.log")
            text = log.read_text()[-3000:] if log.exists() else ""
            raise RuntimeError(f"load generator {index} failed (exit {code}):\n{text}")
        _merge(merged, json.loads(out.read_text()))
    if progress is not None:
        progress.fraction(1.0)
    order = [s.site for s in plan.sites]
    sites = sorted(merged.values(), key=lambda s: order.index(s.site))
    return LoadResult(sites, plan.duration, plan.bin_s, cpu, measure_from)


def _merge(merged: dict[str, SiteResult], output: dict[str, Any]) -> None:
    for raw in output["sites"]:
        histograms = {
            name: HdrHistogram.decode(base64.b64decode(text))
            for name, text in raw["histograms"].items()
        }
        gaps = [(float(a), float(b)) for a, b in raw["gaps"]]
        site = merged.get(raw["site"])
        if site is None:
            merged[raw["site"]] = SiteResult(
                raw["site"], {n: _copy(h) for n, h in histograms.items()}, dict(raw["completed"]),
                raw["sent"], raw["errors"], raw["timeouts"], raw["lost"], list(raw["timeline"]),
                gaps, raw["max_send_lag_ms"], raw["first_error"],
            )  # fmt: skip
            continue
        for name, histogram in histograms.items():
            site.histograms[name].add(histogram)
        for name, count in raw["completed"].items():
            site.completed[name] += count
        site.sent += raw["sent"]
        site.errors += raw["errors"]
        site.timeouts += raw["timeouts"]
        site.lost += raw["lost"]
        site.timeline = [a + b for a, b in zip(site.timeline, raw["timeline"], strict=False)]
        # the site stalled only while every one of its generators did
        site.gaps = _intersect(site.gaps, gaps)
        site.max_send_lag_ms = max(site.max_send_lag_ms, raw["max_send_lag_ms"])
        site.first_error = site.first_error or raw["first_error"]


def _copy(histogram: HdrHistogram) -> HdrHistogram:
    fresh = new_histogram()
    fresh.add(histogram)
    return fresh


def _intersect(
    a: list[tuple[float, float]], b: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Intersection of two lists of (start, length) intervals."""
    out = []
    for start_a, length_a in a:
        for start_b, length_b in b:
            start = max(start_a, start_b)
            end = min(start_a + length_a, start_b + length_b)
            if end > start:
                out.append((start, end - start))
    return sorted(out)


def spread(
    replicas: Sequence[int],
    sites: Sequence[str],
    connections: int,
    outstanding: int,
    processes: int,
) -> tuple[SiteLoad, ...]:
    """``connections`` closed-loop connections spread round-robin over ``replicas`` and the
    load-generator processes."""
    counts: dict[tuple[int, int], int] = {}
    for j in range(connections):
        key = (replicas[j % len(replicas)], j % processes)
        counts[key] = counts.get(key, 0) + 1
    return tuple(
        SiteLoad(sites[replica], replica, count, outstanding, process=process)
        for (replica, process), count in sorted(counts.items())
    )


# ---------------------------------------------------------------------------- reporting


def summary_ms(histogram: HdrHistogram) -> dict[str, float | int | None]:
    count = histogram.get_total_count()
    if count == 0:
        return {
            "count": 0,
            "p50_ms": None,
            "mean_ms": None,
            "p95_ms": None,
            "p99_ms": None,
            "max_ms": None,
        }
    return {
        "count": count,
        "p50_ms": round(histogram.get_value_at_percentile(50) / 1000, 3),
        "mean_ms": round(histogram.get_mean_value() / 1000, 3),
        "p95_ms": round(histogram.get_value_at_percentile(95) / 1000, 3),
        "p99_ms": round(histogram.get_value_at_percentile(99) / 1000, 3),
        "max_ms": round(histogram.get_max_value() / 1000, 3),
    }


def fmt(value: object, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    table = Table(title=title, title_justify="left")
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    for row in rows:
        table.add_row(*(fmt(cell) for cell in row))
    # piped or redirected: rich would wrap at 80 columns; let the table take what it needs
    console = Console() if sys.stdout.isatty() else Console(width=250)
    console.print(table)


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


@contextlib.contextmanager
def interrupts_to_exit_code(name: str) -> Iterator[list[int]]:
    """Turn Ctrl-C into a message and exit code 130 (after the session's cleanup ran)."""
    code = [0]
    try:
        yield code
    except KeyboardInterrupt:
        print(
            f"sdpaxos bench {name}: interrupted; every process it started was stopped",
            file=sys.stderr,
        )
        code[0] = 130
