"""Types the protocol cores, storage, the runtime and the simulator share.

``SnapshotMeta`` says where a state-machine snapshot stands in a log (every core compacts to
one and installs one; storage encodes it; the node and the simulator ship it). ``Role`` is
what a replica does in its current view (``CoreStatus.role``: reported by status and
metrics). ``NEVER`` is the time of what never happened, for every core's timers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from consensus.messages import ConfigRecord

__all__ = ["NEVER", "Role", "SnapshotMeta"]

#: a time before any other: what never happened (a timestamp that is always long ago)
NEVER = -(1 << 62)


class Role(enum.Enum):
    """An SDPaxos core is a follower, candidate, establishing or the sequencer; a Multi-Paxos
    core a follower, candidate or the leader; a leaderless core (Mencius, EPaxos) a peer; a
    member that does not vote (``consensus.protocol.membership``) a learner, or removed."""

    FOLLOWER = "follower"
    CANDIDATE = "candidate"  # asked for votes for the current view
    ESTABLISHING = "establishing"  # elected; waiting for a majority to accept its NewView
    SEQUENCER = "sequencer"  # serving the current view
    LEADER = "leader"  # Multi-Paxos: leading at its ballot
    PEER = "peer"  # leaderless: every replica leads its own instances
    LEARNER = "learner"  # a member learning the log, not voting yet
    REMOVED = "removed"  # a member a change removed (ids are never reused: for good)


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Where a state-machine snapshot stands in the log: every slot below ``slot`` applied,
    and ``exec_counts[r]`` of replica r's C-instances among them. ``config``: the membership
    in force there (``consensus.protocol.membership``), None for a cluster that never changed
    its members (``exec_counts`` then count the bootstrap replicas 0..N-1; otherwise the
    voters of ``config``'s epoch in its core order, and ``slot`` is a global slot)."""

    slot: int
    exec_counts: tuple[int, ...]
    config: ConfigRecord | None = None
