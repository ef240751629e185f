"""``sdpaxos snapshot save | restore``: back up a live cluster, seed a new one from a backup.

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
the snapshot as its state at slot 0 of the new log. ``sdpaxos cluster up --dir D`` then
serves it. The state machine kind of the new cluster must be the backup's (pass the kind's
``init`` options, e.g. ``--gpu-store`` with its configuration, for a GPU store).

Exit codes (``consensus.runtime.exit_codes``): 0 done; 1 a definite refusal (permission
denied, a damaged file, ``D`` already holds a cluster); 2 usage (a bad option, an unreadable
cluster file, no endpoint); 3 unavailable (no replica answered).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import ssl
import sys
from datetime import UTC, datetime
from pathlib import Path

from consensus.errors import ConfigError, DecodeError, IndefiniteFailure, SDPaxosError
from consensus.protocol.types import SnapshotMeta
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.exit_codes import OK, REFUSED, UNAVAILABLE, USAGE
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
    restore = actions.add_parser("restore", help="seed a new cluster in --dir from FILE")
    restore.add_argument("file", metavar="FILE", help="a backup written by snapshot save")
    add_init_options(restore, cluster_id_default=None)


def run_snapshot(args: argparse.Namespace) -> int:
    if args.action == "save":
        return _save(Path(args.file), args, args.id, args.timeout)
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
    from consensus.runtime.cli import CONFIG_NAME, init_cluster

    try:
        header, _, state = decode_backup(path.read_bytes())
    except (OSError, DecodeError) as exc:
        print(f"sdpaxos snapshot restore: {path}: {exc}", file=sys.stderr)
        return 1
    cluster_id = args.cluster_id or f"restored-{secrets.token_hex(4)}"
    if cluster_id == header.cluster_id:
        print(f"sdpaxos snapshot restore: the new cluster needs an id of its own, not the "
              f"backed-up cluster's ({cluster_id!r})", file=sys.stderr)
        return 2
    directory = Path(args.dir)
    if (directory / "data").exists() and any((directory / "data").iterdir()):
        print(f"sdpaxos snapshot restore: {directory / 'data'} holds replicas' data: restore "
              "into a new directory", file=sys.stderr)
        return 1
    code = init_cluster(args, cluster_id=cluster_id)
    if code != 0:
        return code
    try:
        config = load_cluster_config(directory / CONFIG_NAME)
        if config.state_machine != header.state_machine:
            raise ConfigError(
                f"the backup holds a {header.state_machine!r} state machine, the new cluster "
                f"would run {config.state_machine!r}: pass that kind's init options"
            )
        seed = encode_snapshot(SnapshotMeta(0, (0,) * len(config.replicas)), state)
        for spec in config.replicas:
            write_snapshot(config.replica_dir(spec.id) / "snapshots", seed, 0)
    except (ConfigError, OSError) as exc:
        (directory / CONFIG_NAME).unlink(missing_ok=True)  # no half-seeded cluster stays
        print(f"sdpaxos snapshot restore: {exc}", file=sys.stderr)
        return 1
    print(f"seeded {len(config.replicas)} replicas of cluster {cluster_id!r} in {directory} with "
          f"the state of {header.cluster_id!r} at log position {header.slot} (taken "
          f"{header.taken_at}); start it with: sdpaxos cluster up --dir {directory}")
    return 0


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
