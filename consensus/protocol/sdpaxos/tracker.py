"""Acknowledgement prefixes: how far each replica accepted the sequencer's O-instances.

A five-replica sequencer counts its own O-instances as chosen once they lie inside the prefix
of slots a majority of replicas accepted without a gap (``FiveRule.ordered_own``). This class
keeps, per replica, that gap-free acknowledged prefix and the acknowledgements beyond it, and
answers the majority's prefix; like etcd-raft's ``tracker`` it owns its state and is tested
alone (tests/protocol/sdpaxos/test_tracker.py).

Rules: an acknowledgement below a replica's prefix changes nothing (duplicates are normal);
the prefix only grows; the sequencer's own prefix is everything it proposed.
"""

from __future__ import annotations

__all__ = ["AckPrefixes"]


class AckPrefixes:
    """Per replica, the gap-free prefix of slots it acknowledged."""

    __slots__ = ("_beyond", "_prefix")

    def __init__(self, prefixes: dict[int, int]) -> None:
        #: replica -> every slot below this was acknowledged
        self._prefix = dict(prefixes)
        #: replica -> acknowledged slots above its prefix
        self._beyond: dict[int, set[int]] = {replica: set() for replica in prefixes}

    def prefix(self, replica: int) -> int:
        return self._prefix[replica]

    def record(self, replica: int, slot: int) -> None:
        """``replica`` acknowledged ``slot``."""
        prefix = self._prefix[replica]
        if slot < prefix:
            return
        beyond = self._beyond[replica]
        beyond.add(slot)
        while prefix in beyond:
            beyond.discard(prefix)
            prefix += 1
        self._prefix[replica] = prefix

    def majority_prefix(self, me: int, proposed: int, quorum: int) -> int:
        """The longest prefix ``quorum`` replicas acknowledged, counting ``me`` (the
        sequencer) as having accepted all ``proposed`` slots."""
        prefixes = sorted(
            proposed if replica == me else prefix for replica, prefix in self._prefix.items()
        )
        return prefixes[len(prefixes) - quorum]
