"""``sdpaxos bench wan``: how closely the transport's emulated WAN delay matches its target.

Two transports on loopback with a configured one-way delay; every frame carries its send
time, the receiver records ``arrival - sent - delay`` (the error the emulation adds on top of
the target), and the report gives its percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import time

from consensus.runtime.transport import PeerTransport

__all__ = ["add_arguments", "measure", "run"]


async def measure(one_way_ms: float, frames: int, rate_hz: float, port: int) -> dict[str, float]:
    delay_us = int(one_way_ms * 1000)
    addresses = {0: ("127.0.0.1", port), 1: ("127.0.0.1", port + 1)}
    errors_us: list[int] = []

    def received(peer: int, payload: bytes) -> None:
        (sent,) = struct.unpack(">q", payload[:8])
        errors_us.append(time.monotonic_ns() // 1000 - sent - delay_us)

    sender = PeerTransport(
        cluster_id="wan", me=0, addresses=addresses, one_way_us={1: delay_us},
        on_frame=lambda peer, payload: None,
    )
    receiver = PeerTransport(
        cluster_id="wan", me=1, addresses=addresses, one_way_us={0: delay_us},
        on_frame=received,
    )
    await receiver.start()
    await sender.start()
    try:
        while not sender._links[1].connected:
            await asyncio.sleep(0.01)
        interval = 1.0 / rate_hz
        for _ in range(frames):
            sender.send(1, struct.pack(">q", time.monotonic_ns() // 1000) + b"x" * 56)
            await asyncio.sleep(interval)
        await asyncio.sleep(one_way_ms / 1000 + 0.2)
    finally:
        await sender.close()
        await receiver.close()
    ordered = sorted(errors_us)
    return {
        "one_way_ms": one_way_ms,
        "frames": len(ordered),
        "added_p50_ms": ordered[len(ordered) // 2] / 1000,
        "added_p99_ms": ordered[int(len(ordered) * 0.99) - 1] / 1000,
        "added_mean_ms": statistics.fmean(ordered) / 1000,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--one-way-ms", type=float, default=10.0, help="10 ms = a 20 ms RTT")
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=500.0, help="frames per second")
    parser.add_argument("--port", type=int, default=17900)
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(measure(args.one_way_ms, args.frames, args.rate, args.port))
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"emulated one-way delay {result['one_way_ms']} ms over {result['frames']} frames: "
            f"added p50 {result['added_p50_ms']:.3f} ms, p99 {result['added_p99_ms']:.3f} ms, "
            f"mean {result['added_mean_ms']:.3f} ms"
        )
    return 0
