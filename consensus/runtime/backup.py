"""``sdpaxos snapshot save | restore | status``: back up a live cluster, seed a new one from a
backup, say what a backup holds.

``save FILE --config C [--id N]`` (or ``--endpoints``, or ``$SDPAXOS_CONFIG`` /
``$SDPAXOS_ENDPOINTS``: ``consensus.runtime.client_options``) asks one replica (``--id``, else
the first that answers) for a consistent snapshot: the replica runs a linearizable read barrier
through the sequencer, so the snapshot holds every write acknowledged before the request, then
snapshots its state machine at the position it reached (the log position is in the file) and
hands it over in chunks (``Client.backup``; a TLS cluster's tool presents the admin
certificate, and only an admin may take one). The file (``consensus.storage.backup``) carries
the source cluster's id and state machine kind, the position, and a sha256 of the snapshot; it
is written atomically (temp file, fsync, rename).

``restore FILE --dir D`` checks the file, writes a new cluster in ``D`` as ``sdpaxos cluster
init`` does (same options; a new cluster id, ``restored-<random>`` unless ``--cluster-id``:
peers and clients of the old cluster are refused by the new one), and seeds every replica with
the snapshot as its state at the backup's position in the new log (so revisions and fencing
tokens go on above the backup's). ``sdpaxos cluster up --dir D`` then serves it. The new
cluster runs the backup's state machine kind on the configuration the backup holds (a GPU
store's is written out beside the cluster file: ``StateMachineKind.seed``).
The kind's ``init`` options (``--gpu-config FILE``) choose another configuration: the backup's
state is moved to it before it is seeded, as ``sdpaxos ctl config apply`` would move it, and
the same report is printed; a move that drops, trims or downgrades a group (or cancels a
reservation) is refused unless
``--allow-drop``. Everything is checked before anything is written, and the new cluster is
written at once (``consensus.runtime.new_cluster``): a restore that fails leaves nothing.

``status FILE [--json]`` checks the file and prints what ``etcdutl snapshot status`` does (its
sha256, log position and size) and what it is: its state machine kind, the source cluster's
id and size, when it was taken, and the kind's own account (``describe_state``: a GPU store's
configuration, revision, groups and GPUs in use; a key-value store's keys).

Exit codes (``consensus.runtime.exit_codes``): 0 done; 1 a definite refusal (permission
denied, a damaged file, ``D`` already holds a cluster, a configuration that would drop work);
2 usage (a bad option, an unreadable cluster file, no endpoint, a kind not installed); 3
unavailable (no replica answered).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import ssl
import sys
from datetime import UTC, datetime
from pathlib import Path

from consensus.errors import (
    ConfigError,
    DecodeError,
    IndefiniteFailure,
    SDPaxosError,
    TlsRefused,
)
from consensus.protocol.types import SnapshotMeta
from consensus.runtime.cluster_config import ClusterConfig
from consensus.runtime.exit_codes import OK, REFUSED, TLS_REFUSED, UNAVAILABLE, USAGE
from consensus.runtime.state_machines import state_machine_kind
from consensus.storage.backup import decode_backup, encode_backup
from consensus.storage.snapshot import encode_snapshot, write_snapshot

__all__ = ["add_snapshot_arguments", "run_snapshot"]

#: the client id the backup tool uses (a read barrier opens no session)
BACKUP_CLIENT_ID = 1 << 43


#: default seconds per request of ``save`` to a replica
SAVE_TIMEOUT_S = 10.0


def add_snapshot_arguments(parser: argparse.ArgumentParser) -> None:
    from consensus.runtime.cli import add_init_options
    from consensus.runtime.client_options import add_client_options

    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    save = actions.add_parser("save", help="back up a live cluster into FILE")
    save.add_argument("file", metavar="FILE", help="where to write the backup")
    add_client_options(save, timeout_s=SAVE_TIMEOUT_S, json_output=False)
    save.add_argument("--id", type=int, default=None,
                      help="with --config: ask this replica (default: the first of the file "
                      "that answers)")
    restore = actions.add_parser(
        "restore", help="seed a new cluster in --dir from FILE, on the state machine and "
        "configuration FILE holds (or another configuration, given as cluster init takes it)")
    restore.add_argument("file", metavar="FILE", help="a backup written by snapshot save")
    add_init_options(restore, cluster_id_default=None)
    restore.add_argument(
        "--allow-drop", action="store_true",
        help="restore even when the configuration given takes GPUs from groups of the "
        "backup (GPUs, a VC's guarantee, a reservation: the report names them)")
    status = actions.add_parser(
        "status", help="check FILE and print what it holds: sha256, log position, size, "
        "state machine, source cluster, configuration and counts")
    status.add_argument("file", metavar="FILE", help="a backup written by snapshot save")
    status.add_argument("--json", action="store_true", help="print one JSON object")


def run_snapshot(args: argparse.Namespace) -> int:
    if args.action == "save":
        return _save(Path(args.file), args, args.id, args.timeout)
    if args.action == "status":
        return _status(Path(args.file), args.json)
    return _restore(Path(args.file), args)


def _save(path: Path, args: argparse.Namespace, me: int | None, timeout_s: float) -> int:
    from consensus.runtime.client import Client
    from consensus.runtime.client_options import native_target, tool_client

    try:
        target = native_target(args)
        addresses = target.addresses
        if me is not None:
            if target.config is None:
                raise ConfigError("--id names a replica of --config: give the cluster file")
            addresses = [target.config.replica(me).client_address]
    except ConfigError as exc:
        print(f"sdpaxos snapshot save: {exc}", file=sys.stderr)
        return USAGE

    async def take() -> tuple[bytes, str, str, int]:
        """The snapshot, and the cluster's id, state machine and size (from the cluster file,
        else from the status of the first replica that answers)."""
        # one replica asked by --id; else the current members (``Client.sync``)
        client = (Client(BACKUP_CLIENT_ID, addresses, timeout_s=timeout_s, attempts=1,
                         tls=target.tls) if me is not None
                  else tool_client(target, BACKUP_CLIENT_ID, timeout_s))
        try:
            if target.config is not None:
                config = target.config
                about = (config.cluster_id, config.state_machine, len(config.replicas))
            else:
                about = await _cluster_of(addresses, timeout_s, target.tls)
            return (await client.backup(), *about)
        finally:
            await client.close()

    try:
        snapshot, cluster_id, state_machine, replicas = asyncio.run(take())
        data = encode_backup(
            cluster_id=cluster_id, state_machine=state_machine, replicas=replicas,
            snapshot=snapshot, taken_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        header, _, _ = decode_backup(data)
        _write_atomically(path, data)
    except (IndefiniteFailure, ConnectionError, TimeoutError) as exc:
        print(f"sdpaxos snapshot save: unavailable: {exc}", file=sys.stderr)
        return UNAVAILABLE
    except TlsRefused as exc:
        print(f"sdpaxos snapshot save: refused: {exc}", file=sys.stderr)
        return TLS_REFUSED
    except (SDPaxosError, DecodeError, OSError) as exc:
        print(f"sdpaxos snapshot save: {exc}", file=sys.stderr)
        return REFUSED
    print(f"wrote {path}: {state_machine} state of cluster {cluster_id!r} at log "
          f"position {header.slot}, {len(data)} bytes, sha256 {header.sha256[:16]}…")
    return OK


async def _cluster_of(
    addresses: list[tuple[str, int]], timeout_s: float, tls: ssl.SSLContext | None
) -> tuple[str, str, int]:
    """(cluster id, state machine, replicas) from the first replica's status that answers."""
    from consensus.runtime.client import Client

    last: BaseException | None = None
    for address in addresses:
        try:
            async with Client(BACKUP_CLIENT_ID, [address], timeout_s=timeout_s, attempts=1,
                              tls=tls) as client, asyncio.timeout(timeout_s):
                status = await client.status()
            return (str(status["cluster_id"]), str(status["state_machine"]),
                    len(status["members"]))
        except (OSError, ConnectionError, TimeoutError) as exc:
            last = exc
        except (KeyError, TypeError) as exc:
            raise DecodeError(f"a replica's status lacks {exc}") from None
    raise IndefiniteFailure(f"no replica told the cluster's id: {last}")


def _restore(path: Path, args: argparse.Namespace) -> int:
    from consensus.runtime.cli import CONFIG_NAME, check_ports, chosen_kind, write_cluster

    try:
        header, _, state = decode_backup(path.read_bytes())
    except (OSError, DecodeError) as exc:
        print(f"sdpaxos snapshot restore: {path}: {exc}", file=sys.stderr)
        return REFUSED
    cluster_id = args.cluster_id or f"restored-{secrets.token_hex(4)}"
    directory = Path(args.dir)
    cluster_file = directory / CONFIG_NAME
    try:
        if cluster_id == header.cluster_id:
            raise ConfigError(f"the new cluster needs an id of its own, not the backed-up "
                              f"cluster's ({cluster_id!r})")
        kind = state_machine_kind(header.state_machine)
        check_ports(args.replicas, args.base_port)
        chosen = chosen_kind(args, cluster_file)
        if chosen is not None and chosen[0] != kind.name:
            raise ConfigError(f"the backup holds a {kind.name!r} state machine; the options "
                              f"given are {chosen[0]!r}'s (without them the new cluster "
                              "runs the backup's own configuration)")
    except ConfigError as exc:
        print(f"sdpaxos snapshot restore: {exc}", file=sys.stderr)
        return USAGE
    held = [p for p in (cluster_file, directory / "data") if p.exists()]
    if held:
        print(f"sdpaxos snapshot restore: {directory} already holds a cluster ("
              f"{', '.join(str(p) for p in held)}): restore into a new directory",
              file=sys.stderr)
        return REFUSED
    try:
        seed = kind.seed(state, None if chosen is None else chosen[1], cluster_file)
    except ConfigError as exc:
        print(f"sdpaxos snapshot restore: {exc}", file=sys.stderr)
        return REFUSED
    if seed.changes:
        print("the backup's state, moved to the configuration given (as sdpaxos ctl config "
              "apply would move it):\n  " + "\n  ".join(seed.changes))
    if seed.losses and not args.allow_drop:
        print(f"sdpaxos snapshot restore: refused: the configuration given would take GPUs "
              f"or guarantees from {len(seed.losses)} group(s) of the backup:\n  "
              + "\n  ".join(seed.losses)
              + "\nrestore without the configuration options to keep the backup's own, or "
              "pass --allow-drop to lose them; nothing was written", file=sys.stderr)
        return REFUSED
    if seed.losses:
        print(f"--allow-drop: {len(seed.losses)} group(s) lose GPUs or guarantees:\n  "
              + "\n  ".join(seed.losses))

    def plant(config: ClusterConfig) -> None:
        """Every replica's first snapshot: the seed, at the backup's log position, so the
        new log goes on from there (revisions and fencing tokens stay above the backup's:
        seeded at slot 0, the restored store handed out tokens again that its groups held)."""
        meta = SnapshotMeta(header.slot, (0,) * len(config.replicas))
        snapshot = encode_snapshot(meta, seed.state)
        for spec in config.replicas:
            write_snapshot(config.replica_dir(spec.id) / "snapshots", snapshot, header.slot)

    code = write_cluster(args, cluster_id, (kind.name, seed.choice), seed=plant,
                         verb="snapshot restore")
    if code != OK:
        return code
    print(f"seeded {args.replicas} replicas of cluster {cluster_id!r} in {directory} with the "
          f"state of {header.cluster_id!r} at log position {header.slot} (taken "
          f"{header.taken_at}); start it with: sdpaxos cluster up --dir {directory}")
    return OK


def _status(path: Path, as_json: bool) -> int:
    """``snapshot status FILE``: what the backup holds, checked (``etcdutl snapshot status``:
    its hash, position and size; here also its kind, source cluster, configuration and
    counts)."""
    try:
        header, _, state = decode_backup(path.read_bytes())
        kind = state_machine_kind(header.state_machine)
        about = dict(kind.describe_state(state))
    except (OSError, DecodeError, ConfigError) as exc:
        print(f"sdpaxos snapshot status: {path}: {exc}", file=sys.stderr)
        return REFUSED
    doc: dict[str, object] = {
        "file": str(path), "sha256": header.sha256, "position": header.slot,
        "size": header.size, "kind": header.state_machine, "cluster_id": header.cluster_id,
        "replicas": header.replicas, "taken_at": header.taken_at, "format": header.format,
        **about,
    }
    if as_json:
        print(json.dumps(doc))
        return OK
    width = max(len(key) for key in doc)
    for key, value in doc.items():
        print(f"{key:<{width}}  {value}")
    return OK


def _write_atomically(path: Path, data: bytes) -> None:
    temp = path.with_name(path.name + ".tmp")
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    directory = os.open(path.parent if str(path.parent) else ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
