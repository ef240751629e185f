"""What a core says about itself: ``CoreStatus``, the answer of every core's ``status()``
(``consensus.protocol.base.ProtocolCore``).

Drivers report a replica from it — readiness (``consensus.runtime.health``), the client
port's status answer (``consensus.runtime.status``), the metrics — and never read a core's
fields: each core fills in what its protocol knows, as of its last input, and leaves what it
cannot say at the named defaults (``None`` for no leader and no lease, an empty
``peer_executed`` for positions it does not know). Positions are global log slots and
replicas are member ids: the membership layer (``MemberReplica``) translates its epoch core's
indexes and epoch-relative slots before it answers.

What each core can say (SDPaxos within ``MemberReplica``; Multi-Paxos / Mencius / EPaxos):

================  ==========================================  ==============================
field             SDPaxos                                     Multi-Paxos / Mencius / EPaxos
================  ==========================================  ==============================
role              follower, candidate, establishing,          follower, candidate, leader /
                  sequencer; learner or removed (no vote)     peer / peer
view              the view (the epoch in its high bits)       the ballot followed / 0 / 0
epoch             the membership epoch                        0
view_accepted     accepted its view's NewView                 True
leader            the sequencer of its view (None: learner)   the leader (None: candidate)
                                                              / None / None
executed          every slot below it executed here           the same (EPaxos: how many
                                                              commands it executed)
peer_executed     each peer's frontier, from its heartbeats   the same / the same / empty
                  and catch-up requests (empty: learner)      (EPaxos: not comparable)
voters            the epoch's voters                          every replica
lease_held        serving reads under a majority's leases     the leader's lease / no / no
lease_granted_to  the sequencer, while the lease it granted   the leader, while the lease
                  runs                                        runs / None / None
================  ==========================================  ==============================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from consensus.protocol.types import Role

__all__ = ["CoreStatus"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreStatus:
    """Where one replica's core stands (see the module documentation for each core)."""

    #: what the replica does now
    role: Role
    #: the view its messages carry (0 for a core without views)
    view: int
    #: every global slot below this one was executed (handed out in ``Ready.apply``)
    executed: int
    #: the member ids voting in its configuration (its own included when it votes)
    voters: tuple[int, ...]
    #: the membership epoch (0 for a cluster whose members never changed)
    epoch: int = 0
    #: it holds its current view: a core with views accepted that view's NewView (a core
    #: without views always does)
    view_accepted: bool = True
    #: the replica it follows (a sequencer, a leader; itself when it leads); None: nobody
    #: (a leaderless core, a candidate, a learner)
    leader: int | None = None
    #: it votes (False: a learner, or a removed member)
    voting: bool = True
    #: peer id -> the execution frontier that peer last reported (0: nothing yet); empty
    #: when the core knows no comparable positions
    peer_executed: Mapping[int, int] = field(default_factory=dict)
    #: it serves linearizable reads under read leases from a majority
    lease_held: bool = False
    #: the replica it granted its read lease to, while that lease runs (it votes for no
    #: other meanwhile); None: no lease granted
    lease_granted_to: int | None = None

    def __post_init__(self) -> None:
        # a snapshot, not a view of the core's own dictionary
        object.__setattr__(self, "peer_executed", MappingProxyType(dict(self.peer_executed)))

    @property
    def best_peer_executed(self) -> int | None:
        """The most advanced frontier a peer reported; None if no position is known."""
        return max(self.peer_executed.values(), default=None)
