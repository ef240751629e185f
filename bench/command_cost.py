"""CPU per command of a replica's per-command parts, each alone, in one process (issue 37).

At peak a loaded replica's turns carry hundreds of commands each (``bench throughput``: about
70 turns a second per replica), so what a command costs is spent in a few parts, each run
once per command; this measures them one by one on a real (unstarted) ``ReplicaNode`` with the
key-value store, with no sockets and no other process, so that a change to one part is seen
without the noise of a whole cluster's:

* ``intake_us``: the client port taking a request in (``ClientPort._serve`` reading 16-byte
  blind writes, 64 to a read: framing, decoding, the refusal checks, its waiter, the inbox);
* ``feed_us``: the turn handing a proposal to the core (``TurnLoop._feed``, a turn's
  ``--batch`` proposals at once; the core's ``ready``/``advance`` between turns not counted);
* ``acknowledge_us``: a blind write that became ready answered (``ClientPort.acknowledge``
  to 24 connections, the answers' bytes built);
* ``apply_follower_us`` / ``apply_leader_us``: a slot's batch applied (``TurnLoop._apply``): a
  follower's as it came off the wire (``PackedBatch``, decoded there), the leader's as its
  core holds it (its clients answered);
* ``snapshot_ms``: the store's snapshot after ``--puts`` puts on keys uniform over 100k
  (``bench throughput``'s), the last of ``--snapshots``.

CPU is ``time.process_time``, the collector set as a serving replica's. ``python -m
bench.command_cost`` from a checkout root with ``PYTHONPATH=.`` measures that checkout (the
file runs unchanged against older builds that have the same parts). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from consensus.codec import frame_to_wire
from consensus.messages import Command
from consensus.packed_batch import PackedBatch
from consensus.protocol.ready import SlotBatch
from consensus.runtime.cli import SERVE_GC_THRESHOLDS, cluster_toml
from consensus.runtime.client_port import ClientConnection
from consensus.runtime.client_protocol import ClientRequest
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.histogram import Histogram
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.runtime.node_events import Propose
from consensus.statemachine import KVStore, kv_put

__all__ = ["add_arguments", "measure", "run"]

#: the keys of bench throughput's uniform workload, and its clients' sessions
KEYS = 100_000
CLIENTS = 72
#: a replica's client connections in bench throughput (72 over three replicas)
CONNECTIONS = 24
#: requests per socket read of the intake (what a loaded client's write holds)
PER_READ = 64


class _Transport:
    def abort(self) -> None:
        pass


class _Writer:
    """What the client port uses of a stream writer; its answers go nowhere."""

    transport = _Transport()

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


class _Reads:
    """What the client port uses of a stream reader: each read returns the next of
    ``chunks`` (as a socket's reads return what the client wrote at once), then b""."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = iter(chunks)

    async def read(self, limit: int) -> bytes:
        chunk = next(self._chunks, b"")
        assert len(chunk) <= limit
        return chunk


def _key(index: int) -> str:
    return f"k{index % KEYS:07d}"


def _blind_puts(first: int, count: int) -> list[Command]:
    """``count`` blind puts numbered from ``first``, round-robin over the clients' pinned
    sessions (client 7 + i % CLIENTS, its seq growing)."""
    return [Command(client_id=7 + n % CLIENTS, seq=n // CLIENTS + 1, op=kv_put(_key(n), "v" * 16),
                    keys=(_key(n),), blind=True) for n in range(first, first + count)]


def _node(directory: str) -> ReplicaNode:
    path = Path(directory) / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    return ReplicaNode(load_cluster_config(path), 0, KVStore(), fsync=False)


async def _intake(requests: int) -> float:
    with tempfile.TemporaryDirectory(prefix="command-cost-") as tmp:
        node = _node(tmp)
        clients = node.clients
        frames = [frame_to_wire(ClientRequest(n, "cmd", command).encode())
                  for n, command in enumerate(_blind_puts(0, requests))]
        reader = _Reads([b"".join(frames[start:start + PER_READ])
                         for start in range(0, requests, PER_READ)])
        started = time.process_time()
        await clients._serve(reader, _Writer())  # type: ignore[arg-type]
        seconds = time.process_time() - started
        assert len(clients._commands) == requests, "a request was not taken in"
        return seconds / requests


def _feed_and_acknowledge(turns: int, batch: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="command-cost-") as tmp:
        node = _node(tmp)
        loop, clients, core = node.turns, node.clients, node.core
        connections = [ClientConnection(_Writer(), clients.limits.open(lambda: None))  # type: ignore[arg-type]
                       for _ in range(CONNECTIONS)]
        latency = Histogram()
        feed = acknowledge = 0.0
        for turn in range(turns):
            now = 1_000_000 + 1_000 * turn
            commands = _blind_puts(turn * batch, batch)
            events = [Propose(command) for command in commands]
            started = time.process_time()
            loop._feed(events, now)  # type: ignore[arg-type]
            feed += time.process_time() - started
            core.advance(core.ready())
            for n, command in enumerate(commands):
                clients._commands[command.client_id, command.seq].append(
                    (connections[n % CONNECTIONS], turn * batch + n))
            started = time.process_time()
            clients.acknowledge(commands, now + 500, latency)
            acknowledge += time.process_time() - started
            for connection in connections:
                connection.out.clear()
            clients._dirty.clear()
        assert latency.count == turns * batch, "a write was not acknowledged"
        return feed / (turns * batch), acknowledge / (turns * batch)


async def _apply(turns: int, batch: int, *, led_here: bool) -> float:
    with tempfile.TemporaryDirectory(prefix="command-cost-") as tmp:
        node = _node(tmp)
        batches = []
        for turn in range(turns):
            commands = tuple(_blind_puts(turn * batch, batch))
            carried = commands if led_here else PackedBatch(msgpack.packb(commands))
            batches.append(SlotBatch(turn, 0, carried, led_here))
        started = time.process_time()
        for one in batches:
            await node.turns._apply([one], 0)
        seconds = time.process_time() - started
        assert node.stats.commands_applied == turns * batch
        return seconds / (turns * batch)


def _snapshot(puts: int, snapshots: int, batch: int) -> float:
    store = KVStore()
    rng = random.Random(1)
    seqs = [0] * CLIENTS
    seconds = 0.0
    for _ in range(snapshots):
        commands = []
        for n in range(puts):
            client = n % CLIENTS
            seqs[client] += 1
            key = _key(rng.randrange(KEYS))
            commands.append(Command(client_id=7 + client, seq=seqs[client],
                                    op=kv_put(key, "v" * 16), keys=(key,), blind=True))
        for start in range(0, puts, batch):
            store.apply_batch(start, commands[start:start + batch])
        started = time.process_time()
        store.snapshot()
        seconds = time.process_time() - started
    return seconds


async def measure(*, requests: int, turns: int, batch: int, puts: int,
                  snapshots: int) -> dict[str, Any]:
    intake = await _intake(requests)
    feed, acknowledge = _feed_and_acknowledge(turns, batch)
    follower = await _apply(turns, batch, led_here=False)
    leader = await _apply(turns, batch, led_here=True)
    snapshot = _snapshot(puts, snapshots, batch) if snapshots else 0.0
    return {
        "batch": batch,
        "intake_us": round(intake * 1e6, 3),
        "feed_us": round(feed * 1e6, 3),
        "acknowledge_us": round(acknowledge * 1e6, 3),
        "apply_follower_us": round(follower * 1e6, 3),
        "apply_leader_us": round(leader * 1e6, 3),
        "snapshot_ms": round(snapshot * 1e3, 1),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=100_000, help="requests taken in")
    parser.add_argument("--turns", type=int, default=1_000, help="turns fed, acknowledged "
                        "and applied")
    parser.add_argument("--batch", type=int, default=100, help="commands a turn")
    parser.add_argument("--puts", type=int, default=100_000, help="puts between snapshots "
                        "(a replica's default snapshot interval)")
    parser.add_argument("--snapshots", type=int, default=3, help="snapshots (the last timed; "
                        "0: none)")


def run(args: argparse.Namespace) -> int:
    gc.set_threshold(*SERVE_GC_THRESHOLDS)  # as a serving replica
    result = asyncio.run(measure(requests=args.requests, turns=args.turns, batch=args.batch,
                                 puts=args.puts, snapshots=args.snapshots))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":  # an older checkout's bench/ has no command-cost subcommand
    _parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(_parser)
    raise SystemExit(run(_parser.parse_args()))
