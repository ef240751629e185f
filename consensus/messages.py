"""Every message and durable record the protocol cores exchange.

All of them are frozen, slotted, keyword-only dataclasses: plain data with no behaviour, so
the same objects flow through the simulator, the codec and the asyncio driver. The codec
(`consensus.codec`) gives each class a stable wire tag; adding a field to a class changes its
wire format and needs a new ``FORMAT_VERSION``.

Naming follows the paper (SoCC'18, Figure 5):

* ``C[n][i]`` — replica ``n``'s ``i``-th *command instance*; its value is a batch of client
  commands. ``CAccept``/``CAck``/``CCommit`` are the Accept, Accepted and Commit messages of
  that Paxos instance; ``CRequest`` asks the sequencer to order an instance it did not see.
* ``O[j]`` — the sequencer's ``j``-th *order instance* (global slot ``j``); its value is the id
  of the replica whose next C-instance takes slot ``j`` (or ``NO_CL``: a no-op slot).
  ``OAccept``/``OAck``/``OCommit`` carry one or more ``OEntry`` values at a time.

Identifiers are plain non-negative ``int``s: replica ids are ``0..N-1``, indices and slots count
from 0. Ballots are ints too (see ``consensus.protocol.ballot``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "NO_CL",
    "CAccept",
    "CAcceptedRecord",
    "CAck",
    "CCommit",
    "CRequest",
    "Catchup",
    "Command",
    "OAccept",
    "OAcceptedRecord",
    "OAck",
    "OCommit",
    "OEntry",
    "PeerMessage",
    "Record",
]

#: The value of an O-instance that places no command ("no command leader"): executes a no-op.
NO_CL: Final = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """One client command, opaque to the protocol.

    ``(client_id, seq)`` identifies the request: a retry carries the same pair, and the
    replicated state machine's session table makes sure it takes effect once.
    ``keys`` names the objects the command updates (the sequencer's read history table uses
    them). A ``blind`` command's result does not matter to its client (a plain write), so it is
    acknowledged as soon as it is *ready*; any other command is answered after it executes.
    """

    client_id: int
    seq: int
    op: bytes
    keys: tuple[str, ...] = ()
    blind: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class OEntry:
    """One order-instance value: global slot ``slot`` goes to replica ``owner`` (or NO_CL)."""

    slot: int
    owner: int


# --------------------------------------------------------------------------- peer messages
# Every peer message carries its sender ``src`` and the sender's ``view``.


@dataclass(frozen=True, slots=True, kw_only=True)
class CAccept:
    """Accept phase of ``C[owner][index]`` at ``ballot`` with value ``batch``."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int
    batch: tuple[Command, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CAck:
    """``src`` accepted ``C[owner][index]`` at ``ballot``; sent to the instance's leader."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CCommit:
    """``C[owner][index]`` is chosen. ``batch`` is None when the receiver holds the value."""

    src: int
    view: int
    owner: int
    index: int
    ballot: int
    batch: tuple[Command, ...] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CRequest:
    """Asks the sequencer for O-instances for ``owner`` until it has ``index + 1`` of them.

    ``keys`` feeds the sequencer's read history table. ``o_prefix`` is how many leading
    O-instances the sender has accepted without a gap, so the sequencer can re-send what it
    misses (a retransmitted CRequest is also the way lost OAccepts are repaired).
    """

    src: int
    view: int
    owner: int
    index: int
    keys: tuple[str, ...]
    o_prefix: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OAccept:
    """Accept phase of the O-instances in ``entries``, proposed at ballot ``view``."""

    src: int
    view: int
    entries: tuple[OEntry, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class OAck:
    """``src`` accepted the O-instances ``slots`` at ballot ``view``."""

    src: int
    view: int
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class OCommit:
    """The O-instances in ``entries`` are chosen (sent by their command leader)."""

    src: int
    view: int
    entries: tuple[OEntry, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Catchup:
    """A replica that cannot execute global slot ``slot`` asks a peer for what it misses.

    The peer answers with ``OCommit``s for the committed slots from ``slot`` on and
    ``CCommit``s (with values) for the C-instances they place.
    """

    src: int
    view: int
    slot: int


PeerMessage = CAccept | CAck | CCommit | CRequest | OAccept | OAck | OCommit | Catchup


# --------------------------------------------------------------------------- durable records


@dataclass(frozen=True, slots=True, kw_only=True)
class CAcceptedRecord:
    """This replica accepted ``C[owner][index]`` at ``ballot`` with ``batch``."""

    owner: int
    index: int
    ballot: int
    batch: tuple[Command, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class OAcceptedRecord:
    """This replica accepted the O-instances ``entries`` at ballot ``view``."""

    view: int
    entries: tuple[OEntry, ...]


Record = CAcceptedRecord | OAcceptedRecord
