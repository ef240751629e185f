"""The WAN emulation's clock: sleepers wake in deadline order, never early; cancelled sleepers
leave the rest alone; the transport delivers delayed frames in order, never before their delay."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.precise_timer import PreciseTimer
from consensus.runtime.transport import PeerTransport


def _now_us() -> int:
    return time.monotonic_ns() // 1000


async def test_sleepers_wake_in_deadline_order_and_never_early() -> None:
    timer = PreciseTimer()
    if sys.platform.startswith("linux"):
        assert timer.precise
    woke: list[tuple[int, int]] = []  # (deadline, woke at)

    async def sleeper(deadline: int) -> None:
        await timer.sleep_until(deadline)
        woke.append((deadline, _now_us()))

    start = _now_us()
    deadlines = [start + offset for offset in (9000, 1500, 4000, 4000, 300, 12000)]
    try:
        await asyncio.gather(*(sleeper(d) for d in deadlines))
    finally:
        timer.close()
    assert [d for d, _ in woke] == sorted(deadlines)
    assert all(at >= deadline for deadline, at in woke)


async def test_a_cancelled_sleeper_does_not_hold_up_the_others() -> None:
    timer = PreciseTimer()
    start = _now_us()
    try:
        first = asyncio.ensure_future(timer.sleep_until(start + 2000))
        later = asyncio.ensure_future(timer.sleep_until(start + 6000))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.wait_for(later, 5)
        assert _now_us() >= start + 6000
        # a deadline already past returns at once
        await asyncio.wait_for(timer.sleep_until(start), 5)
    finally:
        timer.close()
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_delayed_frames_arrive_in_order_and_not_before_their_delay() -> None:
    base = free_base_port()
    addresses = {0: ("127.0.0.1", base), 1: ("127.0.0.1", base + 1)}
    arrivals: list[tuple[bytes, int]] = []
    delay_us = 15_000
    sender = PeerTransport(
        cluster_id="t", me=0, addresses=addresses, one_way_us={1: delay_us},
        on_frame=lambda peer, payload: None,
    )  # fmt: skip
    receiver = PeerTransport(
        cluster_id="t", me=1, addresses=addresses, one_way_us={0: delay_us},
        on_frame=lambda peer, payload: arrivals.append((payload, _now_us())),
    )  # fmt: skip
    await receiver.start()
    await sender.start()
    try:
        async with asyncio.timeout(10):
            while not sender._links[1].connected:
                await asyncio.sleep(0.01)
            sent_at = {}
            for n in range(20):
                payload = n.to_bytes(2, "big")
                sent_at[payload] = _now_us()
                sender.send(1, payload)
                await asyncio.sleep(0.0007 * (n % 3))
            while len(arrivals) < 20:
                await asyncio.sleep(0.01)
    finally:
        await sender.close()
        await receiver.close()
    assert [int.from_bytes(p, "big") for p, _ in arrivals] == list(range(20))
    assert all(at - sent_at[p] >= delay_us for p, at in arrivals)
