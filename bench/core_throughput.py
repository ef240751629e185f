"""``sdpaxos bench core``: protocol-core throughput with every replica in one process.

No I/O and no simulated delays: each round, every replica receives ``--batch`` 16-byte blind
writes from its clients, then messages are delivered until the cluster is quiet, and every
replica applies what it executes to a ``KVStore``. The figure is commands executed on *all*
replicas per wall-clock second — the CPU cost of the protocol plus state machine, with
``--codec`` adding message encoding and decoding.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import time
from collections import deque

from consensus.config import ProtocolConfig
from consensus.messages import Command, PeerMessage
from consensus.protocol.sdpaxos import SDPaxosReplica
from consensus.statemachine import KVStore, batch_applier, kv_put

__all__ = ["add_arguments", "measure", "run"]


def measure(
    replicas: int, commands: int, batch: int, use_codec: bool, profile: bool = False
) -> dict[str, float]:
    config = ProtocolConfig(replicas=replicas, max_batch=max(batch, 1))
    cores = [SDPaxosReplica(config, r, rng=random.Random(r)) for r in range(replicas)]
    appliers = [batch_applier(KVStore()) for _ in range(replicas)]
    inbox: deque[tuple[int, object]] = deque()
    if use_codec:
        from consensus.codec import decode_frame, encode_frame
    ops = [kv_put(f"k{i % 1024:05d}", f"{i:08d}") for i in range(4096)]  # 16-byte ops
    executed = 0
    seq = 0
    target = commands * replicas
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler:
        profiler.enable()
    while executed < target:
        for r, core in enumerate(cores):
            for _ in range(batch):
                core.propose(Command(client_id=r, seq=seq, op=ops[seq % 4096], blind=True), 0)
                seq += 1
        touched = list(range(replicas))
        while touched:
            for r in touched:
                ready = cores[r].ready()
                frames: dict[int, list[PeerMessage]] = {}
                for out in ready.send_after_persist + ready.send:
                    frames.setdefault(out.to, []).append(out.message)
                for to, msgs in frames.items():
                    inbox.append((to, encode_frame(msgs) if use_codec else msgs))
                apply_batch = appliers[r]
                for slot_batch in ready.apply:
                    apply_batch(slot_batch.position, slot_batch.commands)
                executed += ready.applied_count()
                cores[r].advance(ready)
            touched_set: set[int] = set()
            while inbox:
                to, frame = inbox.popleft()
                messages = decode_frame(frame) if use_codec else frame  # type: ignore[arg-type]
                for message in messages:  # type: ignore[union-attr]
                    cores[to].step(message, 0)
                touched_set.add(to)
            touched = sorted(touched_set)
    elapsed = time.perf_counter() - started
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(18)
    proposed = seq
    return {
        "replicas": replicas,
        "commands": proposed,
        "seconds": round(elapsed, 3),
        "commands_per_s": round(proposed / elapsed),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=3, help="how many replicas")
    parser.add_argument("--commands", type=int, default=300_000, help="commands to push through")
    parser.add_argument("--batch", type=int, default=256, help="commands per replica per round")
    parser.add_argument("--codec", action="store_true", help="encode and decode every frame")
    parser.add_argument("--profile", action="store_true", help="print a cProfile summary")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args: argparse.Namespace) -> int:
    result = measure(args.replicas, args.commands, args.batch, args.codec, args.profile)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['commands']} commands through {result['replicas']} replicas in "
            f"{result['seconds']} s: {result['commands_per_s']:,} commands/s"
        )
    return 0
