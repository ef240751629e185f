"""What a replica reports about itself: the answer to the client port's ``"status"`` request
(``sdpaxos endpoint status|health``, ``consensus.runtime.endpoint``).

``replica_status(node)`` is a msgpack-able dict with string keys (``STATUS_FIELDS``): who the
replica is (id, site, client address, cluster id, state machine, protocol, version), where
it stands (from its core's ``status()``: role, view, the sequencer or leader it follows — nil
when it follows nobody —, applied position, the best position a peer reported and its lag
behind it), what it holds on disk (bytes of write-ahead log and of snapshots), its readiness
verdict with the failed conditions (``consensus.runtime.health``: the same judgement as
``/readyz``) and the cluster's current members with every address of each (``membership``:
the log's, ``consensus.runtime.members``; ``members``: their client addresses, or the cluster
file's replicas for a core without membership), so a tool that knows one endpoint learns
every member.
"""

from __future__ import annotations

import functools
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from consensus.protocol.membership import MemberReplica
from consensus.runtime.health import liveness, readiness
from consensus.runtime.members import KnownMember, address_text, info_of_spec, known_members

if TYPE_CHECKING:
    from consensus.runtime.node import ReplicaNode

__all__ = ["DISTRIBUTION", "STATUS_FIELDS", "current_members", "package_version",
           "replica_status"]

#: the distribution whose version a replica reports
DISTRIBUTION = "sdpaxos"
#: the keys of a status answer (members: ``[id, site, "host:port"]`` client addresses of the
#: current members)
STATUS_FIELDS = (
    "id", "site", "address", "cluster_id", "state_machine", "protocol", "version", "role",
    "view", "leader", "applied", "best_peer_applied", "lag", "wal_bytes", "snapshot_bytes",
    "live", "ready", "reasons", "members", "membership",
)


@functools.cache
def package_version() -> str:
    """The installed distribution's version ("unknown" when run from an uninstalled tree)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def _bytes_under(directory: Path) -> int:
    """Bytes of the files directly in ``directory`` (0 if it does not exist): the write-ahead
    log's segments, the snapshots."""
    total = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        return 0
    return total


def replica_status(node: ReplicaNode) -> dict[str, Any]:
    config = node.config
    spec = config.replica(node.me)
    core = node.core.status()
    applied = node.executed_slot
    best = core.best_peer_executed
    best = applied if best is None else best
    verdict = readiness(node)
    replica_dir = config.replica_dir(node.me)
    return {
        "id": node.me,
        "site": spec.site,
        "address": f"{spec.client_address[0]}:{spec.client_address[1]}",
        "cluster_id": config.cluster_id,
        "state_machine": config.state_machine,
        "protocol": config.protocol_name,
        "version": package_version(),
        "role": core.role.value,
        "view": core.view,
        "leader": core.leader,
        "applied": applied,
        "best_peer_applied": best,
        "lag": max(0, best - applied),
        "wal_bytes": _bytes_under(replica_dir / "wal"),
        "snapshot_bytes": _bytes_under(node.snapshot_dir),
        "live": liveness(node).ready,
        "ready": verdict.ready,
        "reasons": list(verdict.reasons),
        "members": _client_addresses(node),
        "membership": membership_status(node),
    }


def current_members(node: ReplicaNode) -> tuple[int, list[KnownMember]]:
    """The epoch and the members as this replica knows them (``known_members``: the log's;
    for a core without membership, the cluster file's replicas, epoch 0)."""
    core = node.core
    if not isinstance(core, MemberReplica):
        return 0, [KnownMember(r.id, 1, True, info_of_spec(r), False)
                   for r in node.config.replicas]
    return core.config.epoch, known_members(core.config, {r.id: r for r in node.config.replicas})


def _client_addresses(node: ReplicaNode) -> list[list[Any]]:
    """``[id, site, "host:port"]`` per current member whose client address is known."""
    return [[m.id, m.info.site, address_text(m.info.client_address)]
            for m in current_members(node)[1] if m.info is not None]


def membership_status(node: ReplicaNode) -> dict[str, Any] | None:
    """The live member set as this replica's log has it (None for a core without
    membership): epoch, voters (core order: the first is the epoch's first sequencer),
    learners, the change closing the epoch, the next id ``add`` hands out, and per member
    (``KnownMember.to_status``, voters first) its id, incarnation, role and every address,
    from the log (``published``) or, until it published them, this replica's cluster file."""
    core = node.core
    if not isinstance(core, MemberReplica):
        return None
    config, files = core.config, {r.id: r for r in node.config.replicas}
    return {
        "epoch": config.epoch, "voters": list(config.voters), "learners": list(config.learners),
        "sequencer": core.sequencer, "closing": config.closing,
        "closing_member": config.closing_member, "next_id": config.next_id,
        "members": [m.to_status() for m in known_members(config, files)],
        "voting": core.voting, "learn_lag": core.learn_lag, "removed": core.removed,
    }
