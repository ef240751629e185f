"""SDPaxos (SoCC'18): TODO overview."""

from consensus.protocol.sdpaxos.instances import OwnerSlots
from consensus.protocol.sdpaxos.replica import SDPaxosReplica
from consensus.protocol.sdpaxos.view_change import VIEW_SPAN
from consensus.protocol.types import Role, SnapshotMeta

__all__ = ["VIEW_SPAN", "OwnerSlots", "Role", "SDPaxosReplica", "SnapshotMeta"]
