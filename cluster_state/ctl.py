"""``sdpaxos ctl``: the allocation store from the command line, over gRPC.

    sdpaxos ctl --server HOST:PORT submit NAME --vc VC --priority P --pods 2x8,1x4
    sdpaxos ctl --config cluster.toml release NAME
    sdpaxos ctl ... status [NAME] | vc NAME | summary | watch [--from REV | --now] | node NAME --bad
    sdpaxos ctl ... bind NAME --vc VC --pods 1x8 --on node-0003:0-7 --revision R
    sdpaxos ctl ... inspect physical [CHAIN] | inspect vc NAME | inspect group NAME
    sdpaxos ctl ... claim NAME --incarnation I --slot S --uid UID --pod NS/POD [--previous UID]
    sdpaxos ctl ... config apply FILE [--dry-run]

``claim`` gives member pod S of a placed group to a pod (what the Kubernetes extender records
when a pod takes its part of a gang; a compare-and-set: ``--previous`` names the pod that
holds it now, if one does); ``status NAME`` lists the group's claims, ``watch`` shows them as
``claimed`` events.

``config apply`` validates FILE (HiveD's YAML format) here, then proposes it through the log:
running groups keep their GPUs and the report says what happened to each (``--dry-run`` only
reports). Admin only where roles exist: over a TLS cluster's client port only an admin's
certificate may change the store (``consensus.auth``: the store has no ``Authorizer`` of its own
yet, so the default applies); the gRPC port and plaintext clusters check no role.

The replicas given (``--endpoints``, or every ``grpc_address`` of ``--config``) are where ctl
starts: it asks them for the current members (``ListMembers``, the log's member list, as etcd
clients sync from ``MemberList``; the newest answer, by epoch then applied position) and calls
the voters' gRPC addresses from then on, in the epoch's order, so it never calls a removed
replica and does call one added since the cluster file was written. A call that finds a
replica unavailable moves on to the next. Updates carry a session (a random client
id and sequence number 0), so an update re-sent to another replica takes effect once; a watch
that loses its replica resumes at the next one from the last revision it printed.

Where the store is: ``--endpoints HOST:PORT,...`` (gRPC addresses; ``--server`` is the same
option), ``--config`` (every replica's ``grpc_address``), else ``$SDPAXOS_ENDPOINTS`` /
``$SDPAXOS_CONFIG`` (``consensus.runtime.client_options``). These and ``--json``,
``--timeout``, ``--ca/--cert/--key`` go before or after the verb.

Tables on the terminal (rich); ``--json`` prints JSON instead. Exit codes
(``consensus.runtime.exit_codes``, the same as ``sdpaxos``'s client verbs): 0 done; 1 a
definite refusal (a submit left waiting, a bind conflict, an invalid request, NOT_FOUND,
PERMISSION_DENIED; a watch that saw fewer than ``--count`` events within ``--wait``); 2 bad
usage; 3 unavailable (no replica reachable, a deadline exceeded).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

from consensus.runtime.exit_codes import REFUSED

__all__ = ["add_arguments", "parse_devices", "parse_pods", "run"]

#: gRPC codes after which the same request may go to another replica
_RETRY_ELSEWHERE = ("UNAVAILABLE", "DEADLINE_EXCEEDED")
#: gRPC codes that exit UNAVAILABLE (no answer, rather than a refusal); any other is REFUSED
_UNAVAILABLE_CODES = (*_RETRY_ELSEWHERE, "CANCELLED")


def parse_pods(text: str) -> list[tuple[int, int]]:
    """``"2x8,1x4"`` -> ``[(2, 8), (1, 4)]``: pods x GPUs per pod, per gang member."""
    members = []
    for part in text.split(","):
        pods, sep, gpus = part.strip().partition("x")
        if not sep or not pods.isdigit() or not gpus.isdigit() or min(int(pods), int(gpus)) < 1:
            raise argparse.ArgumentTypeError(f"--pods: expected PODSxGPUS[,...], got {part!r}")
        members.append((int(pods), int(gpus)))
    return members


def parse_devices(text: str) -> tuple[str, list[int]]:
    """``"node-7:0-3,6"`` -> ``("node-7", [0, 1, 2, 3, 6])``: one pod's node and GPUs."""
    node, sep, spec = text.rpartition(":")
    devices: list[int] = []
    for part in spec.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            devices = []
            break
        devices += range(int(low), int(high if dash else low) + 1)
    if not sep or not node or not devices:
        raise argparse.ArgumentTypeError(f"--on: expected NODE:DEVICES (0-3,6), got {text!r}")
    return node, devices


def _global_options(parser: argparse.ArgumentParser, *, after_verb: bool) -> None:
    """Where the store is, output and TLS: accepted before and after the verb (after it with
    SUPPRESS defaults, so an option given before is not reset)."""
    from consensus.runtime.client_options import add_client_options, parse_endpoints

    add_client_options(parser, after_verb=after_verb, endpoints_are="gRPC addresses",
                       timeout_s=CALL_TIMEOUT_S)
    parser.add_argument("--server", dest="endpoints", type=parse_endpoints,
                        default=argparse.SUPPRESS, metavar="HOST:PORT",
                        help="a replica's gRPC address (the same as --endpoints)")
    tls = parser.add_argument_group(
        "TLS", "a TLS cluster: present a client certificate of its CA (with --config, the "
        "file's [tls] client_cert unless these are given)")
    unset = argparse.SUPPRESS if after_verb else None
    tls.add_argument("--ca", default=unset, help="the cluster's CA certificate (PEM)")
    tls.add_argument("--cert", default=unset,
                     help="the client certificate (PEM), e.g. a scheduler's")
    tls.add_argument("--key", default=unset, help="its private key (PEM)")


#: default seconds per gRPC call
CALL_TIMEOUT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _global_options(parser, after_verb=False)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    def gang(verb: argparse.ArgumentParser) -> None:
        verb.add_argument("name", help="the group's (gang's) name")
        verb.add_argument("--vc", required=True, help="the virtual cluster it runs in")
        verb.add_argument("--priority", type=int, default=0,
                          help="0..1000, or -1 opportunistic")
        verb.add_argument("--pods", type=parse_pods, required=True,
                          help="PODSxGPUS per member, e.g. 2x8,1x4")
        verb.add_argument("--leaf-type", default="",
                          help="the GPU (leaf cell) type (default: any)")
        verb.add_argument("--pinned", default="", help="a pinned cell id of the VC")
        verb.add_argument("--lazy", action="store_true", help="lazy preemption")

    gang(verbs.add_parser("submit", help="submit a gang (affinity group)"))
    bind = verbs.add_parser("bind", help="place a gang at GPUs of your choice")
    gang(bind)
    bind.add_argument("--on", type=parse_devices, action="append", required=True,
                      metavar="NODE:DEVICES", help="one pod's GPUs; once per pod, in order")
    bind.add_argument("--revision", type=int, required=True,
                      help="conflict if one of these GPUs changed after this revision")
    claim = verbs.add_parser("claim", help="give a member pod of a placed group to a pod")
    claim.add_argument("name", help="the group's name")
    claim.add_argument("--incarnation", type=int, required=True,
                       help="the group's incarnation (status NAME shows it)")
    claim.add_argument("--slot", type=int, required=True, help="the member pod (0..)")
    claim.add_argument("--uid", required=True, help="the pod's UID")
    claim.add_argument("--pod", required=True, metavar="NAMESPACE/NAME", help="the pod")
    claim.add_argument("--previous", default="",
                       help="the UID of the pod that holds it now (default: nobody)")
    release = verbs.add_parser("release", help="release a group's GPUs")
    release.add_argument("name", help="the group's name")
    status = verbs.add_parser("status", help="one group, or every allocation")
    status.add_argument("name", nargs="?", default="",
                        help="the group's name (default: every allocation)")
    status.add_argument("--vc", default="", help="only this virtual cluster's allocations")
    status.add_argument("--stale", action="store_true", help="local read, possibly old")
    vc = verbs.add_parser("vc", help="a virtual cluster's cells and GPU use")
    vc.add_argument("name", help="the virtual cluster's name")
    verbs.add_parser("summary", help="GPU use per chain")
    watch = verbs.add_parser("watch", help="stream change events")
    start = watch.add_mutually_exclusive_group()
    start.add_argument("--from", dest="since", type=int, default=-1,
                       help="events after this revision (default: all the store keeps)")
    start.add_argument("--now", action="store_true",
                       help="only the changes from now on (the store's revision, read "
                       "linearizably by the replica)")
    watch.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")
    watch.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                       help="stop after this long (with --count: exit 1 if fewer events "
                       "came); default: no limit")
    node = verbs.add_parser("node", help="mark a node healthy or bad")
    node.add_argument("name", help="the node's name")
    health = node.add_mutually_exclusive_group(required=True)
    health.add_argument("--healthy", dest="healthy", action="store_true",
                        help="the node is healthy again")
    health.add_argument("--bad", dest="healthy", action="store_false",
                        help="the node is bad: its GPUs take no new groups")
    inspect = verbs.add_parser("inspect", help="cell trees: physical, a VC's, a group's")
    inspect.add_argument("kind", choices=["physical", "vc", "group"],
                         help="which tree: physical, a virtual cluster's, a group's")
    inspect.add_argument("name", nargs="?", default="",
                         help="physical: a chain (default all); vc / group: its name")
    inspect.add_argument("--stale", action="store_true", help="local read, possibly old")
    config = verbs.add_parser("config", help="the cluster configuration")
    config_verbs = config.add_subparsers(dest="config_verb", required=True, metavar="VERB")
    apply = config_verbs.add_parser("apply", help="run a new configuration, keeping the groups")
    apply.add_argument("file", help="HiveD-format YAML")
    apply.add_argument("--dry-run", action="store_true",
                       help="print what would happen to every group; change nothing")
    for verb in (*verbs.choices.values(), apply):  # the global options after the verb too
        if verb is not config:
            _global_options(verb, after_verb=True)


def run(args: argparse.Namespace) -> int:
    import grpc

    from consensus.errors import ConfigError
    from consensus.runtime.client_options import client_target
    from consensus.runtime.exit_codes import UNAVAILABLE, USAGE

    try:
        target = client_target(args)
    except ConfigError as exc:
        print(f"sdpaxos ctl: {exc}", file=sys.stderr)
        return USAGE
    args.config = target.config_path  # its certificates, also beside explicit endpoints
    targets = ([f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                for host, port in target.endpoints] if target.endpoints
               else _from_config(target.config_path or ""))
    if not targets:
        return USAGE
    try:
        credentials = _credentials(args)
    except ValueError as exc:
        print(f"sdpaxos ctl: {exc}", file=sys.stderr)
        return USAGE
    replicas = _Replicas(targets, args.timeout, credentials)
    try:
        replicas.sync()
        return _verb(args, replicas)
    except (grpc.RpcError, _StreamError) as exc:
        print(f"sdpaxos ctl: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return UNAVAILABLE if exc.code().name in _UNAVAILABLE_CODES else REFUSED
    except KeyboardInterrupt:
        return 130
    finally:
        replicas.close()


def _from_config(path: str) -> list[str]:
    from consensus.errors import ConfigError
    from consensus.runtime.cluster_config import load_cluster_config

    try:
        config = load_cluster_config(path)
    except ConfigError as exc:
        print(f"sdpaxos ctl: {exc}", file=sys.stderr)
        return []
    targets = [f"{spec.grpc_address[0]}:{spec.grpc_address[1]}"
               for spec in config.replicas if spec.grpc_address is not None]
    if not targets:
        print(f"sdpaxos ctl: no replica in {path} has a grpc_address", file=sys.stderr)
    return targets


def _credentials(args: argparse.Namespace) -> Any:
    """The gRPC channel credentials of a TLS cluster (None: plaintext); ``ValueError``
    saying what is missing or unreadable."""
    from pathlib import Path

    from cluster_state.grpc_api.tls import channel_credentials
    from consensus.errors import ConfigError
    from consensus.runtime.cluster_config import load_cluster_config
    from consensus.runtime.tls import TlsFiles

    given = [args.ca, args.cert, args.key]
    tls = None
    if args.config:
        try:
            tls = load_cluster_config(args.config).tls
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    if not any(given) and tls is None:
        return None
    ca = Path(args.ca) if args.ca else tls.ca if tls is not None else None
    if ca is None:
        raise ValueError("--ca (the cluster's CA certificate) is needed with --cert/--key")
    if (args.cert is None) != (args.key is None):
        raise ValueError("--cert and --key go together")
    files = (TlsFiles(Path(args.cert), Path(args.key)) if args.cert
             else tls.client if tls is not None else None)
    try:
        return channel_credentials(ca, files)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


class _Replicas:
    """Stubs for the candidate replicas; ``call`` tries them in turn."""

    def __init__(self, targets: list[str], timeout: float, credentials: Any = None) -> None:
        self.timeout = timeout
        self._credentials = credentials
        self.targets: list[str] = []
        self.channels: list[Any] = []
        self.stubs: list[Any] = []
        self._use(targets)

    def _use(self, targets: list[str]) -> None:
        """Call ``targets`` from now on (channels to the ones already open are kept)."""
        import grpc

        from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc
        from cluster_state.grpc_api.tls import CHANNEL_OPTIONS

        kept = dict(zip(self.targets, self.channels, strict=True))
        channels = [kept.pop(target, None) or (
            grpc.insecure_channel(target) if self._credentials is None
            else grpc.secure_channel(target, self._credentials, options=CHANNEL_OPTIONS))
            for target in targets]
        for channel in kept.values():
            channel.close()
        self.targets, self.channels = list(targets), channels
        self.stubs = [pb_grpc.AllocationServiceStub(c)  # type: ignore[no-untyped-call]
                      for c in channels]

    def sync(self) -> None:
        """Follow the current members: the voters' gRPC addresses of the newest
        ``ListMembers`` answer (epoch, then applied position) among the targets. Nothing
        changes if none answers one (unreachable, or a replica that predates it)."""
        import grpc

        from cluster_state.grpc_api import cluster_state_pb2 as pb

        answers = []
        for stub in self.stubs:
            try:
                answers.append(stub.ListMembers(pb.ListMembersRequest(), timeout=self.timeout))
            except grpc.RpcError:
                continue
        if not answers:
            return
        newest = max(answers, key=lambda a: (a.epoch, a.applied))
        voters = [m.grpc_address for m in newest.members if m.voter and m.grpc_address]
        if voters:
            self._use(voters)

    def call(self, method: str, request: Any) -> Any:
        import grpc

        for k, stub in enumerate(self.stubs):
            try:
                return getattr(stub, method)(request, timeout=self.timeout)
            except grpc.RpcError as exc:
                if exc.code().name not in _RETRY_ELSEWHERE or k == len(self.stubs) - 1:
                    raise
        raise AssertionError("no stubs")

    def watch(self, since: int, from_now: bool = False) -> Iterator[Any]:
        """Events after ``since`` (``from_now``: after the revision the store is at now, read
        linearizably by the replica), a message of several at a time (``WatchPushed``),
        moving on to the next replica when one becomes unavailable; gives up once every
        replica failed in a row. Messages hold whole revisions, so the next replica is
        asked from the last revision shown: nothing is lost or repeated. A watch the store
        no longer keeps events for, or that read too slowly, raises ``OUT_OF_RANGE``."""
        import grpc

        from cluster_state.errors import EventsCompacted
        from cluster_state.grpc_api import cluster_state_pb2 as pb

        last = None if from_now else since
        failures = 0
        k = 0
        while True:
            try:
                request = (pb.WatchRequest(since=-1, from_now=True) if last is None
                           else pb.WatchRequest(since=last))
                for batch in self.stubs[k].WatchPushed(request):
                    if batch.compacted:
                        raise _StreamError(grpc.StatusCode.OUT_OF_RANGE,
                                           str(EventsCompacted(batch.revision, batch.oldest)))
                    if last is None:  # the start of a watch from now
                        if batch.events:
                            raise _StreamError(grpc.StatusCode.FAILED_PRECONDITION,
                                               f"the replica at {self.targets[k]} predates "
                                               "watches from now: watch --from a revision")
                        last = batch.through
                        continue
                    if batch.events:
                        failures = 0
                        last = max(batch.through, batch.events[-1].revision)
                    yield from batch.events
                return
            except _StreamError:
                raise
            except grpc.RpcError as exc:
                failures += 1
                if exc.code().name not in _RETRY_ELSEWHERE or failures >= len(self.stubs):
                    raise
                k = (k + 1) % len(self.stubs)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


class _StreamError(Exception):
    """What a watch stream's last message said, as the gRPC error it stands for."""

    def __init__(self, code: Any, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> Any:
        return self._code

    def details(self) -> str:
        return self._details


def _session() -> Any:
    """A one-shot session for one update (``consensus.sessions``): retried elsewhere, it
    applies once, and it leaves nothing in the session table once its open-by time passed."""
    from cluster_state.client import new_client_id
    from cluster_state.grpc_api import cluster_state_pb2 as pb
    from consensus.sessions import one_shot_seq

    return pb.Session(client_id=new_client_id(), seq=one_shot_seq())


def _group(args: argparse.Namespace, pb: Any) -> Any:
    return pb.GroupSpec(
        name=args.name, vc=args.vc, priority=args.priority,
        members=[pb.Member(pods=p, leaves=g) for p, g in args.pods],
        leaf_type=args.leaf_type, pinned=args.pinned, lazy=args.lazy,
    )


def _verb(args: argparse.Namespace, replicas: _Replicas) -> int:
    from cluster_state.grpc_api import cluster_state_pb2 as pb

    verbs: dict[str, Callable[[argparse.Namespace, _Replicas, Any], int | None]] = {
        "submit": _submit, "bind": _bind, "release": _release, "status": _status,
        "claim": _claim,
        "vc": _vc, "summary": _summary, "watch": _watch, "node": _node,
        "inspect": _inspect, "config": _config,
    }
    return verbs[args.verb](args, replicas, pb) or 0


def _show_placed(args: argparse.Namespace, placed: Any) -> None:
    pods = [[p.leaves, p.node, list(p.devices)] for p in placed.pods]
    doc = {"placed": placed.group, "chain": placed.chain, "token": placed.token, "pods": pods}
    rows = [[str(n), node, ",".join(map(str, d))] for n, node, d in pods]
    _show(args, doc, f"{placed.group} placed (fencing token {placed.token})",
          ["GPUs", "node", "devices"], rows)


def _submit(args: argparse.Namespace, replicas: _Replicas, pb: Any) -> int | None:
    request = pb.SubmitRequest(group=_group(args, pb), session=_session())
    reply = replicas.call("Submit", request)
    outcome = reply.WhichOneof("outcome")
    if outcome == "placed":
        _show_placed(args, reply.placed)
    elif outcome == "preempting":
        victims = list(reply.preempting.victims)
        _show(args, {"preempting": reply.preempting.group, "victims": victims},
              f"{args.name} preempting: placed once these are released", ["victim"],
              [[v] for v in victims])
    else:
        _show(args, {"waiting": reply.waiting.group, "reason": reply.waiting.reason},
              f"{args.name} waiting: {reply.waiting.reason}", [], [])
        return REFUSED  # queued, not placed: a script must not take it for done
    return None


def _bind(args: argparse.Namespace, replicas: _Replicas, pb: Any) -> int | None:
    pods = [pb.PodPlacement(node=node, devices=devices) for node, devices in args.on]
    request = pb.BindRequest(group=_group(args, pb), pods=pods, revision=args.revision,
                             session=_session())
    reply = replicas.call("Bind", request)
    if reply.WhichOneof("outcome") == "placed":
        _show_placed(args, reply.placed)
    else:
        _show(args, {"conflict": reply.conflict.group, "reason": reply.conflict.reason},
              f"{args.name} not bound: {reply.conflict.reason}", [], [])
        return REFUSED
    return None


def _claim(args: argparse.Namespace, replicas: _Replicas, pb: Any) -> int | None:
    request = pb.ClaimRequest(group=args.name, incarnation=args.incarnation, slot=args.slot,
                              uid=args.uid, pod=args.pod, previous=args.previous,
                              session=_session())
    reply = replicas.call("Claim", request)
    if reply.WhichOneof("outcome") == "claimed":
        claimed = reply.claimed
        _show(args, {"claimed": claimed.group, "incarnation": claimed.incarnation,
                     "slot": claimed.slot, "uid": claimed.uid},
              f"{args.pod} ({args.uid}) holds member pod {args.slot} of {args.name}", [], [])
        return None
    _show(args, {"conflict": reply.conflict.group, "reason": reply.conflict.reason},
          f"{args.name}: not claimed: {reply.conflict.reason}", [], [])
    return REFUSED


def _release(args: argparse.Namespace, replicas: _Replicas, pb: Any) -> None:
    reply = replicas.call("Release", pb.ReleaseRequest(group=args.name, session=_session()))
    doc = {"released": args.name, "promoted": list(reply.promoted),
           "already_released": reply.already_released}
    title = f"{args.name} {'was released already' if reply.already_released else 'released'}"
    _show(args, doc, title, ["placed now (was preempting)"], [[g] for g in reply.promoted])


def _status(args: argparse.Namespace, replicas: _Replicas, pb: Any) -> None:
    if args.name:
        query = pb.QueryRequest(name=args.name, stale=args.stale, typed=True)
        group = replicas.call("GetGroup", query).group
        info = {**_doc(group.spec), **_doc(group, skip=("spec",))}
        rows = [[k, json.dumps(v)] for k, v in info.items() if k != "claims"]
        rows += [[f"claim {c['slot']}", f"{c['pod']} ({c['uid']})"] for c in info["claims"]]
        _show(args, info, f"group {args.name}", ["field", "value"], rows)
        return
    query = pb.QueryRequest(name=args.vc, stale=args.stale, typed=True)
    reply = replicas.call("ListAllocations", query)
    groups = [_doc(g) for g in reply.groups]
    rows = [[g["name"], g["vc"], str(g["priority"]), g["state"], str(g["token"]),
             str(g["leaves"])] for g in groups]
    _show(args, groups, f"{len(groups)} allocations (revision {reply.revision})",
          ["group", "vc", "priority", "state", "token", "GPUs"], rows)


def _vc(args: argparse.Namespace, replicas: _Replicas, pb: Any) -> None:
    info = _doc(replicas.call("GetVC", pb.QueryRequest(name=args.name, typed=True)).vc)
    rows = [[c["cell_type"], str(c["cells"]), str(c["used"]), str(c["free"]), str(c["bad"])]
            for c in info["cells"]]
    rows += [[f"pinned {p['id']} ({p['address']})", "1", str(int(p["used"])),
              str(1 - int(p["used"])), str(int(p["bad"]))] for p in info["pinned"]]
    leaves = info["leaves"]
    _show(args, info, f"{args.name}: {leaves['used']} of {leaves['total']} GPUs used",
          ["cell type", "cells", "used", "free", "bad"], rows)


def _summary(args: argparse.Namespace, replicas: _Replicas, pb: Any) -> None:
    info = _doc(replicas.call("GetSummary", pb.QueryRequest(typed=True)).summary)
    rows = [[c["name"], c["leaf_type"], str(c["leaves"]), str(c["free"]), str(c["guaranteed"]),
             str(c["opportunistic"]), str(c["bad"])] for c in info["chains"]]
    _show(args, info, f"{info['nodes']} nodes, {info['groups']} group(s) "
          f"({info['preempting']} preempting), {len(info['bad_nodes'])} bad node(s)",
          ["chain", "leaf type", "GPUs", "free", "guaranteed", "opportunistic", "bad"], rows)


def _watch(args: argparse.Namespace, replicas: _Replicas, pb: Any) -> int | None:
    import threading

    import grpc

    waited_out = threading.Event()

    def stop() -> None:  # closing the channels ends the stream (CANCELLED) where it waits
        waited_out.set()
        replicas.close()

    timer = threading.Timer(args.wait, stop) if args.wait is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    seen = 0
    try:
        for seen, event in enumerate(replicas.watch(args.since, args.now), start=1):
            if args.json:
                print(json.dumps({"revision": event.revision, "kind": event.kind,
                                  "subject": event.subject,
                                  "data": json.loads(event.data_json)}), flush=True)
            else:
                print(f"{event.revision:>8}  {event.kind:<11} {event.subject}", flush=True)
            if args.count and seen >= args.count:
                break
    except grpc.RpcError:
        if not waited_out.is_set():
            raise
    finally:
        if timer is not None:
            timer.cancel()
    if waited_out.is_set() and args.count and seen < args.count:
        print(f"sdpaxos ctl: {seen} of {args.count} events within {args.wait:g}s",
              file=sys.stderr)
        return REFUSED
    return None


def _node(args: argparse.Namespace, replicas: _Replicas, pb: Any) -> None:
    request = pb.NodeHealthRequest(node=args.name, healthy=args.healthy, session=_session())
    reply = replicas.call("SetNodeHealth", request)
    doc = {"node": args.name, "healthy": args.healthy, "changed": reply.changed,
           "cancelled": list(reply.cancelled)}
    if reply.warning:
        doc["warning"] = reply.warning
        print(f"sdpaxos ctl: warning: {reply.warning}", file=sys.stderr)
    _show(args, doc, f"{args.name} {'healthy' if args.healthy else 'bad'}"
          f"{'' if reply.changed else ' (unchanged)'}", ["cancelled preemptor"],
          [[g] for g in reply.cancelled])


def _inspect(args: argparse.Namespace, replicas: _Replicas, pb: Any) -> int | None:
    if args.kind != "physical" and not args.name:
        print(f"sdpaxos ctl: inspect {args.kind} needs a name", file=sys.stderr)
        return 2
    request = pb.InspectRequest(kind=args.kind, name=args.name, stale=args.stale, typed=True)
    reply = replicas.call("Inspect", request)
    info: Any = _doc(getattr(reply, reply.WhichOneof("tree")))
    if args.kind == "physical":
        info = info["chains"]
    if args.json:
        print(json.dumps(info))
        return None
    from rich.console import Console
    from rich.tree import Tree

    if args.kind == "group":
        rows = [[k, json.dumps(v)] for k, v in info.items()]
        _show(args, info, f"group {args.name}", ["field", "value"], rows)
        return None
    if args.kind == "vc":
        tree = Tree(f"virtual cluster {info['vc']}")
        for cell in info["cells"]:
            label = (f"{cell['address']} {cell['type']} (level {cell['level']}"
                     f"{', pinned ' + cell['pinned'] if cell['pinned'] else ''})"
                     f"{' doomed' if cell['doomed'] else ''}")
            branch = tree.add(label if cell["bound"] else label + " unbound")
            if cell["bound"]:
                _virtual_tree(branch, cell["physical"])
        Console().print(tree)
        return None
    tree = Tree("physical cluster")
    for chain in info:
        branch = tree.add(f"chain {chain['chain']}")
        for cell in chain["cells"]:
            _physical_tree(branch, cell)
    Console().print(tree)
    return None


def _physical_tree(parent: Any, cell: dict[str, Any]) -> None:
    label = (f"{cell['address']} {cell['type']} L{cell['level']} {cell['state']}"
             f" prio {cell['priority']}{'' if cell['healthy'] else ' BAD'}")
    if cell.get("partial"):
        label += " partial"
    if cell.get("vc"):
        label += f" = {cell['virtual']}{' doomed' if cell['doomed'] else ''}"
    if cell.get("group"):
        label += f" [{cell['group']}]"
    branch = parent.add(label)
    for child in cell.get("children", []):
        _physical_tree(branch, child)


def _virtual_tree(parent: Any, cell: dict[str, Any]) -> None:
    label = f"{cell['virtual']} = {cell['address']} prio {cell['priority']}"
    if not cell["healthy"]:
        label += " BAD"
    if cell.get("group"):
        label += f" [{cell['group']}]"
    branch = parent.add(label)
    for child in cell.get("children", []):
        _virtual_tree(branch, child)


def _config(args: argparse.Namespace, replicas: _Replicas, pb: Any) -> int | None:
    from pathlib import Path

    from cluster_state.config import parse_config
    from cluster_state.errors import GpuConfigError

    try:
        text = Path(args.file).read_text()
        parse_config(text)  # validated before anything is proposed
    except (OSError, GpuConfigError) as exc:
        print(f"sdpaxos ctl: {args.file}: {exc}", file=sys.stderr)
        return 1
    request = pb.ReconfigureRequest(config_yaml=text, dry_run=args.dry_run,
                                    session=None if args.dry_run else _session(), typed=True)
    reply = replicas.call("Reconfigure", request)
    report = _doc(reply, skip=("digest", "changed"))
    doc = {"digest": reply.digest, "changed": reply.changed, "dry_run": args.dry_run, **report}
    verb = "would run" if args.dry_run else "runs"
    if not reply.changed:
        title = f"the store already runs {args.file} ({reply.digest[:12]})"
    else:
        title = f"the store {verb} {args.file} ({reply.digest[:12]})"
    rows = []
    for group, entry in report.get("groups", {}).items():
        detail = entry.get("reason", "")
        if entry.get("moved_to"):
            detail = f"moved {entry['moved_from']} -> {entry['moved_to']}; {detail}".rstrip("; ")
        if entry.get("dropped"):
            detail = f"{len(entry['dropped'])} leaf cells dropped; {detail}".rstrip("; ")
        rows.append([group, entry["outcome"], detail])
    _show(args, doc, title, ["group", "outcome", "detail"], rows)
    return None


#: deprecated fields of the replies (JSON copies for older clients): never shown
_DEPRECATED = ("json", "data_json", "report_json")


def _doc(message: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A typed reply as the JSON ``--json`` prints: every field by name (defaults too), an
    unset sub-message as null, maps as objects (not protobuf's JSON mapping, which writes
    64-bit integers as strings)."""
    doc: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        if field.name in skip or field.name in _DEPRECATED:
            continue
        value = getattr(message, field.name)
        kind = field.message_type
        if kind is not None and kind.GetOptions().map_entry:
            wrapper = kind.fields_by_name["value"].message_type
            # a map to a one-field wrapper (node -> Devices) shows that field: node -> [...]
            only = wrapper.fields[0].name if wrapper and len(wrapper.fields) == 1 else None
            doc[field.name] = {k: list(getattr(v, only)) if only else _doc(v) if wrapper else v
                               for k, v in value.items()}
        elif field.is_repeated:
            doc[field.name] = [_doc(v) if kind is not None else v for v in value]
        elif kind is not None:
            doc[field.name] = _doc(value) if message.HasField(field.name) else None
        else:
            doc[field.name] = value
    return doc


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
