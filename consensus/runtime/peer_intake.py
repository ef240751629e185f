"""What a replica node's peers hand it between loop turns.

Owns: when each peer was last heard from (``heard_at``: readiness,
``consensus.runtime.health``), the snapshots being received chunk by chunk, and the refusal
of a peer that will not have this replica (the turn loop stops with it).

Each peer frame (``on_frame``, called by the transport) is decoded, checked by admission as a
whole (``consensus.protocol.admission``: one bad message drops it all) and counted; its
snapshot chunks are put together here, and the rest, and a snapshot once whole, are posted to
the inbox as ``PeerMessages`` and ``PeerSnapshot`` events (``consensus.runtime.node_events``).
A peer never crashes the replica with what it sends: bad frames are counted and logged.
"""

from __future__ import annotations

import logging
import time

from consensus.codec import decode_frame
from consensus.errors import DecodeError, MemberRefused
from consensus.messages import SnapshotChunk
from consensus.protocol.admission import check_frame
from consensus.protocol.base import DrivenCore
from consensus.protocol.membership import MemberReplica
from consensus.runtime.cluster_config import ClusterConfig
from consensus.runtime.logs import RateLimited
from consensus.runtime.node_events import Inbox, PeerMessages, PeerSnapshot
from consensus.runtime.node_stats import BusyClock, NodeStats

__all__ = ["PeerIntake"]

log = logging.getLogger("sdpaxos.node")


class PeerIntake:
    """Takes in one replica's peer frames and refusals (see the module documentation)."""

    def __init__(self, config: ClusterConfig, core: DrivenCore, inbox: Inbox, stats: NodeStats,
                 busy: BusyClock) -> None:
        self.config = config
        self.core = core
        self.inbox = inbox
        self.stats = stats
        self.busy = busy
        #: peer -> time.monotonic() of its last frame (readiness: ``consensus.runtime.health``)
        self.heard_at: dict[int, float] = {}
        #: why a peer refused this replica (it stops: ``ReplicaNode.wait_failed`` raises it)
        self.refusal: MemberRefused | None = None
        self._incoming: dict[int, tuple[int, int, bytearray]] = {}  # src -> (slot, got, data)
        #: what peers can make happen again and again, logged once an interval
        self._log = RateLimited(log)

    def on_frame(self, peer: int, payload: bytes) -> None:
        busy = self.busy
        busy.since = time.perf_counter()
        self.heard_at[peer] = time.monotonic()
        try:
            self._take_frame(peer, payload)
        finally:
            busy.until_now()

    def on_refused(self, peer: int, reason: str) -> None:
        """A peer refuses our identity: stop, rather than serve with no vote (and no hope)."""
        if self.refusal is None:
            self.refusal = MemberRefused(peer, reason)
            self.inbox.wake()

    def _take_frame(self, peer: int, payload: bytes) -> None:
        try:
            messages = decode_frame(payload, lazy_batches=True)
        except DecodeError as exc:
            self.stats.bad_frames += 1
            self._log.warning(f"bad frame {peer}", "dropping a bad frame from replica %d "
                              "(counted in sdpaxos_bad_frames_total): %s", peer, exc)
            return
        # every id, index, slot, view and ballot against the configuration and the core's
        # state, and src against the peer the handshake named: one bad message drops it all
        if isinstance(self.core, MemberReplica):  # each message against its epoch's core
            rejection = self.core.check_frame(messages, peer)
        else:
            rejection = check_frame(messages, self.core, self.config.protocol.replicas,
                                    sender=peer, protocol=self.config.protocol_name)
        if rejection is not None:
            rejected = self.stats.peer_frames_rejected
            rejected[rejection.kind] = rejected.get(rejection.kind, 0) + 1
            if peer not in self.stats.rejected_peers:
                self.stats.rejected_peers.add(peer)
                log.warning("dropping frames from replica %d that fail admission (logged once "
                            "per peer; counted in sdpaxos_peer_frames_rejected_total): %s",
                            peer, rejection)
            return
        received = self.stats.messages_received
        chunks = False
        for message in messages:
            kind = type(message)
            received[kind] = received.get(kind, 0) + 1
            if kind is SnapshotChunk:
                chunks = True
        if chunks:  # (rare: the rest of the frame goes to the core as usual)
            for message in messages:
                if type(message) is SnapshotChunk:
                    self._on_snapshot_chunk(message)
            messages = [m for m in messages if type(m) is not SnapshotChunk]
        if messages:
            self.inbox.post(PeerMessages(messages))

    def _on_snapshot_chunk(self, chunk: SnapshotChunk) -> None:
        slot, got, buffer = self._incoming.get(chunk.src, (-1, 0, bytearray()))
        if chunk.offset == 0:
            slot, got, buffer = chunk.slot, 0, bytearray()
        if chunk.slot != slot or chunk.offset != got or chunk.total > (1 << 34):
            self._incoming.pop(chunk.src, None)  # out of order: wait for the next offer
            return
        buffer += chunk.data
        got += len(chunk.data)
        if got >= chunk.total:
            self._incoming.pop(chunk.src, None)
            self.inbox.post(PeerSnapshot(bytes(buffer)))
        else:
            self._incoming[chunk.src] = (slot, got, buffer)
