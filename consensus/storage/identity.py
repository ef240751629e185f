"""Who a data directory belongs to, and which incarnations of its peers it has met.

A replica that lost its disk must never vote as if it had not: an acceptor that forgot what it
promised and accepted can accept a conflicting value, and with one more fault two values are
chosen (one GPU, two jobs). So a data directory carries its owner, and peers remember whom they
met.

``IDENTITY`` (one per data directory, written once, at ``cluster init`` or on the first start of
a new cluster): the cluster id, the replica id, the member's incarnation (1 at init; a member
replaced through membership would get the next one) and a random *member token* drawn when the
file is written. A directory whose disk was wiped and started again draws a new token, even if
everything else is the same.

``MEMBERS`` (one per data directory): for each peer replica id, the incarnation and token this
replica met first. It is written (and fsynced) on first contact, before any frame of that peer
is taken, so a peer that voted for us or accepted our values is on disk before its vote counts.

Rules, and where each is carried out:

* A replica starts only on its own directory (``open_identity``): same cluster id, same replica
  id, an intact file, not marked removed (``mark_removed``: a membership change removed the
  member; ``MemberRemoved``, for good). A directory with data but no ``IDENTITY`` (an older
  build's) is adopted once, as incarnation 1. An empty directory is an identity only when a
  new cluster is being bootstrapped (``bootstrap=True``: ``sdpaxos serve
  --initial-cluster-state new``, the library's default); otherwise it is refused
  (``MissingIdentity``), naming the ways out.
* A peer is admitted only as the incarnation and token met first (``KnownMembers.admit``): an
  older incarnation is retired, the same incarnation with another token is a wiped or re-created
  directory, and either is refused with a reason the transport sends back to the peer (which
  stops: ``consensus.errors.MemberRefused``). A handshake without an identity (an older build)
  is admitted unchecked, for rolling upgrades.

Both files are JSON with a CRC-32 of their canonical body (an operator can read them; a torn or
edited file is refused, never half-trusted), replaced atomically (temp file, fsync, rename,
fsync the directory).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from consensus.errors import ConfigError, ForeignDataDir, MemberRemoved, MissingIdentity

__all__ = [
    "FIRST_INCARNATION",
    "IDENTITY_NAME",
    "MEMBERS_NAME",
    "NO_INCARNATION",
    "KnownMembers",
    "MemberIdentity",
    "mark_removed",
    "new_identity",
    "open_identity",
    "read_identity",
    "write_identity",
]

IDENTITY_NAME: Final = "IDENTITY"
MEMBERS_NAME: Final = "MEMBERS"
#: the files' format; another one is refused (an older build never reads a newer file)
FORMAT: Final = 1
#: a member's first incarnation (``cluster init``, or the first start of a new cluster)
FIRST_INCARNATION: Final = 1
#: what a handshake without an identity (an older build) counts as
NO_INCARNATION: Final = 0
#: random bytes in a member token (hex on disk and on the wire)
TOKEN_BYTES: Final = 8
#: files a directory may hold and still be "empty": the process lock, a temp file left by a
#: crash in the middle of writing the identity
_NOT_DATA: Final = frozenset({"LOCK", IDENTITY_NAME + ".tmp", MEMBERS_NAME + ".tmp"})


@dataclass(frozen=True, slots=True)
class MemberIdentity:
    cluster_id: str
    replica_id: int
    incarnation: int
    #: random, drawn when the directory got its identity: a wiped directory gets another
    token: str
    #: the epoch whose configuration no longer names the member (``mark_removed``), if any
    removed_in_epoch: int | None = None

    def describe(self) -> str:
        return (f"replica {self.replica_id} (incarnation {self.incarnation}) of cluster "
                f"{self.cluster_id!r}")


def new_identity(cluster_id: str, replica_id: int,
                 incarnation: int = FIRST_INCARNATION) -> MemberIdentity:
    return MemberIdentity(cluster_id, replica_id, incarnation, secrets.token_hex(TOKEN_BYTES))


def read_identity(directory: Path) -> MemberIdentity | None:
    """The directory's identity, or None if it has none; ``ConfigError`` if the file is not an
    intact identity of this format."""
    body = _read_checked(directory / IDENTITY_NAME)
    if body is None:
        return None
    removed = body.get("removed_in_epoch")
    match body:
        case {"cluster_id": str(cluster), "replica_id": int(replica),
              "incarnation": int(incarnation), "token": str(token)} if (
            replica >= 0 and incarnation >= FIRST_INCARNATION and token
            and (removed is None or (type(removed) is int and removed >= 0))
        ):
            return MemberIdentity(cluster, replica, incarnation, token, removed)
    raise ConfigError(f"{directory / IDENTITY_NAME} is not a valid identity file: {body!r}")


def write_identity(directory: Path, identity: MemberIdentity) -> None:
    body: dict[str, object] = {
        "cluster_id": identity.cluster_id, "replica_id": identity.replica_id,
        "incarnation": identity.incarnation, "token": identity.token,
    }
    if identity.removed_in_epoch is not None:  # (absent otherwise: an older build's body)
        body["removed_in_epoch"] = identity.removed_in_epoch
    _write_checked(directory, IDENTITY_NAME, body)


def mark_removed(directory: Path, identity: MemberIdentity, epoch: int) -> MemberIdentity:
    """Record durably that a membership change removed the member (in the configuration of
    ``epoch``): ``open_identity`` refuses the directory from now on."""
    removed = MemberIdentity(identity.cluster_id, identity.replica_id, identity.incarnation,
                             identity.token, epoch)
    write_identity(directory, removed)
    return removed


def open_identity(directory: Path, cluster_id: str, replica_id: int, *,
                  bootstrap: bool) -> MemberIdentity:
    """The identity replica ``replica_id`` of ``cluster_id`` runs with from ``directory``
    (created if missing); see the module's rules. Raises ``ForeignDataDir`` or
    ``MissingIdentity`` (both ``ConfigError``), or ``MemberRemoved``, and changes nothing
    then."""
    found = read_identity(directory)
    if found is not None:
        if found.cluster_id != cluster_id or found.replica_id != replica_id:
            raise ForeignDataDir(directory, found.describe(),
                                 f"replica {replica_id} of cluster {cluster_id!r}")
        if found.removed_in_epoch is not None:
            raise MemberRemoved(replica_id, cluster_id, found.removed_in_epoch)
        return found
    if _has_data(directory) or bootstrap:
        # an older build's directory (its data is this replica's), or a new cluster's first start
        identity = new_identity(cluster_id, replica_id)
        write_identity(directory, identity)
        return identity
    raise MissingIdentity(directory, replica_id, cluster_id)


def _has_data(directory: Path) -> bool:
    if not directory.is_dir():
        return False
    return any(entry.name not in _NOT_DATA for entry in directory.iterdir())


class KnownMembers:
    """The incarnation and token of each peer met first (``MEMBERS``), and the admission rule."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        body = _read_checked(directory / MEMBERS_NAME)
        self.members: dict[int, tuple[int, str]] = {}
        if body is None:
            return
        entries = body.get("members") if isinstance(body, dict) else None
        if not isinstance(entries, dict):
            raise ConfigError(f"{directory / MEMBERS_NAME} is not a valid members file")
        for key, value in entries.items():
            match value:
                case [int(incarnation), str(token)] if key.isdigit():
                    self.members[int(key)] = (incarnation, token)
                case _:
                    raise ConfigError(f"{directory / MEMBERS_NAME}: bad entry {key!r}: "
                                      f"{value!r}")

    def admit(self, replica: int, incarnation: int, token: str) -> str | None:
        """None if frames of ``replica`` presenting ``incarnation``/``token`` may be taken
        (recording a first contact durably first), else why not."""
        if incarnation == NO_INCARNATION:
            return None  # an older build: nothing to check against
        known = self.members.get(replica)
        if known is None:
            self.members[replica] = (incarnation, token)
            _write_checked(self.directory, MEMBERS_NAME, {
                "members": {str(r): list(v) for r, v in sorted(self.members.items())}})
            return None
        known_incarnation, known_token = known
        if incarnation < known_incarnation:
            return (f"incarnation {incarnation} of replica {replica} is retired (this cluster "
                    f"knows incarnation {known_incarnation})")
        if incarnation > known_incarnation:
            return (f"replica {replica} presents incarnation {incarnation}, which no membership "
                    f"change made (this cluster knows incarnation {known_incarnation})")
        if token != known_token:
            return (f"replica {replica} presents another data directory than the one it voted "
                    f"with (member token {token}, known {known_token}): its disk was wiped or "
                    "re-created, and a replica that forgot its promises must not vote again")
        return None


def _read_checked(path: Path) -> dict[str, object] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    try:
        outer = json.loads(text)
    except ValueError:
        raise ConfigError(f"{path} is not JSON (torn or edited): move it away only if you "
                          "know whose directory this is") from None
    found = outer.get("format") if isinstance(outer, dict) else None
    if found != FORMAT or not isinstance(outer, dict):
        raise ConfigError(f"{path}: unknown format {found!r} (this build reads format {FORMAT})")
    body = outer.get("body")
    crc = outer.get("crc32")
    if not isinstance(body, dict) or crc != zlib.crc32(_canonical(body)):
        raise ConfigError(f"{path}: checksum mismatch (torn or edited)")
    return body


def _write_checked(directory: Path, name: str, body: dict[str, object]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": FORMAT, "body": body, "crc32": zlib.crc32(_canonical(body))},
                      indent=1, sort_keys=True) + "\n"
    temp = directory / (name + ".tmp")
    with open(temp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, directory / name)
    fd = os.open(directory, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
            os.fsync(fd)
    finally:
        os.close(fd)


def _canonical(body: dict[str, object]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
