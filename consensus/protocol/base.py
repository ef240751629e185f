"""The interface every sans-I/O protocol core implements (SDPaxos, Multi-Paxos, Mencius,
EPaxos, and the membership layer around SDPaxos).

A driver (the simulator or the asyncio runtime) owns one core per replica and calls, in any
interleaving, ``propose`` / ``step`` / ``tick``; after each burst of inputs (one "loop turn") it
drains ``ready()``, carries the batch out in the documented order (see ``ready.py``) and calls
``advance``. ``now`` is a monotonic integer clock in microseconds, supplied by the driver.
What a driver reports about a core (readiness, status, metrics) it takes from ``status()``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from consensus.config import ProtocolConfig
from consensus.messages import Batch, Command, PeerMessage, Record
from consensus.protocol.ready import Ready

if TYPE_CHECKING:
    from consensus.protocol.status import CoreStatus
    from consensus.protocol.types import SnapshotMeta

__all__ = ["CoreFactory", "DrivenCore", "ProtocolCore"]


class ProtocolCore(Protocol):
    me: int

    def propose(self, command: Command, now: int) -> None:
        """A client command arrived at this replica."""
        ...

    def step(self, message: PeerMessage, now: int) -> None:
        """A peer message arrived. Invalid or stale messages are ignored, never raised."""
        ...

    def tick(self, now: int) -> None:
        """Time passed: run timers (retransmissions, catch-up, and later failure detection)."""
        ...

    def ready(self) -> Ready:
        """Everything produced since the last ``advance``."""
        ...

    def advance(self, ready: Ready) -> None:
        """The driver carried ``ready`` out."""
        ...

    def committed_log(self) -> Mapping[int, Batch]:
        """Global slot -> commands this replica knows are chosen for it (for checkers)."""
        ...

    def executed_through(self) -> int:
        """The highest global slot applied (handed out in ``Ready.apply``), or -1."""
        ...

    def status(self) -> CoreStatus:
        """Where this replica stands, as of its last input (role, view, positions, leases)."""
        ...


class CoreFactory(Protocol):
    def __call__(
        self,
        config: ProtocolConfig,
        me: int,
        *,
        recovered: Sequence[Record] = (),
        rng: random.Random,
    ) -> ProtocolCore: ...


class DrivenCore(ProtocolCore, Protocol):
    """What the asyncio driver (``consensus.runtime.node``) needs of a core besides
    ``ProtocolCore``: reads, snapshots and log compaction. Every registered core
    (``consensus.protocol.registry``) provides it."""

    @property
    def view(self) -> int:
        """The current view (0 for cores without views)."""
        ...

    @property
    def exec_slot(self) -> int:
        """Every global slot below this has been applied (handed out in ``Ready.apply``)."""
        ...

    def read(self, command: Command, now: int) -> None:
        """A linearizable read, served through ``Ready.reads``."""
        ...

    def read_stale(self, command: Command, now: int) -> None:
        """A read served from local state at once (``Ready.reads``), possibly stale."""
        ...

    def snapshot_meta(self) -> SnapshotMeta:
        """Where a state-machine snapshot taken now stands in the log."""
        ...

    def compact(self, meta: SnapshotMeta) -> list[Record]:
        """Forget the log below ``meta``; the records a rewritten WAL must hold."""
        ...

    def durable_records(self) -> list[Record]:
        """The records a rewritten WAL must hold with a durable snapshot at the execution
        frontier (``compact`` without forgetting anything)."""
        ...

    def install_snapshot(self, meta: SnapshotMeta) -> list[Record]:
        """Continue from a peer's snapshot at ``meta``; the records for a rewritten WAL."""
        ...
