"""``sdpaxos serve`` (one replica), ``sdpaxos cluster init|up|down|restart`` (a local cluster:
``consensus.runtime.new_cluster`` writes one, ``consensus.runtime.replica_processes`` runs
it) and ``sdpaxos cert init|issue|revoke`` (a TLS cluster's certificates,
``consensus.runtime.tls``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from consensus.auth import ADMIN, ROLES, Principal
from consensus.config import SITES
from consensus.errors import ConfigError, DataDirInUse, MemberRemoved, SDPaxosError
from consensus.gc_freeze import freeze
from consensus.runtime.cluster_config import ClusterConfig
from consensus.runtime.exit_codes import REFUSED, REMOVED, USAGE
from consensus.runtime.logs import add_log_level_argument, configure_logging
from consensus.runtime.new_cluster import CONFIG_NAME, init_identities
from consensus.runtime.state_machines import InitChoice, kinds, state_machine_kind
from consensus.runtime.tls import TlsConfig
from consensus.statemachine import StateMachine
from consensus.storage.identity import open_identity
from consensus.storage.wal import emulate_slow_disk

__all__ = [
    "CONFIG_NAME",
    "add_cert_arguments",
    "add_cluster_arguments",
    "add_serve_arguments",
    "check_ports",
    "chosen_kind",
    "cluster_toml",
    "init_cluster",
    "init_identities",
    "make_certificates",
    "milliseconds_arg",
    "run_cert",
    "run_cluster",
    "run_serve",
    "write_cluster",
]

#: ``serve --initial-cluster-state`` (etcd's names)
NEW_CLUSTER = "new"
EXISTING_CLUSTER = "existing"
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
        "--emulate-fsync-ms", type=milliseconds_arg, default=0.0, metavar="MS",
        help="benchmarks only: every log fsync takes this much longer (a slower disk than "
        "this machine's, as [wan] emulates a slower network)",
    )  # fmt: skip
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


def milliseconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1000:
        raise argparse.ArgumentTypeError(f"expected milliseconds in [0, 1000), got {text!r}")
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
    from consensus.runtime.native_logs import capture_native_stderr

    capture_native_stderr()  # gRPC's C core logs JSON lines too
    if args.no_wan_emulation:
        n = len(config.replicas)
        config = dataclasses.replace(config, one_way_us=tuple((0,) * n for _ in range(n)))
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    gc.set_threshold(*SERVE_GC_THRESHOLDS)
    if args.emulate_fsync_ms:
        emulate_slow_disk(args.emulate_fsync_ms / 1000)
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
    except OSError as exc:  # a port taken, say: one JSON record (its traceback inside), exit 1
        logging.getLogger("sdpaxos").error("replica %d stopped: %s", args.id, exc,
                                           exc_info=exc)
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
    freeze()  # (remembered: a snapshot's restore later freezes what it built, never asking)
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
        await metrics.stop()
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
    up = actions.add_parser(
        "up", help="start what is missing of the cluster in --dir: every member of its log "
        "(asked of a running replica; none running: the cluster file's replicas) that has "
        "no process serving its data directory")
    restart = actions.add_parser(
        "restart", help="stop and start the cluster's replicas one at a time, each once the "
        "previous one serves again (or only --id)")
    for action in (up, restart):
        action.add_argument("--dir", required=True,
                            help="the cluster's directory (of cluster init)")
        action.add_argument("--id", type=int, default=None,
                            help="only this replica (up: if it does not run)")
        action.add_argument("--timeout", type=float, default=30.0,
                            help="seconds to wait for each replica started to serve")
        action.add_argument("--snapshot-every", type=_positive_int, default=None,
                            metavar="COMMANDS", help="passed to every replica's serve")
        add_log_level_argument(action)  # the replicas' (their logs: replica-<id>.log in --dir)
    down = actions.add_parser(
        "down", help="stop every replica process serving the cluster's data directories, "
        "however it was started (or only --id)")
    down.add_argument("--dir", required=True, help="the cluster's directory")
    down.add_argument("--id", type=int, default=None, help="only this replica")
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
        return init_cluster(args, cluster_id=args.cluster_id, force=args.force)
    from consensus.runtime import replica_processes

    if args.action == "down":
        return replica_processes.down(directory, args.id)
    extra = [] if args.snapshot_every is None else ["--snapshot-every", str(args.snapshot_every)]
    extra += ["--log-level", args.log_level]
    if args.action == "up":
        return replica_processes.up(directory, args.id, args.timeout, extra)
    return replica_processes.restart(directory, args.id, args.timeout, extra)


#: the cluster id ``cluster init`` gives a local cluster
DEFAULT_CLUSTER_ID = "local"
#: the offsets of a replica's ports from ``--base-port`` (peers, clients, metrics, gRPC)
PORT_OFFSETS = (0, 100, 200, 300)


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


def check_ports(replicas: int, base_port: int) -> None:
    """``ConfigError`` unless every port of ``replicas`` replicas from ``base_port`` is one
    (``PORT_OFFSETS``)."""
    from consensus.runtime.cluster_config import PORTS

    low, high = base_port, base_port + PORT_OFFSETS[-1] + replicas - 1
    if low not in PORTS or high not in PORTS:
        raise ConfigError(
            f"--base-port {base_port}: the replicas would listen on ports {low}..{high} "
            f"(base+0..base+{PORT_OFFSETS[-1] + replicas - 1}); ports are "
            f"{PORTS.start}..{PORTS.stop - 1}")


def chosen_kind(args: argparse.Namespace, cluster_file: Path) -> tuple[str, InitChoice] | None:
    """The state machine the ``init`` options chose, and what it writes (None: none chose
    one, the built-in default); ``ConfigError`` for bad options or files they name."""
    chosen: tuple[str, InitChoice] | None = None
    for name, kind in kinds().items():  # argparse keeps the kinds' options apart
        choice = kind.init_choice(args, cluster_file)
        if choice is not None and chosen is not None:
            raise ConfigError(f"options of two state machines ({chosen[0]} and {name}) given; "
                              "choose one")
        if choice is not None:
            chosen = (name, choice)
    return chosen


def init_cluster(args: argparse.Namespace, *, cluster_id: str, force: bool = False) -> int:
    """``cluster init`` with ``args`` (``add_init_options``): everything checked, then
    written at once (``consensus.runtime.new_cluster``)."""
    from consensus.runtime.cluster_config import load_cluster_config
    from consensus.runtime.replica_processes import running

    directory = Path(args.dir)
    path = directory / CONFIG_NAME
    if path.exists() and not force:
        # rewriting it under a cluster's logs (5 replicas over 3 replicas' data, say) starts
        # replicas on state that is not theirs
        print(f"sdpaxos cluster init: {path} exists (a cluster was initialized there); "
              "choose another --dir, or --force to overwrite the cluster file",
              file=sys.stderr)
        return 1
    if path.exists():
        with contextlib.suppress(ConfigError):
            if running(load_cluster_config(path)):
                print(f"sdpaxos cluster init: the cluster in {directory} is up; run sdpaxos "
                      f"cluster down --dir {directory} first", file=sys.stderr)
                return 1
    try:
        check_ports(args.replicas, args.base_port)
        chosen = chosen_kind(args, path)
    except ConfigError as exc:  # refused now rather than when the replicas start
        print(f"sdpaxos cluster init: {exc}", file=sys.stderr)
        return 2
    return write_cluster(args, cluster_id, chosen, force=force)


def write_cluster(
    args: argparse.Namespace, cluster_id: str, chosen: tuple[str, InitChoice] | None, *,
    force: bool = False, seed: Callable[[ClusterConfig], None] | None = None,
    verb: str = "cluster init",
) -> int:
    """Write the cluster of ``args`` serving ``chosen`` (and its ``seed``) all at once; what
    was written on stdout, or why nothing was (exit 2 for what is in the way: another
    cluster's data, a file of the same name; 1 for a failed write)."""
    from consensus.runtime.new_cluster import write_new_cluster

    directory = Path(args.dir)
    table = None if chosen is None else {"kind": chosen[0], **chosen[1].table}
    text = cluster_toml(args.replicas, args.base_port, wan=not args.no_wan,
                        state_machine=table, grpc=chosen is not None and chosen[1].grpc,
                        tls=args.tls, cluster_id=cluster_id)
    try:
        written = write_new_cluster(
            directory, text, {} if chosen is None else chosen[1].files, force=force, seed=seed,
            certificates=(lambda path: make_certificates(path, force=True)) if args.tls
            else None,
        )
    except (ConfigError, OSError) as exc:  # what is in the way, or the disk
        print(f"sdpaxos {verb}: {exc}; nothing was written", file=sys.stderr)
        return USAGE if isinstance(exc, ConfigError) else REFUSED
    written[0] += f" ({args.replicas} replicas at {', '.join(SITES[:args.replicas])})"
    print("\n".join(written))
    if chosen is not None and chosen[1].hint:
        print(chosen[1].hint)
    return 0


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
    print(make_certificates(path, force=force, exist_ok=exist_ok))
    return 0


def make_certificates(path: Path, *, force: bool = False, exist_ok: bool = False) -> str:
    """Make the CA, every replica's certificate and the admin's, where the ``[tls]`` table of
    the cluster file ``path`` names them; what was made (``ConfigError`` if they exist,
    unless ``force`` or, all of them, ``exist_ok``)."""
    from consensus.runtime import tls as tlsmod

    config, tls = _tls_of(path)
    if tls.ca_key is None:
        raise ConfigError(f"{path}: [tls].ca_key is needed to make the CA")
    files = [tls.ca, tls.ca_key, *(f for r in tls.replicas.values() for f in (r.cert, r.key))]
    if tls.client is not None:
        files += [tls.client.cert, tls.client.key]
    existing = [str(f) for f in files if f.exists()]
    if exist_ok and not force and len(existing) == len(files):
        return f"the certificates of {path} exist; kept"
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
    return f"made {made} in {tls.ca.parent} (private keys mode 0600)"


def _cert_issue(path: Path, name: str, role: str, vcs: str | None, out: str | None) -> int:
    from consensus.runtime import tls as tlsmod

    config, tls = _tls_of(path)
    principal = tlsmod.parse_principal_args(name, role, vcs)
    state_machine_kind(config.state_machine).check_principal(principal, config)
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
