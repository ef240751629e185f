"""``sdpaxos bench msg-cost``: messages per linearizable read and per write (paper §3.5).

The simulator without faults, the paper's WAN, one client at a time per site: a workload of
only blind writes, then one of only reads through the sequencer (RRequest/RReply). Counted:
every protocol message sent, except the periodic ones (heartbeats, lease grants, pre-votes).
A read at the sequencer (replica 0 here) is local; a read elsewhere is one RRequest and one
RReply, so its cost is the read messages over the reads issued away from the sequencer. The
paper compares that 2 with the C-phase of a write committed through Paxos,
2(Q - 1) + (N - 1) = 2Q + N - 3 with a thrifty accept; we also report the whole cost of a
write (C-phase to all peers, and the O-phase). With five replicas acceptors acknowledge to
every replica, so that each learns choices without a commit from a far proposer: (N - 1)^2
acknowledgements instead of N - 1, C- and O-phase alike. A proposer (and a three-replica
sequencer) also acknowledges its own proposal to every peer, once durable: its Accept leaves
before its fsync and proves nothing of its own acceptance (N - 1 more per phase).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from consensus.sim.simulator import SimOptions, Simulation

__all__ = ["add_arguments", "measure", "run"]

#: sent on timers whether or not clients do anything
PERIODIC = frozenset({"Heartbeat", "LeaseGrant", "PreVote", "PreVoteReply"})
C_PHASE = frozenset({"CAccept", "CAck", "CCommit"})


def _run(replicas: int, workload: str, ops: int, seed: int) -> Any:
    # think time (up to 300 ms) evens out the sites: otherwise the sequencer's local client,
    # answered at once, would issue nearly every operation
    options = SimOptions(replicas=replicas, workload=workload, reads="lease", ops=ops,
                         concurrency=1, think_us=300_000, heal_us=600_000_000)
    result = Simulation(options, seed).run()
    if not result.ok:
        raise RuntimeError(f"simulation failed: {result.violation or result.liveness}")
    return result


def measure(replicas: int, ops: int, seed: int = 1) -> dict[str, float]:
    writes = _run(replicas, "writes", ops, seed)
    sent = {k: v for k, v in writes.messages.items() if k not in PERIODIC}
    reads = _run(replicas, "reads", ops, seed)
    read_msgs = sum(v for k, v in reads.messages.items() if k not in PERIODIC)
    remote = sum(1 for op in reads.history if (op.client - 1000) % replicas != 0)
    local = len(reads.history) - remote
    return {
        "per_write": sum(sent.values()) / writes.ops_completed,
        "per_write_c_phase": sum(v for k, v in sent.items() if k in C_PHASE)
        / writes.ops_completed,
        "per_read_remote": read_msgs / max(1, remote),
        "reads_remote": remote,
        "reads_at_sequencer": local,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, nargs="+", default=[3, 5],
                        help="replica counts, measured one after the other")
    parser.add_argument("--ops", type=int, default=500, help="client operations per replica count")
    parser.add_argument("--seed", type=int, default=1, help="the simulator's seed")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args: argparse.Namespace) -> int:
    rows = []
    for n in args.replicas:
        row: dict[str, Any] = {"replicas": n, "paper_write_c_phase": 2 * (n // 2 + 1) + n - 3}
        row.update({k: round(v, 2) for k, v in measure(n, args.ops, args.seed).items()})
        rows.append(row)
    if args.json:
        print(json.dumps(rows))
        return 0
    for row in rows:
        print(
            f"N={row['replicas']}: a read away from the sequencer {row['per_read_remote']} "
            f"messages (paper 2; {row['reads_at_sequencer']} reads at the sequencer: 0); a "
            f"write {row['per_write']} in all, {row['per_write_c_phase']} in its C-phase "
            f"(paper's thrifty C-phase {row['paper_write_c_phase']})"
        )
    return 0
