"""``sdpaxos ctl``: the allocation store from the command line, over gRPC.

    sdpaxos ctl --server HOST:PORT submit NAME --vc VC --priority P --pods 2x8,1x4
    sdpaxos ctl --config cluster.toml release NAME
    sdpaxos ctl ... status NAME | vc NAME | watch [--from REV] | node NAME --bad|--healthy

Tables on the terminal (rich); ``--json`` prints JSON instead. Exit status 1 with a message on
an error (invalid request, unavailable replica), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_arguments", "parse_pods", "run"]


def parse_pods(text: str) -> list[tuple[int, int]]:
    """``"2x8,1x4"`` -> ``[(2, 8), (1, 4)]``: pods x GPUs per pod, per gang member."""
    members = []
    for part in text.split(","):
        pods, sep, gpus = part.strip().partition("x")
        if not sep or not pods.isdigit() or not gpus.isdigit() or min(int(pods), int(gpus)) < 1:
            raise argparse.ArgumentTypeError(f"--pods: expected PODSxGPUS[,...], got {part!r}")
        members.append((int(pods), int(gpus)))
    return members


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="a replica's gRPC address, host:port")
    where.add_argument("--config", help="a cluster file: use its first grpc_address")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--timeout", type=float, default=10.0)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    submit = verbs.add_parser("submit", help="submit a gang (affinity group)")
    submit.add_argument("name")
    submit.add_argument("--vc", required=True)
    submit.add_argument("--priority", type=int, default=0, help="0..1000, or -1 opportunistic")
    submit.add_argument("--pods", type=parse_pods, required=True, help="e.g. 2x8,1x4")
    submit.add_argument("--leaf-type", default="")
    submit.add_argument("--pinned", default="")
    submit.add_argument("--lazy", action="store_true", help="lazy preemption")
    release = verbs.add_parser("release", help="release a group's GPUs")
    release.add_argument("name")
    status = verbs.add_parser("status", help="one group, or every allocation")
    status.add_argument("name", nargs="?", default="")
    status.add_argument("--stale", action="store_true", help="local read, possibly old")
    vc = verbs.add_parser("vc", help="a virtual cluster's cells and GPU use")
    vc.add_argument("name")
    watch = verbs.add_parser("watch", help="stream change events")
    watch.add_argument("--from", dest="since", type=int, default=-1)
    watch.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")
    node = verbs.add_parser("node", help="mark a node healthy or bad")
    node.add_argument("name")
    health = node.add_mutually_exclusive_group(required=True)
    health.add_argument("--healthy", dest="healthy", action="store_true")
    health.add_argument("--bad", dest="healthy", action="store_false")


def run(args: argparse.Namespace) -> int:
    import grpc

    from cluster_state.grpc_api import cluster_state_pb2 as pb
    from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc

    target = args.server or _from_config(args.config)
    if target is None:
        return 2
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.AllocationServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            return _verb(args, stub, pb)
        except grpc.RpcError as exc:
            print(f"sdpaxos ctl: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1


def _from_config(path: str) -> str | None:
    from consensus.errors import ConfigError
    from consensus.runtime.cluster_config import load_cluster_config

    try:
        config = load_cluster_config(path)
    except ConfigError as exc:
        print(f"sdpaxos ctl: {exc}", file=sys.stderr)
        return None
    for spec in config.replicas:
        if spec.grpc_address is not None:
            return f"{spec.grpc_address[0]}:{spec.grpc_address[1]}"
    print(f"sdpaxos ctl: no replica in {path} has a grpc_address", file=sys.stderr)
    return None


def _verb(args: argparse.Namespace, stub: Any, pb: Any) -> int:
    timeout = args.timeout
    if args.verb == "submit":
        group = pb.GroupSpec(
            name=args.name, vc=args.vc, priority=args.priority,
            members=[pb.Member(pods=p, leaves=g) for p, g in args.pods],
            leaf_type=args.leaf_type, pinned=args.pinned, lazy=args.lazy,
        )
        reply = stub.Submit(pb.SubmitRequest(group=group), timeout=timeout)
        outcome = reply.WhichOneof("outcome")
        if outcome == "placed":
            placed = reply.placed
            pods = [[p.leaves, p.node, list(p.devices)] for p in placed.pods]
            doc: Any = {"placed": placed.group, "chain": placed.chain, "token": placed.token,
                        "pods": pods}
            rows = [[str(n), node, ",".join(map(str, d))] for n, node, d in pods]
            _show(args, doc, f"{placed.group} placed (fencing token {placed.token})",
                  ["GPUs", "node", "devices"], rows)
        elif outcome == "preempting":
            doc = {"preempting": reply.preempting.group,
                   "victims": list(reply.preempting.victims)}
            _show(args, doc, f"{args.name} preempting", ["victim"],
                  [[v] for v in reply.preempting.victims])
        else:
            doc = {"waiting": reply.waiting.group, "reason": reply.waiting.reason}
            _show(args, doc, f"{args.name} waiting: {reply.waiting.reason}", [], [])
    elif args.verb == "release":
        released = stub.Release(pb.ReleaseRequest(group=args.name), timeout=timeout)
        doc = {"released": args.name, "promoted": list(released.promoted)}
        _show(args, doc, f"{args.name} released", ["placed now (was preempting)"],
              [[g] for g in released.promoted])
    elif args.verb == "status":
        query = pb.QueryRequest(name=args.name, stale=args.stale)
        if args.name:
            info = json.loads(stub.GetGroup(query, timeout=timeout).json)
            rows = [[k, json.dumps(v)] for k, v in info.items()]
            _show(args, info, f"group {args.name}", ["field", "value"], rows)
        else:
            groups = json.loads(stub.ListAllocations(query, timeout=timeout).json)
            rows = [[g["name"], g["vc"], str(g["priority"]), g["state"], str(g["token"]),
                     str(g["leaves"])] for g in groups]
            _show(args, groups, "allocations",
                  ["group", "vc", "priority", "state", "token", "GPUs"], rows)
    elif args.verb == "vc":
        info = json.loads(stub.GetVC(pb.QueryRequest(name=args.name), timeout=timeout).json)
        rows = [[c["cell_type"], str(c["cells"]), str(c["used"]), str(c["free"]), str(c["bad"])]
                for c in info["cells"]]
        leaves = info["leaves"]
        _show(args, info, f"{args.name}: {leaves['used']} of {leaves['total']} GPUs used",
              ["cell type", "cells", "used", "free", "bad"], rows)
    elif args.verb == "watch":
        for seen, event in enumerate(stub.Watch(pb.WatchRequest(since=args.since)), start=1):
            doc = {"revision": event.revision, "kind": event.kind, "subject": event.subject,
                   "data": json.loads(event.data_json)}
            print(json.dumps(doc) if args.json
                  else f"{event.revision:>8}  {event.kind:<11} {event.subject}", flush=True)
            if args.count and seen >= args.count:
                break
    else:
        reply = stub.SetNodeHealth(pb.NodeHealthRequest(node=args.name, healthy=args.healthy),
                                   timeout=timeout)
        doc = {"node": args.name, "healthy": args.healthy, "changed": reply.changed,
               "cancelled": list(reply.cancelled)}
        _show(args, doc, f"{args.name} {'healthy' if args.healthy else 'bad'}"
              f"{'' if reply.changed else ' (unchanged)'}", ["cancelled preemptor"],
              [[g] for g in reply.cancelled])
    return 0


def _show(args: argparse.Namespace, doc: Any, title: str, columns: list[str],
          rows: list[list[str]]) -> None:
    if args.json:
        print(json.dumps(doc))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not columns:
        console.print(title)
        return
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)
