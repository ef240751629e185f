"""A load-generator process for the process benchmarks: ``python -m bench.loadgen SPEC.json``.

The spec (written by ``bench.harness``) names the sites to load, each with its replica's client
address and a number of connections (one client id each), and the mode:

* ``closed``: every connection keeps ``outstanding`` requests in flight, sending the next one
  as each answer arrives (peak throughput);
* ``open``: each site sends Poisson arrivals at ``rate`` requests/s over its connections,
  whatever the answers (latency without coordinated omission).

Requests are linearizable reads (kind ``read``) with probability ``reads``, else writes of
``size`` bytes: blind ones acknowledged when *ready*, or with probability ``executed_share``
non-blind ones answered after *execution*. Keys are uniform or Zipf over ``keys`` items.

Everything waits for the shared ``start_at`` (``time.monotonic()``, one clock for all processes
on the machine); requests sent in ``[start_at + warmup, + duration)`` are measured. Output
(JSON at ``out``), per site: an HDR histogram of latencies (µs) per stream (``ready``,
``executed``, ``read``), completions in the window per stream, errors, a timeline of
completions per ``bin_s``, and gaps between consecutive completions longer than
``gap_s``. The process exits when everything sent is answered or ``drain`` seconds pass.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import sys
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from hdrh.histogram import HdrHistogram

from bench.workload import PoissonArrivals, key_name, make_get, make_put, parse_key_dist, sample
from consensus.codec import FrameReader, frame_to_wire
from consensus.errors import DecodeError
from consensus.messages import Command
from consensus.runtime.client_protocol import ClientRequest, Kind, decode_response
from consensus.runtime.tls import TlsFiles, client_context

__all__ = ["STREAMS", "main", "new_histogram"]

#: ready: blind writes (acknowledged when ready); executed: writes answered after execution;
#: read: linearizable reads through the sequencer (or the log, for the baselines)
STREAMS = ("ready", "executed", "read")
_READY, _EXECUTED, _READ = range(3)
#: distinct requests each connection cycles through
POOL = 4096
#: a gap between completions at least this long is reported (failover stalls)
GAP_S = 0.05


def new_histogram() -> HdrHistogram:
    """Latencies in µs from 1 µs to 10 min, 3 significant digits."""
    return HdrHistogram(1, 600_000_000, 3)


@dataclass(slots=True)
class Site:
    name: str
    address: tuple[str, int]
    connections: int
    outstanding: int
    rate: float
    latencies: list[array[int]] = field(default_factory=lambda: [array("q") for _ in STREAMS])
    completed: list[int] = field(default_factory=lambda: [0] * len(STREAMS))
    errors: int = 0
    #: what the first error answer said (``status: payload``), to tell errors apart
    first_error: str = ""
    timeouts: int = 0
    lost: int = 0
    sent: int = 0
    timeline: list[int] = field(default_factory=list)
    gaps: list[tuple[float, float]] = field(default_factory=list)
    last_done: float = 0.0
    max_lag_s: float = 0.0


class Generator:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.mode: str = spec["mode"]
        self.start_at: float = spec["start_at"]
        self.measure_from = self.start_at + spec["warmup"]
        self.stop_at = self.measure_from + spec["duration"]
        self.drain: float = spec["drain"]
        self.bin_s: float = spec.get("bin_s", 0.1)
        self.timeout_s: float = spec.get("request_timeout", 10.0)
        self.rng = random.Random(spec["seed"])
        #: a TLS cluster's context (its admin certificate): every connection speaks TLS
        tls = spec.get("tls")
        self.tls = None if not tls else client_context(
            Path(tls["ca"]), TlsFiles(Path(tls["cert"]), Path(tls["key"]))
        )
        chooser = parse_key_dist(spec["dist"], spec["keys"], self.rng, spec.get("theta", 0.99))
        keys = [key_name(i) for i in sample(chooser, POOL)]
        size: int = spec["size"]
        reads: float = spec["reads"]
        executed: float = spec.get("executed_share", 0.0)
        # the request pool: (stream, kind, op, key, blind), in a seeded random order
        self.pool: list[tuple[int, Kind, bytes, str, bool]] = []
        for key in keys:
            draw = self.rng.random()
            if draw < reads:
                self.pool.append((_READ, "read", make_get(key), key, False))
            elif self.rng.random() < executed:
                self.pool.append((_EXECUTED, "cmd", make_put(key, size), key, False))
            else:
                self.pool.append((_READY, "cmd", make_put(key, size), key, True))
        bins = int((self.stop_at - self.start_at + self.drain) / self.bin_s) + 2
        self.sites: list[Site] = []
        self.connections: list[Connection] = []
        client_id = spec["client_id_base"]
        for raw in spec["sites"]:
            site = Site(
                raw["site"],
                (raw["address"][0], raw["address"][1]),
                raw["connections"],
                raw.get("outstanding", 1),
                raw.get("rate", 0.0),
                timeline=[0] * bins,
            )
            self.sites.append(site)
            for _ in range(site.connections):
                offset = self.rng.randrange(POOL)
                self.connections.append(Connection(self, site, client_id, offset))
                client_id += 1
        self.sending = True

    # ------------------------------------------------------------------ bookkeeping
    def done(self, site: Site, stream: int, sent: float, error: str | None, now: float) -> None:
        if error is not None:
            site.errors += 1
            site.first_error = site.first_error or error
            return
        index = int((now - self.start_at) / self.bin_s)
        if 0 <= index < len(site.timeline):
            site.timeline[index] += 1
        if site.last_done and now - site.last_done >= GAP_S:
            site.gaps.append((site.last_done - self.start_at, now - site.last_done))
        site.last_done = now
        if self.measure_from <= sent < self.stop_at:
            site.completed[stream] += 1
            site.latencies[stream].append(int((now - sent) * 1e6))

    def pending(self) -> int:
        return sum(len(c.waiting) for c in self.connections)

    # ------------------------------------------------------------------ the run
    async def run(self) -> None:
        for connection in self.connections:
            await connection.connect()
        await asyncio.sleep(max(0.0, self.start_at - time.monotonic()))
        for site in self.sites:
            site.last_done = time.monotonic()
        sweeper = asyncio.create_task(self._sweep())
        if self.mode == "closed":
            for connection in self.connections:
                connection.fill(time.monotonic())
            await asyncio.sleep(max(0.0, self.stop_at - time.monotonic()))
        else:
            await self._open_loop()
        self.sending = False
        give_up = time.monotonic() + self.drain
        while self.pending() and time.monotonic() < give_up:
            await asyncio.sleep(0.01)
        sweeper.cancel()
        for connection in self.connections:
            connection.close()
        await asyncio.sleep(0)

    async def _open_loop(self) -> None:
        arrivals = []
        for site in self.sites:
            per_site = [c for c in self.connections if c.site is site]
            if site.rate > 0 and per_site:
                arrivals.append(
                    (site, per_site, PoissonArrivals(site.rate, self.rng, self.start_at))
                )
        turn = 0
        while True:
            now = time.monotonic()
            if now >= self.stop_at:
                return
            for site, per_site, process in arrivals:
                while process.peek() <= now:
                    due = process.pop()
                    site.max_lag_s = max(site.max_lag_s, now - due)
                    turn += 1
                    per_site[turn % len(per_site)].issue(now)
            for connection in self.connections:
                connection.flush()
            # sleep until the next arrival (a fixed short tick would cost this process more
            # CPU than the replicas it measures at low rates)
            due = min((process.peek() for _, _, process in arrivals), default=self.stop_at)
            await asyncio.sleep(max(0.0, min(due, self.stop_at) - time.monotonic()))

    async def _sweep(self) -> None:
        """Give up on requests unanswered for ``request_timeout`` (their connection may have
        lost them in a failover) and reconnect lost connections."""
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for connection in self.connections:
                connection.expire(now)
                if connection.transport is None and self.sending and not connection.connecting:
                    asyncio.get_running_loop().create_task(connection.connect(retry=False))

    # ------------------------------------------------------------------ output
    def result(self) -> dict[str, Any]:
        sites = []
        for site in self.sites:
            histograms = {}
            for stream, name in enumerate(STREAMS):
                histogram = new_histogram()
                for value in site.latencies[stream]:
                    histogram.record_value(max(1, value))
                histograms[name] = base64.b64encode(histogram.encode()).decode()
            sites.append({
                "site": site.name,
                "histograms": histograms,
                "completed": dict(zip(STREAMS, site.completed, strict=True)),
                "sent": site.sent,
                "errors": site.errors,
                "first_error": site.first_error,
                "timeouts": site.timeouts,
                "lost": site.lost,
                "timeline": site.timeline,
                "gaps": site.gaps,
                "max_send_lag_ms": round(site.max_lag_s * 1000, 3),
            })  # fmt: skip
        return {"sites": sites, "bin_s": self.bin_s, "window_s": self.spec["duration"]}


class Connection(asyncio.Protocol):
    """One pipelined client connection (one client id); answers matched by sequence number."""

    def __init__(self, gen: Generator, site: Site, client_id: int, offset: int) -> None:
        self.gen = gen
        self.site = site
        self.client_id = client_id
        self.next_request = offset
        self.seq = 0
        self.waiting: dict[int, tuple[float, int]] = {}
        self.frames = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        self.connecting = False

    async def connect(self, retry: bool = True) -> None:
        loop = asyncio.get_running_loop()
        self.connecting = True
        try:
            while self.transport is None:
                try:
                    tls = self.gen.tls
                    await loop.create_connection(
                        lambda: self, *self.site.address, ssl=tls,
                        server_hostname=self.site.address[0] if tls is not None else None,
                    )
                except OSError:
                    if not retry or time.monotonic() > self.gen.stop_at:
                        return
                    await asyncio.sleep(0.1)
        finally:
            self.connecting = False
        if self.gen.mode == "closed" and self.gen.sending and time.monotonic() >= self.gen.start_at:
            self.fill(time.monotonic())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.frames = FrameReader()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.site.lost += len(self.waiting)
        self.waiting.clear()

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        gen = self.gen
        try:
            payloads = self.frames.feed(data)
        except DecodeError:
            if self.transport is not None:
                self.transport.close()
            return
        refill = 0
        for payload in payloads:
            try:
                response = decode_response(payload)
            except DecodeError:
                continue
            entry = self.waiting.pop(response.req_id, None)
            if entry is None:
                continue
            error = None if response.status == "ok" else f"{response.status}: {response.payload!r}"
            gen.done(self.site, entry[1], entry[0], error, now)
            refill += 1
        if gen.mode == "closed" and gen.sending and now < gen.stop_at:
            for _ in range(refill):
                self.issue(now)
        self.flush()

    def fill(self, now: float) -> None:
        while len(self.waiting) < self.site.outstanding and self.transport is not None:
            self.issue(now)
        self.flush()

    def issue(self, now: float) -> None:
        if self.transport is None:
            return
        gen = self.gen
        stream, kind, op, key, blind = gen.pool[self.next_request % POOL]
        self.next_request += 1
        self.seq += 1
        seq = self.seq
        command = Command(client_id=self.client_id, seq=seq, op=op, keys=(key,), blind=blind)
        self.out.append(frame_to_wire(ClientRequest(seq, kind, command).encode()))
        self.waiting[seq] = (now, stream)
        self.site.sent += 1

    def flush(self) -> None:
        if self.out and self.transport is not None:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def expire(self, now: float) -> None:
        deadline = now - self.gen.timeout_s
        stale = [seq for seq, (sent, _) in self.waiting.items() if sent < deadline]
        for seq in stale:
            del self.waiting[seq]
        self.site.timeouts += len(stale)
        if stale and self.gen.mode == "closed" and self.gen.sending and now < self.gen.stop_at:
            self.fill(now)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.loadgen SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    generator = Generator(spec)
    try:
        asyncio.run(generator.run())
    except KeyboardInterrupt:
        return 130
    out = Path(spec["out"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(generator.result()))
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
