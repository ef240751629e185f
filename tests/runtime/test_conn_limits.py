"""Connection hygiene (``consensus.runtime.conn_limits``): the policy object on a fake clock,
then the client and peer ports of a live in-process cluster with short timeouts and small caps:
slow-loris and idle connections are closed, connections over a cap are refused while the others
keep working, a partial frame over the buffer budget closes its connection, the metrics show
each, and the replica serves a normal client afterwards."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from consensus.codec import FORMAT_VERSION, FrameReader, frame_to_wire
from consensus.errors import ConfigError
from consensus.messages import Command
from consensus.runtime.client import Client, cut_off
from consensus.runtime.client_protocol import (
    NO_REQUEST,
    ClientRequest,
    ClientResponse,
    decode_response,
)
from consensus.runtime.cluster_config import parse_cluster_config
from consensus.runtime.conn_limits import (
    LARGEST_REQUEST_BYTES,
    ClientPortLimits,
    LimitsConfig,
    PortGuard,
    peer_connection_cap,
)
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.logs import LOG_INTERVAL_S
from consensus.runtime.metrics import render
from consensus.runtime.node import ReplicaNode
from consensus.runtime.transport import Handshake
from consensus.statemachine import KVStore, kv_get, kv_put

from .polling import wait_until

MIB = 1 << 20


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _limits(clock: FakeClock, **settings: Any) -> ClientPortLimits:
    config = LimitsConfig(
        client_idle_timeout_s=10.0, client_frame_timeout_s=2.0, **settings
    )
    return ClientPortLimits(config, clock=clock)


class Closer:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


# ---------------------------------------------------------------------- the policy alone
def test_the_cap_refuses_beyond_it_and_logs_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    guard = PortGuard("client", 2, clock=clock)
    assert guard.admit() and guard.admit()
    with caplog.at_level(logging.WARNING, logger="sdpaxos.conn_limits"):
        for _ in range(50):
            assert not guard.admit()
        clock.now += LOG_INTERVAL_S
        assert not guard.admit()
    assert (guard.stats.open, guard.stats.refused) == (2, 51)
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refusals == [
        "client port: refused a connection over its cap of 2",
        "client port: refused a connection over its cap of 2 (and 49 more like it since the "
        "last report)",
    ]
    guard.release()
    assert guard.admit()  # a slot freed is a slot taken
    assert guard.stats.open == 2


def test_an_idle_connection_is_closed_after_the_idle_timeout() -> None:
    clock = FakeClock()
    limits = _limits(clock)
    close = Closer()
    tracked = limits.open(close)
    assert tracked is not None
    clock.now += 9.9
    assert limits.sweep(clock.now) == [] and close.calls == 0
    clock.now += 0.1
    assert limits.sweep(clock.now) == [(tracked, "idle")]
    assert close.calls == 1
    assert (limits.stats.closed_idle, limits.stats.open) == (1, 0)
    limits.closed(tracked)  # the server task's own close afterwards changes nothing
    assert limits.stats.open == 0
    assert limits.sweep(clock.now + 100) == []


def test_a_connection_waiting_for_an_answer_is_not_idle() -> None:
    clock = FakeClock()
    limits = _limits(clock)
    tracked = limits.open(Closer())
    assert tracked is not None
    assert limits.received(tracked, 0, 1)
    limits.request_started(tracked)
    clock.now += 100
    assert limits.sweep(clock.now) == []  # its answer is still on its way
    limits.request_done(tracked)  # the idle time counts from the answer
    clock.now += 9.9
    assert limits.sweep(clock.now) == []
    clock.now += 0.1
    assert limits.sweep(clock.now) == [(tracked, "idle")]


def test_a_frame_not_completed_in_time_is_slow_even_while_bytes_trickle_in() -> None:
    clock = FakeClock()
    limits = _limits(clock)
    close = Closer()
    tracked = limits.open(close)
    assert tracked is not None
    for buffered in range(1, 20):  # a byte every 0.1 s: progress does not extend the deadline
        assert limits.received(tracked, buffered, 0)
        clock.now += 0.1
        assert limits.expired(tracked, clock.now) is None
    clock.now += 0.1
    assert limits.sweep(clock.now) == [(tracked, "slow")]
    assert close.calls == 1
    assert (limits.stats.closed_slow, limits.stats.buffered_bytes) == (1, 0)


def test_a_frame_completed_starts_the_next_partial_frames_deadline_afresh() -> None:
    clock = FakeClock()
    limits = _limits(clock)
    tracked = limits.open(Closer())
    assert tracked is not None
    assert limits.received(tracked, 5, 0)
    clock.now += 1.5
    assert limits.received(tracked, 7, 2)  # two frames out, the start of a third buffered
    clock.now += 1.5
    assert limits.sweep(clock.now) == []
    assert limits.received(tracked, 0, 1)
    assert limits.stats.buffered_bytes == 0
    clock.now += 9.9  # nothing buffered, nothing outstanding: the idle clock from the frame
    assert limits.sweep(clock.now) == []


def test_partial_frames_over_the_budget_close_the_connection_that_went_over() -> None:
    clock = FakeClock()
    budget = 3 * MIB
    limits = _limits(clock, client_max_buffered_bytes=budget)
    first, second = limits.open(Closer()), limits.open(Closer())
    assert first is not None and second is not None
    assert limits.received(first, 2 * MIB, 0)
    assert limits.received(second, MIB - 1, 0)
    assert limits.stats.buffered_bytes == budget - 1
    assert not limits.received(second, MIB + 1, 0)
    assert limits.stats.closed_over_budget == 1
    assert limits.stats.buffered_bytes == 2 * MIB  # the one closed holds nothing any more
    limits.closed(second)
    assert limits.received(first, 0, 1)
    assert (limits.stats.buffered_bytes, limits.stats.open) == (0, 1)


def test_a_full_client_port_opens_nothing() -> None:
    limits = _limits(FakeClock(), client_max_connections=1)
    assert limits.open(Closer()) is not None
    assert limits.open(Closer()) is None
    assert (limits.stats.open, limits.stats.refused) == (1, 1)


def test_the_sweep_runs_by_itself_on_a_loop_while_connections_are_open() -> None:
    async def run() -> None:
        limits = ClientPortLimits(
            LimitsConfig(client_idle_timeout_s=0.05, client_frame_timeout_s=1.0)
        )
        close = Closer()
        tracked = limits.open(close)
        assert tracked is not None
        await wait_until(lambda: close.calls == 1, "the idle connection was not closed", 5)
        assert limits.stats.closed_idle == 1 and limits._timer is None

    asyncio.run(run())


# ---------------------------------------------------------------------- configuration
def _raw(tmp_path: Path, limits: dict[str, Any] | None) -> dict[str, Any]:
    base = free_base_port()
    raw: dict[str, Any] = {
        "cluster_id": "limits",
        "data_dir": str(tmp_path),
        "replica": [
            {
                "id": i,
                "address": f"127.0.0.1:{base + i}",
                "client_address": f"127.0.0.1:{base + 100 + i}",
                "site": site,
            }
            for i, site in enumerate(["CA", "OR", "OH"])
        ],
    }
    if limits is not None:
        raw["limits"] = limits
    return raw


def test_the_defaults_apply_without_a_limits_table(tmp_path: Path) -> None:
    config = parse_cluster_config(_raw(tmp_path, None), base=tmp_path, source="t")
    assert config.limits == LimitsConfig()
    assert config.limits.peer_cap(3) == peer_connection_cap(3) == 2 * 2 + 8
    assert LimitsConfig().client_max_frame_bytes >= LARGEST_REQUEST_BYTES
    custom = parse_cluster_config(
        _raw(tmp_path, {"client_idle_timeout_s": 1, "peer_max_connections": 5}),
        base=tmp_path, source="t",
    )
    assert custom.limits.client_idle_timeout_s == 1 and custom.limits.peer_cap(3) == 5


@pytest.mark.parametrize(("table", "message"), [
    ({"idle_timeout": 1}, "[limits]: unknown keys ['idle_timeout']"),
    ({"client_idle_timeout_s": 0}, "[limits].client_idle_timeout_s must be seconds > 0, got 0"),
    ({"client_frame_timeout_s": True}, "[limits].client_frame_timeout_s must be seconds > 0"),
    ({"client_frame_timeout_s": "5"}, "[limits].client_frame_timeout_s must be seconds > 0"),
    ({"client_idle_timeout_s": float("inf")}, "[limits].client_idle_timeout_s must be seconds"),
    ({"client_max_connections": 0}, "[limits].client_max_connections must be an integer >= 1"),
    ({"client_max_frame_bytes": 1 << 16},
     "[limits].client_max_frame_bytes must be an integer >= "
     f"{LARGEST_REQUEST_BYTES} (the largest valid request)"),
    ({"client_max_frame_bytes": 4 * MIB, "client_max_buffered_bytes": 3 * MIB},
     f"[limits].client_max_buffered_bytes ({3 * MIB}) must be >= "
     f"[limits].client_max_frame_bytes ({4 * MIB})"),
    ({"peer_max_connections": 1},
     "[limits].peer_max_connections must be 0 (automatic) or at least the 2 other replicas"),
    ({"peer_max_connections": -1}, "[limits].peer_max_connections must be an integer >= 0"),
    ({"peer_max_handshakes": 0}, "[limits].peer_max_handshakes must be an integer >= 1"),
    ({"peer_handshake_timeout_s": -2}, "[limits].peer_handshake_timeout_s must be seconds > 0"),
])
def test_a_bad_limit_is_a_clear_error_naming_its_key(
    tmp_path: Path, table: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_cluster_config(_raw(tmp_path, table), base=tmp_path, source="t")
    assert message in str(caught.value)


def test_limits_must_be_a_table(tmp_path: Path) -> None:
    raw = _raw(tmp_path, None)
    raw["limits"] = 5
    with pytest.raises(ConfigError, match=r"\[limits\] must be a table"):
        parse_cluster_config(raw, base=tmp_path, source="t")


# ---------------------------------------------------------------------- a live cluster
IDLE_S = 0.6
SLOW_S = 0.3


def _cluster(tmp_path: Path, **limits: Any) -> tuple[list[ReplicaNode], list[tuple[str, int]]]:
    table = {"client_idle_timeout_s": IDLE_S, "client_frame_timeout_s": SLOW_S, **limits}
    config = parse_cluster_config(_raw(tmp_path, table), base=tmp_path, source="t")
    nodes = [
        ReplicaNode(config, i, KVStore(), fsync=False, fault_injection=True) for i in range(3)
    ]
    return nodes, [spec.client_address for spec in config.replicas]


def _metric(node: ReplicaNode, name: str) -> int:
    (value,) = [
        line.split()[1] for line in render(node).splitlines() if line.split()[0] == name
    ]
    return int(float(value))


async def _closed_by_peer(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> float:
    """Seconds until the other side closes (reading whatever it sent)."""
    started = time.monotonic()
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                if not await reader.read(1 << 16):
                    break
            except ConnectionError:
                break
    return time.monotonic() - started


async def _ask(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: ClientRequest
) -> ClientResponse:
    writer.write(frame_to_wire(request.encode()))
    frames = FrameReader()
    async with asyncio.timeout(5):
        while True:
            data = await reader.read(1 << 16)
            assert data, "the replica closed the connection"
            payloads = frames.feed(data)
            if payloads:
                return decode_response(payloads[0])


def _put(client_id: int, seq: int, key: str) -> ClientRequest:
    command = Command(client_id=client_id, seq=seq, op=kv_put(key, "v"), keys=(key,))
    return ClientRequest(1, "cmd", command)


def test_slow_and_idle_client_connections_are_closed_but_not_one_awaiting_an_answer(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        nodes, clients = _cluster(tmp_path)
        for node in nodes:
            await node.start()
        node = nodes[0]
        try:
            # slow-loris: half a length prefix, then nothing
            reader, slow = await asyncio.open_connection(*clients[0])
            slow.write(b"\x00\x00")
            elapsed = await _closed_by_peer(reader)
            assert SLOW_S <= elapsed < SLOW_S + 2, elapsed
            await wait_until(
                lambda: _metric(node, "sdpaxos_client_connections_slow_closed_total") == 1,
                "the slow-loris connection is not counted",
            )
            slow.close()
            # idle: connects and says nothing
            reader, idle = await asyncio.open_connection(*clients[0])
            elapsed = await _closed_by_peer(reader)
            assert IDLE_S <= elapsed < IDLE_S + 2, elapsed
            assert _metric(node, "sdpaxos_client_connections_idle_closed_total") == 1
            idle.close()
            # a request that cannot commit (replica 0 cut off) keeps its connection open past
            # the idle timeout; healed, its answer arrives on that same connection
            await cut_off(clients[0], [1, 2])
            reader, waiting = await asyncio.open_connection(*clients[0])
            waiting.write(frame_to_wire(_put(41, 0, "held").encode()))
            await wait_until(
                lambda: node.client_limits.stats.open == 1
                and next(iter(node.client_limits._connections)).outstanding == 1,
                "the request is not outstanding",
            )
            # a connection opened after it, idle, is closed: by then the waiting one would
            # have been too, were it idle
            control_reader, control = await asyncio.open_connection(*clients[0])
            await _closed_by_peer(control_reader)
            control.close()
            assert not reader.at_eof()
            assert _metric(node, "sdpaxos_client_connections_idle_closed_total") == 2
            await cut_off(clients[0], [])
            frames = FrameReader()
            async with asyncio.timeout(10):
                while not (payloads := frames.feed(await reader.read(1 << 16))):
                    pass
            assert decode_response(payloads[0]).status == "ok"
            waiting.close()
            await wait_until(
                lambda: _metric(node, "sdpaxos_client_connections_open") == 0,
                "connections left open",
            )
            # and a normal client is served afterwards
            async with Client(42, clients, timeout_s=2.0) as client:
                assert (await client.execute(kv_put("after", "1"), ["after"])).status == "ok"
                reply = await client.read(kv_get("after"), ["after"])
                assert msgpack.unpackb(reply.payload) == ["value", "1"]
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 40))


def test_connections_over_the_caps_are_refused_while_the_others_keep_working(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        nodes, clients = _cluster(
            tmp_path, client_max_connections=2, peer_max_connections=2,
            client_idle_timeout_s=30, peer_handshake_timeout_s=0.5,
        )
        for node in nodes:
            await node.start()
        node = nodes[0]
        try:
            kept = [await asyncio.open_connection(*clients[0]) for _ in range(2)]
            reader, extra = await asyncio.open_connection(*clients[0])
            # told why, then closed at once: a client tries another replica (a connection
            # closed without a word would read as a refused TLS certificate)
            async with asyncio.timeout(1.0):
                told = decode_response(FrameReader().feed(await reader.read(1 << 16))[0])
            assert (told.req_id, told.status) == (NO_REQUEST, "indefinite")
            assert "client connection cap (2)" in str(told.payload)
            assert await _closed_by_peer(reader) < 1.0
            extra.close()
            assert _metric(node, "sdpaxos_client_connections_refused_total") == 1
            assert _metric(node, "sdpaxos_client_connections_open") == 2
            for seq, (r, w) in enumerate(kept):
                assert (await _ask(r, w, _put(43, seq, f"kept{seq}"))).status == "ok"
            kept[0][1].close()
            await wait_until(
                lambda: _metric(node, "sdpaxos_client_connections_open") == 1,
                "a closed connection still counts",
            )
            reader, again = await asyncio.open_connection(*clients[0])  # room again
            assert (await _ask(reader, again, _put(43, 2, "again"))).status == "ok"
            again.close()
            kept[1][1].close()
            # the peer port: both other replicas' connections, then no room for a third
            # connection claiming a configured peer, refused at once once its handshake is in
            await wait_until(
                lambda: _metric(node, "sdpaxos_peer_connections_open") == 2,
                "the peers are not connected",
            )
            peer_address = node.config.replica(0).address
            reader, intruder = await asyncio.open_connection(*peer_address)
            intruder.write(Handshake(node.config.cluster_id, 1, FORMAT_VERSION).encode())
            assert await _closed_by_peer(reader) < 1.0
            intruder.close()
            assert _metric(node, "sdpaxos_peer_connections_refused_total") == 1
            # a silent one does not count against that cap: it waits in its handshake, and
            # is closed at the handshake's deadline
            reader, silent = await asyncio.open_connection(*peer_address)
            await wait_until(lambda: _metric(node, "sdpaxos_peer_handshakes_open") == 1,
                             "the silent connection is not in its handshake")
            assert _metric(node, "sdpaxos_peer_connections_open") == 2
            assert 0.3 < await _closed_by_peer(reader) < 2.0  # (peer_handshake_timeout_s)
            silent.close()
            assert _metric(node, "sdpaxos_peer_handshakes_timed_out_total") == 1
            assert _metric(node, "sdpaxos_peer_handshakes_open") == 0
            await wait_until(
                lambda: _metric(node, "sdpaxos_client_connections_open") == 0,
                "client connections left open",
            )
            async with Client(44, clients, timeout_s=2.0) as client:
                assert (await client.execute(kv_put("after", "2"), ["after"])).status == "ok"
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 40))


def test_partial_frames_over_the_buffer_budget_close_the_connection(tmp_path: Path) -> None:
    async def run() -> None:
        budget = 3 * MIB
        nodes, clients = _cluster(
            tmp_path, client_max_frame_bytes=2 * MIB, client_max_buffered_bytes=budget,
            client_frame_timeout_s=30,
        )
        for node in nodes:
            await node.start()
        node = nodes[0]
        try:
            # a 16 MiB frame (the peer port's limit) is refused at its header
            reader, huge = await asyncio.open_connection(*clients[0])
            huge.write((16 * MIB).to_bytes(4, "big") + b"x" * 1000)
            await _closed_by_peer(reader)
            huge.close()
            # two partial frames under the per-connection limit but over the budget together
            held = 2 * MIB - 10
            r1, first = await asyncio.open_connection(*clients[0])
            first.write((2 * MIB).to_bytes(4, "big") + b"x" * (held - 4))
            await wait_until(
                lambda: _metric(node, "sdpaxos_client_buffered_bytes") == held,
                "the first partial frame is not buffered",
            )
            r2, second = await asyncio.open_connection(*clients[0])
            second.write((2 * MIB).to_bytes(4, "big") + b"x" * (MIB + (MIB >> 1)))
            await _closed_by_peer(r2)
            second.close()
            assert _metric(node, "sdpaxos_client_connections_over_budget_total") == 1
            assert _metric(node, "sdpaxos_client_buffered_bytes") == held
            assert not r1.at_eof()
            first.close()
            # on the peer port, a first frame too long to be a handshake is refused at once,
            # not after the handshake timeout
            reader, fake_peer = await asyncio.open_connection(*node.config.replica(0).address)
            fake_peer.write((16 * MIB).to_bytes(4, "big") + b"x" * 8000)
            assert await _closed_by_peer(reader) < 1.0
            fake_peer.close()
            await wait_until(
                lambda: node.transport.stats.bad_connections == 1, "the peer is not counted"
            )
            await wait_until(
                lambda: _metric(node, "sdpaxos_client_buffered_bytes") == 0,
                "the closed connection's bytes still count",
            )
            async with Client(45, clients, timeout_s=2.0) as client:
                assert (await client.execute(kv_put("after", "3"), ["after"])).status == "ok"
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 40))


# ---------------------------------------------------------------------- the native client
def test_the_client_resends_once_on_a_new_connection_when_its_pooled_one_was_closed() -> None:
    """A replica closing a pooled connection (idle) just as a request goes out: the client
    resends it on a new connection to the same replica, even with a single attempt."""

    async def run() -> None:
        connections = 0

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            frames = FrameReader()
            answered = 0
            while data := await reader.read(1 << 16):
                for payload in frames.feed(data):
                    req_id = msgpack.unpackb(payload)[0]
                    if connections == 1 and answered == 1:
                        writer.close()  # the idle close racing with the second request
                        return
                    writer.write(frame_to_wire(ClientResponse(req_id, "ok", b"x").encode()))
                    answered += 1
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        address = server.sockets[0].getsockname()[:2]
        try:
            async with Client(46, [address], timeout_s=2.0, attempts=1) as client:
                assert (await client.read(b"a")).payload == b"x"
                assert (await client.read(b"b")).payload == b"x"
            assert connections == 2
        finally:
            server.close()

    asyncio.run(asyncio.wait_for(run(), 10))
