"""``sdpaxos serve`` (one replica), ``sdpaxos cluster init|up|down`` (a local cluster) and
``sdpaxos cert init|issue|revoke`` (a TLS cluster's certificates, ``consensus.runtime.tls``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from consensus.auth import ADMIN, ROLES, Principal
from consensus.config import SITES
from consensus.errors import ConfigError, DataDirInUse, MemberRemoved, SDPaxosError
from consensus.runtime.cluster_config import ClusterConfig
from consensus.runtime.exit_codes import REMOVED
from consensus.runtime.logs import DEFAULT_LEVEL, add_log_level_argument, configure_logging
from consensus.runtime.state_machines import InitChoice, kinds, state_machine_kind
from consensus.runtime.tls import TlsConfig
from consensus.statemachine import StateMachine
from consensus.storage.identity import open_identity

__all__ = [
    "add_cert_arguments",
    "add_cluster_arguments",
    "add_serve_arguments",
    "run_cert",
    "run_cluster",
    "run_serve",
]

CONFIG_NAME = "cluster.toml"
#: ``serve --initial-cluster-state`` (etcd's names)
NEW_CLUSTER = "new"
EXISTING_CLUSTER = "existing"
PIDS_NAME = "pids.json"
#: ``gc.set_threshold`` of a serving replica: it keeps many long-lived objects (its logs), and
#: full collections of them cost pauses of tens of ms, so young objects are collected as
#: usual and old ones rarely
SERVE_GC_THRESHOLDS = (50_000, 50, 1_000)
#: ``cluster init --tls``: where the certificates go (beside the cluster file) and the name of
#: the admin client certificate the cluster's tools present
TLS_DIR = "tls"
ADMIN_NAME = "admin"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="cluster TOML file")
    parser.add_argument("--id", type=int, required=True, help="this replica's id")
    parser.add_argument("--no-fsync", action="store_true", help="unsafe: skip fsync")
    parser.add_argument(
        "--initial-cluster-state", choices=(NEW_CLUSTER, EXISTING_CLUSTER),
        default=EXISTING_CLUSTER,
        help="'new': an empty data directory is a new cluster's replica (it gets an identity; "
        "for deployments without 'cluster init', e.g. containers with empty volumes); "
        "'existing' (default): an empty data directory is refused (a wiped replica must not "
        "rejoin as if it had not). Either way peers refuse a replica wiped after they met it",
    )  # fmt: skip
    add_log_level_argument(parser)
    parser.add_argument(
        "--no-wan-emulation",
        action="store_true",
        help="ignore the file's [wan] delays (the network delays packets itself, e.g. netem)",
    )
    parser.add_argument(
        "--fault-injection",
        action="store_true",
        help="test only: accept partition requests on the client port",
    )
    parser.add_argument(
        "--snapshot-every", type=_positive_int, default=None, metavar="COMMANDS",
        help="snapshot once this many commands were applied since the last snapshot "
        "(default: the node's own)",
    )  # fmt: skip
    parser.add_argument(
        "--snapshot-bytes", type=_positive_int, default=None, metavar="BYTES",
        help="snapshot once this many bytes went into the write-ahead log since the last "
        "snapshot (default: 256 MiB)",
    )  # fmt: skip
    parser.add_argument(
        "--snapshot-interval", type=_positive_int, default=None, metavar="SECONDS",
        help="snapshot at least this often while commands are applied (default: 600)",
    )  # fmt: skip


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def run_serve(args: argparse.Namespace) -> int:
    from consensus.runtime.cluster_config import load_cluster_config

    configure_logging(args.log_level)
    try:
        config = load_cluster_config(args.config)
        config.replica(args.id)
        machine = _state_machine(config)
    except ConfigError as exc:
        print(f"sdpaxos serve: {exc}", file=sys.stderr)
        return 2
    from consensus.runtime.dirlock import DataDirLock

    try:
        lock = DataDirLock(config.replica_dir(args.id))
    except DataDirInUse as exc:
        print(f"sdpaxos serve: {exc}", file=sys.stderr)
        return 1
    try:
        try:  # refused here, before anything else touches the directory
            open_identity(config.replica_dir(args.id), config.cluster_id, args.id,
                          bootstrap=args.initial_cluster_state == NEW_CLUSTER)
        except MemberRemoved as exc:
            print(f"sdpaxos serve: {exc}", file=sys.stderr)
            return REMOVED
        except ConfigError as exc:
            print(f"sdpaxos serve: {exc}", file=sys.stderr)
            return 2
        return _serve_locked(args, config, machine)
    finally:
        lock.release()


def _serve_locked(args: argparse.Namespace, config: ClusterConfig, machine: StateMachine) -> int:
    if args.no_wan_emulation:
        n = len(config.replicas)
        config = dataclasses.replace(config, one_way_us=tuple((0,) * n for _ in range(n)))
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    gc.set_threshold(*SERVE_GC_THRESHOLDS)
    try:
        asyncio.run(
            _serve(config, args.id, machine, fsync=not args.no_fsync, faults=args.fault_injection,
                   snapshot_every=args.snapshot_every, snapshot_bytes=args.snapshot_bytes,
                   snapshot_interval_s=args.snapshot_interval)
        )
    except MemberRemoved as exc:  # the node logged it as it happened
        logging.getLogger("sdpaxos").warning("replica %d stopped: %s", args.id, exc)
        return REMOVED
    except SDPaxosError as exc:
        logging.getLogger("sdpaxos").error("replica %d stopped: %s", args.id, exc)
        return 1
    return 0


def _state_machine(config: ClusterConfig) -> StateMachine:
    """The configured state machine, built by its kind (a bad file it names is a
    ConfigError)."""
    return state_machine_kind(config.state_machine).build(config)


async def _serve(
    config: ClusterConfig, me: int, machine: StateMachine, *, fsync: bool, faults: bool,
    snapshot_every: int | None = None, snapshot_bytes: int | None = None,
    snapshot_interval_s: float | None = None,
) -> None:
    from consensus.runtime.metrics import serve_metrics
    from consensus.runtime.node import (
        SNAPSHOT_EVERY,
        SNAPSHOT_INTERVAL_S,
        SNAPSHOT_LOG_BYTES,
        ReplicaNode,
    )

    log = logging.getLogger("sdpaxos.serve")
    # the node's default unless given (the restart bench turns snapshots off with a big one)
    every = SNAPSHOT_EVERY if snapshot_every is None else snapshot_every
    # Loading the log and executing it again allocate millions of objects that live on:
    # the collector's full passes over them took a third of a restart's time. Collect
    # nothing until then, and keep it all out of the collector's way afterwards (full
    # collections of it cost pauses in service too).
    gc.disable()
    node = ReplicaNode(
        config, me, machine, fsync=fsync, fault_injection=faults, snapshot_every=every,
        bootstrap=False,  # run_serve gave a new cluster's directory its identity
        snapshot_bytes=SNAPSHOT_LOG_BYTES if snapshot_bytes is None else snapshot_bytes,
        snapshot_interval_s=(
            SNAPSHOT_INTERVAL_S if snapshot_interval_s is None else snapshot_interval_s
        ),
    )
    metrics = None
    spec = config.replica(me)
    if spec.metrics_address is not None:  # answers while the log is executed again
        tls = config.tls
        metrics = await serve_metrics(
            node, *spec.metrics_address,
            tls=tls.server(me) if tls is not None and tls.metrics else None,
        )
    await node.start()
    gc.freeze()
    gc.enable()
    # what the state machine serves beside the replica (a gRPC service, say)
    service = await state_machine_kind(config.state_machine).serve(node, config, me)
    log.info("replica %d serving peers on %s:%d, clients on %s:%d", me, *spec.address,
             *spec.client_address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if config.tls is not None:  # the revocation list, read again without a restart
        loop.add_signal_handler(signal.SIGHUP, node.revocations.reload)
    failed = asyncio.create_task(node.wait_failed())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([failed, stopping], return_when=asyncio.FIRST_COMPLETED)
    log.info("replica %d shutting down", me)
    if metrics is not None:
        metrics.close()
    if service is not None:
        await service.stop()
    await node.stop()
    if failed.done():
        failed.result()  # re-raise: the process exits non-zero


# ---------------------------------------------------------------------------- cluster


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = actions.add_parser("init", help="write a ready-to-run local cluster config")
    add_init_options(init, cluster_id_default=DEFAULT_CLUSTER_ID)
    init.add_argument("--force", action="store_true",
                      help="overwrite the cluster file of an existing --dir (its replicas' "
                      "data stays: delete data/ yourself to start empty)")
    up = actions.add_parser("up", help="start the cluster in --dir as background processes")
    up.add_argument("--dir", required=True, help="the cluster's directory (of cluster init)")
    up.add_argument("--timeout", type=float, default=30.0,
                    help="seconds to wait for every replica to serve")
    up.add_argument("--snapshot-every", type=_positive_int, default=None, metavar="COMMANDS",
                    help="passed to every replica's serve")
    add_log_level_argument(up)  # the replicas' (their logs: replica-<id>.log in --dir)
    down = actions.add_parser("down", help="stop the processes started by 'up'")
    down.add_argument("--dir", required=True, help="the cluster's directory (of cluster up)")
    health = actions.add_parser("health", help="exit 0 if a replica serves linearizable reads")
    health.add_argument("--config", required=True, help="cluster TOML file")
    health.add_argument("--id", type=int, required=True, help="the replica to ask")
    health.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for its answer")
    health.add_argument("--probe", choices=("livez", "readyz"), default=None,
                        help="GET /livez or /readyz from the replica's metrics port instead of "
                        "a read (consensus.runtime.health)")
    netem = actions.add_parser(
        "netem", help="print (--apply: run) tc netem commands for a replica's WAN delays"
    )
    netem.add_argument("--config", required=True, help="cluster TOML file")
    netem.add_argument("--id", type=int, required=True, help="the replica whose delays these are")
    netem.add_argument("--device", default="eth0", help="the network interface to delay")
    netem.add_argument("--apply", action="store_true",
                       help="run the commands (as root) instead of printing them")


def add_init_options(parser: argparse.ArgumentParser, *, cluster_id_default: str | None) -> None:
    """The options of a new local cluster (``cluster init``, ``snapshot restore``)."""
    parser.add_argument("--replicas", type=int, choices=(3, 5), default=3,
                        help="how many replicas (sites CA, OR, OH, VA, JP in that order)")
    parser.add_argument("--dir", required=True, help="the cluster's directory")
    parser.add_argument("--base-port", type=int, default=7000,
                        help="replica i listens on base+i (peers), base+100+i (clients), "
                        "base+200+i (metrics), base+300+i (gRPC)")
    parser.add_argument("--no-wan", action="store_true", help="no emulated WAN delays")
    parser.add_argument("--cluster-id", default=cluster_id_default,
                        help="the cluster's id (peers and clients of another id are refused)"
                        + ("" if cluster_id_default else "; default: restored-<random>"))
    parser.add_argument("--tls", action="store_true",
                        help="mutual TLS 1.3 on every link: make a CA, a certificate per "
                        f"replica and an admin client certificate in {TLS_DIR}/")
    for kind in kinds().values():  # each installed state machine's own options
        kind.add_init_arguments(parser)


def init_cluster(args: argparse.Namespace, *, cluster_id: str) -> int:
    """``cluster init`` with ``args`` (``add_init_options``), never over an existing one."""
    return _init(Path(args.dir), args.replicas, args.base_port, wan=not args.no_wan, args=args,
                 force=False, tls=args.tls, cluster_id=cluster_id)


def run_cluster(args: argparse.Namespace) -> int:
    if args.action in ("health", "netem"):
        from consensus.runtime import cluster_ops

        if args.action == "health" and args.probe is not None:
            from consensus.runtime.health import run_probe

            return run_probe(args.config, args.id, args.probe, args.timeout)
        if args.action == "health":
            return cluster_ops.run_health(args.config, args.id, args.timeout)
        return cluster_ops.run_netem(args.config, args.id, args.device, args.apply)
    directory = Path(args.dir)
    if args.action == "init":
        return _init(directory, args.replicas, args.base_port, wan=not args.no_wan, args=args,
                     force=args.force, tls=args.tls, cluster_id=args.cluster_id)
    if args.action == "up":
        return _up(directory, args.timeout, args.snapshot_every, args.log_level)
    return _down(directory)


#: the cluster id ``cluster init`` gives a local cluster
DEFAULT_CLUSTER_ID = "local"


def cluster_toml(
    replicas: int, base_port: int, *, wan: bool, cluster_id: str = DEFAULT_CLUSTER_ID,
    state_machine: Mapping[str, str] | None = None, grpc: bool = False, tls: bool = False,
) -> str:
    """A loopback cluster file: replica i listens on base_port + i (peers), + 100 + i
    (clients), + 200 + i (metrics) and, with ``grpc``, + 300 + i (gRPC). ``state_machine``:
    the ``[state_machine]`` table (``kind`` and that kind's string-valued keys). ``tls``: a
    ``[tls]`` table and certificate files under ``tls/`` (``sdpaxos cert init`` makes them)."""
    lines = [f"cluster_id = {json.dumps(cluster_id)}", 'data_dir = "data"',
             "# the voters the cluster is initialized with (ids 0..N-1); members added later",
             "# get entries with joined = true, and a removed member's entry may be deleted",
             f"initial_replicas = {replicas}", ""]
    for i in range(replicas):
        lines += [
            "[[replica]]",
            f"id = {i}",
            f'address = "127.0.0.1:{base_port + i}"',
            f'client_address = "127.0.0.1:{base_port + 100 + i}"',
            f'metrics_address = "127.0.0.1:{base_port + 200 + i}"',
        ]
        if grpc:
            lines.append(f'grpc_address = "127.0.0.1:{base_port + 300 + i}"')
        if tls:
            lines += [f'tls_cert = "{TLS_DIR}/replica-{i}.pem"',
                      f'tls_key = "{TLS_DIR}/replica-{i}.key"']
        lines += [f'site = "{SITES[i]}"', ""]
    lines += ["[protocol]", "heartbeat_us = 50000", "election_timeout_us = 300000", ""]
    if wan:
        lines += ["[wan]", "emulate = true", ""]
    if tls:
        lines += ["[tls]", f'ca = "{TLS_DIR}/ca.pem"', f'ca_key = "{TLS_DIR}/ca.key"',
                  f'client_cert = "{TLS_DIR}/{ADMIN_NAME}.pem"',
                  f'client_key = "{TLS_DIR}/{ADMIN_NAME}.key"', "revoked = []", ""]
    if state_machine is not None:
        lines += ["[state_machine]",
                  *(f"{key} = {json.dumps(value)}" for key, value in state_machine.items()), ""]
    return "\n".join(lines)


def _init(directory: Path, replicas: int, base_port: int, *, wan: bool,
          args: argparse.Namespace, force: bool = False, tls: bool = False,
          cluster_id: str = DEFAULT_CLUSTER_ID) -> int:
    path = directory / CONFIG_NAME
    if path.exists() and not force:
        # rewriting it under a cluster's logs (5 replicas over 3 replicas' data, say) starts
        # replicas on state that is not theirs
        print(f"sdpaxos cluster init: {path} exists (a cluster was initialized there); "
              "choose another --dir, or --force to overwrite the cluster file",
              file=sys.stderr)
        return 1
    if _live_replicas(directory) and force:
        print(f"sdpaxos cluster init: the cluster in {directory} is up; run sdpaxos cluster "
              f"down --dir {directory} first", file=sys.stderr)
        return 1
    directory.mkdir(parents=True, exist_ok=True)
    chosen: tuple[str, InitChoice] | None = None
    for name, kind in kinds().items():  # argparse keeps the kinds' options apart
        try:
            choice = kind.init_choice(args, path)
        except ConfigError as exc:  # refused now rather than when the replicas start
            print(f"sdpaxos cluster init: {exc}", file=sys.stderr)
            return 2
        if choice is not None and chosen is not None:
            print(f"sdpaxos cluster init: options of two state machines ({chosen[0]} and "
                  f"{name}) given; choose one", file=sys.stderr)
            return 2
        if choice is not None:
            chosen = (name, choice)
    table = None if chosen is None else {"kind": chosen[0], **chosen[1].table}
    grpc = chosen is not None and chosen[1].grpc
    path.write_text(cluster_toml(replicas, base_port, wan=wan, state_machine=table, grpc=grpc,
                                 tls=tls, cluster_id=cluster_id))
    print(f"wrote {path} ({replicas} replicas at {', '.join(SITES[:replicas])})")
    try:
        init_identities(path)
    except ConfigError as exc:  # --force over another cluster's data
        print(f"sdpaxos cluster init: {exc}", file=sys.stderr)
        return 2
    if tls:
        try:
            _cert_init(path, force=force)
        except ConfigError as exc:
            print(f"sdpaxos cluster init: {exc}", file=sys.stderr)
            return 1
    if chosen is not None and chosen[1].hint:
        print(chosen[1].hint)
    return 0


def init_identities(path: Path) -> None:
    """Give every replica of the cluster file ``path`` its identity in its data directory
    (one that has one keeps it; ``ConfigError`` if it belongs to another cluster or replica)."""
    from consensus.runtime.cluster_config import load_cluster_config

    config = load_cluster_config(path)
    for spec in config.replicas:
        with contextlib.suppress(MemberRemoved):  # removed: it keeps its (removed) identity
            open_identity(config.replica_dir(spec.id), config.cluster_id, spec.id,
                          bootstrap=True)


def _up(
    directory: Path, timeout: float, snapshot_every: int | None = None,
    log_level: str = DEFAULT_LEVEL,
) -> int:
    from consensus.runtime.cluster_config import load_cluster_config

    path = directory / CONFIG_NAME
    try:
        config = load_cluster_config(path)
    except ConfigError as exc:
        print(f"sdpaxos cluster up: {exc}", file=sys.stderr)
        return 2
    running = _live_replicas(directory)
    if running:
        print(f"sdpaxos cluster up: the cluster in {directory} is already up (pids "
              f"{sorted(running)}); run sdpaxos cluster down --dir {directory} first",
              file=sys.stderr)
        return 1
    pids: dict[str, int] = {}
    processes: list[subprocess.Popen[bytes]] = []
    extra = [] if snapshot_every is None else ["--snapshot-every", str(snapshot_every)]
    extra += ["--log-level", log_level]
    for spec in config.replicas:
        log_file = open(directory / f"replica-{spec.id}.log", "ab")  # noqa: SIM115
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.cli", "serve", "--config", str(path.resolve()), "--id",
             str(spec.id), *extra],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        pids[str(spec.id)] = process.pid
        processes.append(process)
    (directory / PIDS_NAME).write_text(json.dumps(pids))
    addresses = [spec.client_address for spec in config.replicas]
    try:
        tls = config.tls.tool() if config.tls is not None else None
    except ConfigError as exc:
        print(f"sdpaxos cluster up: {exc}", file=sys.stderr)
        _down(directory)
        return 2
    serving = asyncio.run(_wait_serving(addresses, timeout, processes, tls))
    exited = [(spec.id, p.returncode) for spec, p in zip(config.replicas, processes, strict=True)
              if p.poll() is not None]
    if serving and not exited:
        print(f"cluster up: {len(pids)} replicas serving (pids {sorted(pids.values())})")
        return 0
    # Serving addresses prove nothing about our processes (another cluster may hold them):
    # a replica that exited is a failure, whoever answers.
    for replica, code in exited:
        print(f"cluster up: replica {replica} exited with status {code}; see "
              f"{directory / f'replica-{replica}.log'}", file=sys.stderr)
    if not exited:
        print("cluster up: replicas did not start serving in time; see the replica logs",
              file=sys.stderr)
    _down(directory)
    return 1


async def _wait_serving(
    addresses: list[tuple[str, int]], timeout: float,
    processes: Sequence[subprocess.Popen[bytes]] = (), tls: ssl.SSLContext | None = None,
) -> bool:
    """Every address answers a linearizable read within ``timeout``; False as soon as one of
    ``processes`` exits. ``tls``: the cluster's tools' context (a TLS cluster)."""
    from consensus.runtime.client import Client
    from consensus.statemachine import kv_get

    deadline = time.monotonic() + timeout
    for replica, _ in enumerate(addresses):
        while time.monotonic() < deadline:
            if any(process.poll() is not None for process in processes):
                return False
            client = Client(1 << 40, addresses, home=replica, timeout_s=1.0, attempts=1,
                            tls=tls)
            try:
                await client.read(kv_get("__probe__"), ("__probe__",))
                break
            except SDPaxosError:
                await asyncio.sleep(0.2)
            finally:
                await client.close()
        else:
            return False
    return True


def _down(directory: Path) -> int:
    path = directory / PIDS_NAME
    if not path.exists():
        print(f"cluster down: no {PIDS_NAME} in {directory}", file=sys.stderr)
        return 1
    listed = [int(pid) for pid in json.loads(path.read_text()).values()]
    pids = [pid for pid in listed if _is_replica_of(pid, directory)]
    for pid in sorted(set(listed) - set(pids)):
        # exited meanwhile, or its pid now belongs to another process: not ours to signal
        print(f"cluster down: pid {pid} is not a running replica of this cluster; left alone")
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for pid in pids:
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    path.unlink()
    print(f"cluster down: stopped {len(pids)} replicas")
    return 0


def _live_replicas(directory: Path) -> list[int]:
    """The pids in the directory's pid file that are running replicas of its cluster."""
    path = directory / PIDS_NAME
    if not path.exists():
        return []
    try:
        listed = [int(pid) for pid in json.loads(path.read_text()).values()]
    except (ValueError, TypeError, AttributeError):
        return []
    return [pid for pid in listed if _is_replica_of(pid, directory)]


def _is_replica_of(pid: int, directory: Path) -> bool:
    """``pid`` runs ``sdpaxos serve`` on this directory's cluster file (what ``up``
    started), judged by its command line."""
    if not _alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    config = str((directory / CONFIG_NAME).resolve()).encode()
    return b"serve" in argv and config in argv


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------------------- cert


def add_cert_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = actions.add_parser(
        "init", help="make the CA, every replica's and the admin's certificates named in a "
        "cluster file's [tls] table (cluster init --tls does it for you)")
    init.add_argument("--config", required=True, help="cluster TOML file")
    init.add_argument("--force", action="store_true", help="replace existing files (a new CA: "
                      "every certificate it issued stops working)")
    init.add_argument("--exist-ok", action="store_true",
                      help="succeed without a change when every file exists already (an init "
                      "step run at every start, as the compose demo's)")
    issue = actions.add_parser("issue", help="issue a client certificate with the cluster's CA")
    issue.add_argument("--config", required=True, help="cluster TOML file (its [tls] ca_key)")
    issue.add_argument("--client", required=True, metavar="NAME",
                       help="the client's name (its certificate's principal)")
    issue.add_argument("--role", required=True, choices=ROLES, help="what the client may do")
    issue.add_argument("--vcs", metavar="VC1,VC2", help="a scheduler's virtual clusters")
    issue.add_argument("--out", metavar="DIR",
                       help="where NAME.pem and NAME.key go (default: beside the CA)")
    revoke = actions.add_parser(
        "revoke", help="add a certificate's serial to the cluster file's revocation list "
        "(replicas read it again on SIGHUP)")
    revoke.add_argument("--config", required=True, help="cluster TOML file")
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--serial", help="hex serial number")
    which.add_argument("--cert", help="the certificate file (PEM)")


def run_cert(args: argparse.Namespace) -> int:
    try:
        if args.action == "init":
            return _cert_init(Path(args.config), force=args.force, exist_ok=args.exist_ok)
        if args.action == "issue":
            return _cert_issue(Path(args.config), args.client, args.role, args.vcs, args.out)
        return _cert_revoke(Path(args.config), args.serial, args.cert)
    except ConfigError as exc:
        print(f"sdpaxos cert {args.action}: {exc}", file=sys.stderr)
        return 2


def _tls_of(path: Path) -> tuple[ClusterConfig, TlsConfig]:
    from consensus.runtime.cluster_config import load_cluster_config

    config = load_cluster_config(path)
    if config.tls is None:
        raise ConfigError(f"{path} has no [tls] table")
    return config, config.tls


def _cert_init(path: Path, *, force: bool = False, exist_ok: bool = False) -> int:
    """The CA, every replica's certificate and the admin's, where ``[tls]`` names them."""
    from consensus.runtime import tls as tlsmod

    config, tls = _tls_of(path)
    if tls.ca_key is None:
        raise ConfigError(f"{path}: [tls].ca_key is needed to make the CA")
    files = [tls.ca, tls.ca_key, *(f for r in tls.replicas.values() for f in (r.cert, r.key))]
    if tls.client is not None:
        files += [tls.client.cert, tls.client.key]
    existing = [str(f) for f in files if f.exists()]
    if exist_ok and not force and len(existing) == len(files):
        print(f"the certificates of {path} exist; kept")
        return 0
    if existing and not force:
        raise ConfigError(f"{', '.join(existing)} exist; --force replaces them (with a new CA)")
    ca = tlsmod.make_ca(config.cluster_id)
    ca.write(tlsmod.TlsFiles(tls.ca, tls.ca_key))
    for spec in config.replicas:
        files_of = tls.replicas[spec.id]
        hosts = {spec.address[0], spec.client_address[0]}
        hosts |= {a[0] for a in (spec.metrics_address, spec.grpc_address) if a is not None}
        tlsmod.issue_replica(ca, config.cluster_id, spec.id, hosts).write(files_of)
    made = f"a CA and {len(tls.replicas)} replica certificates"
    if tls.client is not None:
        admin = Principal(ADMIN_NAME, ADMIN)
        tlsmod.issue_client(ca, config.cluster_id, admin).write(tls.client)
        made += f" and the {ADMIN_NAME} client certificate"
    print(f"made {made} in {tls.ca.parent} (private keys mode 0600)")
    return 0


def _cert_issue(path: Path, name: str, role: str, vcs: str | None, out: str | None) -> int:
    from consensus.runtime import tls as tlsmod

    config, tls = _tls_of(path)
    principal = tlsmod.parse_principal_args(name, role, vcs)
    if tls.ca_key is None:
        raise ConfigError(f"{path}: [tls].ca_key names no CA key to issue with")
    ca = tlsmod.load_ca(tls.ca, tls.ca_key)
    directory = Path(out) if out is not None else tls.ca.parent
    if "/" in name or name.startswith("."):
        raise ConfigError(f"client name {name!r} cannot name a file")
    files = tlsmod.TlsFiles(directory / f"{name}.pem", directory / f"{name}.key")
    issued = tlsmod.issue_client(ca, config.cluster_id, principal)
    issued.write(files)
    print(f"issued {files.cert} and {files.key} for {principal.describe()}, serial "
          f"{issued.cert.serial_number:x}")
    return 0


def _cert_revoke(path: Path, serial_text: str | None, cert: str | None) -> int:
    """Add a serial to ``[tls] revoked`` (the line ``cluster init --tls`` writes)."""
    import re
    import tomllib

    from consensus.runtime.tls import parse_revoked, serial_of_pem

    _, tls = _tls_of(path)
    if cert is not None:
        try:
            serial = serial_of_pem(Path(cert).read_bytes())
        except OSError as exc:
            raise ConfigError(f"{cert}: cannot read: {exc.strerror}") from None
    else:
        assert serial_text is not None
        serial = next(iter(parse_revoked([serial_text], "--serial")))
    if serial in tls.revoked:
        print(f"serial {serial:x} is already revoked")
        return 0
    text = path.read_text()
    serials = [f'"{s:x}"' for s in sorted(tls.revoked | {serial})]
    line = re.compile(r"^revoked\s*=\s*\[[^\]]*\]", re.MULTILINE)
    new_text, count = line.subn(f"revoked = [{', '.join(serials)}]", text)
    if count == 0:
        new_text = text.replace("[tls]\n", f"[tls]\nrevoked = [{', '.join(serials)}]\n", 1)
    check = tomllib.loads(new_text).get("tls", {})
    if serial not in parse_revoked(check.get("revoked", []), str(path)):
        raise ConfigError(f"{path}: could not add the serial to [tls] revoked; edit it yourself")
    path.write_text(new_text)
    print(f"revoked serial {serial:x} in {path}; send SIGHUP to the replicas to apply it")
    return 0
