"""``sdpaxos bench wan``: how closely the transport's emulated WAN delay matches its target.

Two transports on loopback with a configured one-way delay, the receiver in its own process
(as replicas are; ``--same-process`` puts both on one event loop). Every frame carries the
time of the sender's ``send`` call (``CLOCK_MONOTONIC``, one clock for every process on the
machine); the receiver's ``on_frame`` records ``arrival - sent - delay``, the error the
emulation adds on top of the target from the send call to delivery, timer lateness, loopback
transit and wake-ups included. The report gives its percentiles, and beside them the same
figures from the transport's own ``TransportStats.delay_samples`` (both transports'), which
should agree with the end-to-end ones if they measure what they claim to.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import struct
import time
from multiprocessing.connection import Connection
from typing import Any

from consensus.runtime.transport import PeerTransport

__all__ = ["add_arguments", "measure", "run"]

#: how long the receiver waits for the next frame before it gives up on the rest
_IDLE_TIMEOUT_S = 5.0


def _now_us() -> int:
    return time.monotonic_ns() // 1000


def _addresses(port: int) -> dict[int, tuple[str, int]]:
    return {0: ("127.0.0.1", port), 1: ("127.0.0.1", port + 1)}


async def _receive(port: int, delay_us: int, frames: int) -> tuple[list[int], list[int]]:
    """Run the receiving transport until ``frames`` frames arrived (or it went idle): the
    end-to-end errors in µs, and the errors from its own delay_samples."""
    errors_us: list[int] = []
    progress = asyncio.Event()

    def received(peer: int, payload: bytes) -> None:
        (sent,) = struct.unpack(">q", payload[:8])
        errors_us.append(_now_us() - sent - delay_us)
        progress.set()

    receiver = PeerTransport(
        cluster_id="wan", me=1, addresses=_addresses(port), one_way_us={0: delay_us},
        on_frame=received,
    )  # fmt: skip
    await receiver.start()
    try:
        while len(errors_us) < frames:
            progress.clear()
            try:
                async with asyncio.timeout(_IDLE_TIMEOUT_S):
                    await progress.wait()
            except TimeoutError:
                break
    finally:
        await receiver.close()
    return errors_us, _sample_errors(receiver)


def _sample_errors(transport: PeerTransport) -> list[int]:
    return [actual - intended for intended, actual in transport.stats.delay_samples]


def _receiver_process(port: int, delay_us: int, frames: int, results: Connection) -> None:
    _install_uvloop()
    try:
        results.send(asyncio.run(_receive(port, delay_us, frames)))
    finally:
        results.close()


async def measure(
    one_way_ms: float, frames: int, rate_hz: float, port: int, *, same_process: bool = False
) -> dict[str, Any]:
    delay_us = int(one_way_ms * 1000)
    process = None
    receiving: asyncio.Future[tuple[list[int], list[int]]]
    loop = asyncio.get_running_loop()
    if same_process:
        receiving = asyncio.ensure_future(_receive(port, delay_us, frames))
    else:
        ours, theirs = multiprocessing.get_context("spawn").Pipe(duplex=False)
        process = multiprocessing.get_context("spawn").Process(
            target=_receiver_process, args=(port, delay_us, frames, theirs), daemon=True
        )
        process.start()
        theirs.close()
        receiving = loop.run_in_executor(None, ours.recv)
    sender = PeerTransport(
        cluster_id="wan", me=0, addresses=_addresses(port), one_way_us={1: delay_us},
        on_frame=lambda peer, payload: None,
    )  # fmt: skip
    await sender.start()
    try:
        async with asyncio.timeout(30):  # frames sent from now on follow the handshake
            while not sender._links[1].connected:
                await asyncio.sleep(0.01)
        interval = 1.0 / rate_hz
        for _ in range(frames):
            sender.send(1, struct.pack(">q", _now_us()) + b"x" * 56)
            await asyncio.sleep(interval)
        async with asyncio.timeout(one_way_ms / 1000 + _IDLE_TIMEOUT_S + 30):
            errors_us, receiver_samples = await receiving
    finally:
        await sender.close()
        if process is not None:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
    if not errors_us:
        raise RuntimeError("no frame arrived")
    samples = sorted(receiver_samples + _sample_errors(sender))
    ordered = sorted(errors_us)
    result: dict[str, Any] = {
        "one_way_ms": one_way_ms,
        "processes": 1 if same_process else 2,
        "frames": len(ordered),
        "frames_sent": frames,
        "early_frames": sum(1 for error in ordered if error < 0),
        **_summary("added", ordered),
        "transport_samples": len(samples),
    }
    if samples:
        result.update(_summary("transport_added", samples))
    return result


def _summary(prefix: str, ordered: list[int]) -> dict[str, float]:
    return {
        f"{prefix}_p50_ms": ordered[len(ordered) // 2] / 1000,
        f"{prefix}_p99_ms": ordered[max(0, int(len(ordered) * 0.99) - 1)] / 1000,
        f"{prefix}_mean_ms": statistics.fmean(ordered) / 1000,
        f"{prefix}_max_ms": ordered[-1] / 1000,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--one-way-ms", type=float, default=10.0, help="10 ms = a 20 ms RTT")
    parser.add_argument("--frames", type=int, default=2000, help="frames to send")
    parser.add_argument("--rate", type=float, default=500.0, help="frames per second")
    parser.add_argument("--port", type=int, default=17900, help="the receiver's loopback port")
    parser.add_argument(
        "--same-process", action="store_true",
        help="sender and receiver on one event loop (no cross-process wake-up)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def _install_uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass


def run(args: argparse.Namespace) -> int:
    _install_uvloop()
    result = asyncio.run(
        measure(args.one_way_ms, args.frames, args.rate, args.port, same_process=args.same_process)
    )
    if args.json:
        print(json.dumps(result))
        return 0
    where = "one process" if args.same_process else "two processes"
    print(
        f"emulated one-way delay {result['one_way_ms']} ms, {where}, "
        f"{result['frames']}/{result['frames_sent']} frames arrived "
        f"({result['early_frames']} early): added by the emulation, send call to on_frame: "
        f"p50 {result['added_p50_ms']:.3f} ms, p99 {result['added_p99_ms']:.3f} ms, "
        f"mean {result['added_mean_ms']:.3f} ms, max {result['added_max_ms']:.3f} ms"
    )
    if result["transport_samples"]:
        print(
            f"the transport's own delay_samples ({result['transport_samples']}): "
            f"p50 {result['transport_added_p50_ms']:.3f} ms, "
            f"p99 {result['transport_added_p99_ms']:.3f} ms, "
            f"mean {result['transport_added_mean_ms']:.3f} ms"
        )
    return 0
