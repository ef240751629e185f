"""A loop turn's outgoing messages as the frames that carry them, one peer at a time.

The replica node sends exactly these frames (``ReplicaNode``, at the end of each loop turn);
the simulator encodes with the same function, then decodes what it would deliver, so that
frame size limits and codec bugs show up in simulation as they would between real processes.
No I/O here (the simulator imports it).
"""

from __future__ import annotations

from collections.abc import Sequence

from consensus.codec import encode_frames
from consensus.messages import PeerMessage
from consensus.protocol.ready import Outgoing

__all__ = ["FRAME_TARGET_BYTES", "frames_by_peer"]

#: frames are split at about this size (a message bigger than that goes alone): a receiver
#: decodes a frame in one piece, at ~5 µs a command, so a catch-up answer of megabytes in
#: one frame held its loop for a third of a second
FRAME_TARGET_BYTES = 256 << 10


def frames_by_peer(outgoing: Sequence[Outgoing], max_frame: int) -> dict[int, list[bytes]]:
    """Each destination's messages, in the order produced, as the frames ``encode_frames``
    makes of them: split near ``FRAME_TARGET_BYTES``, none over ``max_frame`` (destinations
    in order of their first message; nothing for an empty ``outgoing``).

    Raises what ``encode_frames`` raises: ``LocalProtocolError`` for a message over
    ``max_frame`` on its own, ``TypeError`` for something that is not a peer message.
    """
    by_peer: dict[int, list[PeerMessage]] = {}
    for out in outgoing:
        by_peer.setdefault(out.to, []).append(out.message)
    return {
        peer: encode_frames(messages, max_frame, target_bytes=FRAME_TARGET_BYTES)
        for peer, messages in by_peer.items()
    }
