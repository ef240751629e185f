"""What one replica node counts and times (``/metrics``: ``consensus.runtime.metrics``).

Owns: ``NodeStats``, the counters and histograms every part of the node adds to (each part
writes only its own fields: the turn loop its turns, fsyncs and applying, the peer intake its
frames, the snapshot pipeline its snapshots), and ``BusyClock``, which times the pieces of the
node's own work between two yields to the event loop (``NodeStats.longest_busy_s``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from consensus.runtime.gc_pauses import GcPauses
from consensus.runtime.histogram import Histogram

__all__ = ["STALL_BUCKETS_S", "BusyClock", "NodeStats"]

#: upper bounds (seconds) of the loop-stall histogram's buckets: 50 ms among them, the bound a
#: replica's stalls are held to at 100k GPUs (issue 38)
STALL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(slots=True)
class NodeStats:
    turns: int = 0
    commands_applied: int = 0
    fsyncs: int = 0
    fsync_seconds: float = 0.0
    bad_frames: int = 0
    snapshots_taken: int = 0
    snapshots_installed: int = 0
    #: the longest a snapshot held the event loop at once (seconds): the capture or the
    #: install (the log's rewrite) of one of our own, the core's install of a peer's and its
    #: state's adoption; the files' writing and a peer's snapshot's decoding and building
    #: being off the loop
    longest_snapshot_hold_s: float = 0.0
    #: ... the CPU time the loop's thread spent in it (seconds: the rest is waiting for the
    #: disk, or for the CPU on a busy machine) ...
    longest_snapshot_cpu_s: float = 0.0
    #: ... and the longest rewrite of the write-ahead log after one (seconds: fsyncs)
    longest_log_rewrite_s: float = 0.0
    #: the longest loop turn (seconds), yields to the event loop included
    longest_turn_s: float = 0.0
    #: the longest piece of this replica's own work between two yields to the event loop
    #: (seconds): a loop turn's part, a slice of its applying, a frame's decoding
    longest_busy_s: float = 0.0
    #: the longest the event loop was held by anything (seconds, ``LAG_PROBE_S`` resolution):
    #: how long a peer's frame, a client or /metrics waited at most to be read
    longest_stall_s: float = 0.0
    #: ... and every such measure (the lag probe's lateness, every ``LAG_PROBE_S``): unlike
    #: the longest since start (a start-up's replay, forever after), its buckets' counts over
    #: a window say how long the loop stalled in that window
    stall_latency: Histogram = field(default_factory=lambda: Histogram(STALL_BUCKETS_S))
    #: the garbage collector's pauses, per generation (timed while the node runs)
    gc_pauses: GcPauses = field(default_factory=GcPauses)
    #: slots executed again from the records at start, and how long that took (seconds)
    replayed_slots: int = 0
    replay_seconds: float = 0.0
    #: peer frames dropped by admission (``consensus.protocol.admission``), by rejection kind
    peer_frames_rejected: dict[str, int] = field(default_factory=dict)
    #: peers whose frames admission rejected (each is logged once)
    rejected_peers: set[int] = field(default_factory=set)
    #: seconds from proposal to answer of the commands led here: blind writes answered
    #: when ready, the others once executed (``/metrics``: sdpaxos_commit_latency_seconds)
    ready_latency: Histogram = field(default_factory=Histogram)
    executed_latency: Histogram = field(default_factory=Histogram)
    #: seconds per fsync of the write-ahead log, per loop turn, and per turn's applying of
    #: its committed commands (the turns that applied any; yields to the loop excluded)
    fsync_latency: Histogram = field(default_factory=Histogram)
    turn_latency: Histogram = field(default_factory=Histogram)
    apply_latency: Histogram = field(default_factory=Histogram)
    #: peer messages handed to the transport and taken from it (admitted), by message class
    messages_sent: dict[type, int] = field(default_factory=dict)
    messages_received: dict[type, int] = field(default_factory=dict)
    #: times the core's view moved on while this node ran
    view_changes: int = 0
    #: commands led here answered ``SessionExpired`` (their session was evicted or closed),
    #: and log-time commands this replica proposed
    sessions_expired: int = 0
    log_times_proposed: int = 0



class BusyClock:
    """When the piece of the node's own work under way began (``since``: set by whoever starts
    one), and the longest such piece so far (``NodeStats.longest_busy_s``)."""

    __slots__ = ("_stats", "since")

    def __init__(self, stats: NodeStats) -> None:
        self._stats = stats
        self.since = 0.0

    def until_now(self) -> None:
        """A piece of work that began at ``since`` ends here (``longest_busy_s``)."""
        busy = time.perf_counter() - self.since
        if busy > self._stats.longest_busy_s:
            self._stats.longest_busy_s = busy
