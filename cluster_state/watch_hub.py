"""The pushed watch stream of one replica: many watchers fed by one apply hook.

A replica serving thousands of watch streams must not do per-watcher work per command: the
hub hooks the node once (``node.on_apply``), and once the commands of a loop turn have applied
it reads the new events from the store *once* and hands the same immutable ``Batch`` to every
watcher. Fan-outs are at least an interval apart (``fan_out_interval``: it grows with the
watchers, since every fan-out costs each stream a message): a change that comes after a quiet
interval goes out right after its turn, and under load the turns of an interval share a batch.
A watcher's memory is a queue of references to shared batches, bounded by ``max_pending``
events (a watcher with an empty queue takes a batch of any size: it is shared, so that costs
a reference): one that falls further behind (a slow client, its transport's flow control full) is
not waited for and not buffered without bound. Its queue is dropped and its stream ends with
``EventsCompacted`` (etcd's answer to a watcher behind the compaction point), after which it
re-reads the state and watches again from a newer revision.

Batches always hold whole revisions (one command's events are appended together before its
hook runs), in revision order, so a watcher resuming from the last revision it saw — at this
replica or any other, since every replica emits the same events — misses and repeats nothing.

A snapshot installed from a peer replaces the store's events without calling the hook, and a
turn may apply more commands than the store keeps events for: then the hub cannot tell what
it did not fan out, and each watcher is brought up to date from the store's kept events on
its own if they reach back to what it was queued (a lagging replica that catches up by
snapshot keeps the watchers that started at a revision it had not reached), or else gets
``EventsCompacted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING

from cluster_state.errors import EventsCompacted
from cluster_state.events import ChangeEvent
from cluster_state.store import ClusterStore
from consensus.messages import Command

if TYPE_CHECKING:
    from consensus.runtime.node import ReplicaNode

__all__ = ["ACK_EVERY", "ACK_WINDOW", "DEFAULT_MAX_PENDING", "FAN_OUT_DELAY_S", "Batch",
           "WatchHub"]

#: an acknowledged stream (gRPC ``WatchAcked``): the replica sends while fewer than half this
#: many events are unacknowledged, so what sits in the transport for a client that stopped
#: reading is at most half of it plus one message, whatever the client's HTTP/2 window (a
#: non-reading client with BDP probing otherwise soaks up megabytes per stream) ...
ACK_WINDOW = 2048
#: ... and the client acknowledges each time it consumed this many since its last ack (a
#: process sharing the stream among its watchers: handed them out): one small message per
#: 512 events, not per batch. Acks are messages too: at 1,000 streams
#: every 256 events (the window was 1,024) they were a fifth of a replica's watch messages
#: and a quarter of the watcher processes' CPU (alloc-e2e --watchers 1000, py-spy); a client
#: acking every 512 to a replica of the smaller window stalls for a round trip per ack
#: (that replica sends until 512 are unacknowledged), it never deadlocks
ACK_EVERY = ACK_WINDOW // 4

#: events a watcher may have queued (not yet taken by its stream) before it is dropped with
#: ``EventsCompacted``: at 2,000 events/s, a second of lag (and about 8 KB of references)
DEFAULT_MAX_PENDING = 2048
#: the least time between two fan-outs: commands applied within it share one batch (one
#: message per watcher), which is what lets one replica feed 1,000 streams; small against the
#: watch delay budget (100 ms at p99) ...
FAN_OUT_DELAY_S = 0.01
#: ... plus this much per watcher (every message costs each stream a gRPC write: hundreds
#: of streams at 100 batches/s is more than a replica's loop can write) ...
FAN_OUT_DELAY_PER_WATCHER_S = 0.00003
#: ... up to this. A stream that could not keep up takes what queued meanwhile as one message
#: (the gRPC service merges them), so a busy replica writes less by itself: at 1,000 watchers,
#: 20 ms gave p50 81/94 ms and p99 466/486 ms against 113/104 and 490/507 for 50 ms
#: (alternated, alloc-e2e --watchers 1000, one shared 2-core machine). Fan-outs timed from
#: the last one (not from the first apply after it) with acks every 512 events: p50 100-141 ms
#: and p99 605-792 ms against 142-223 and 754-1,021 for the arming after an apply with acks
#: every 256 (4 and 3 runs alternated, 256-462 allocations/s, the machine's load 5-11). The
#: rest is the machine: a replica message costs about 30 us of CPU in gRPC, a watcher's read
#: about 50, and 1,000 streams are then more than 2 shared cores deliver every 20 ms.
FAN_OUT_DELAY_MAX_S = 0.02
#: a quiet hub looks at the store this often anyway (a snapshot installed from a peer
#: replaces the events without calling the apply hook)
IDLE_CHECK_S = 1.0


class Batch:
    """Consecutive events (whole revisions, in order), shared by every watcher it reaches.
    ``encoded`` is free for the transport to cache its encodings of the batch in (by the
    transport's own key: one per wire form)."""

    __slots__ = ("encoded", "events")

    def __init__(self, events: list[ChangeEvent]) -> None:
        self.events = events
        self.encoded: dict[object, object] = {}

    @property
    def last(self) -> int:
        return self.events[-1].revision


class _Watcher:
    __slots__ = ("batches", "compacted", "dropped", "pending", "queued", "taken", "wake")

    def __init__(self, since: int, dropped: asyncio.Event | None) -> None:
        self.batches: deque[Batch] = deque()
        self.pending = 0  # events in ``batches``
        self.queued = since  # the newest revision queued for this watcher
        self.taken = since  # the newest revision its stream took
        self.compacted: EventsCompacted | None = None
        self.wake = asyncio.Event()
        self.dropped = dropped  # the stream's, set when this watcher is dropped


class WatchHub:
    """The watchers of one replica's store (see the module documentation)."""

    def __init__(self, node: ReplicaNode, *, max_pending: int = DEFAULT_MAX_PENDING,
                 fan_out_delay_s: float = FAN_OUT_DELAY_S) -> None:
        if not isinstance(node.state_machine, ClusterStore):
            raise TypeError("WatchHub needs a node serving a ClusterStore, not "
                            f"{type(node.state_machine).__name__}")
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        if not fan_out_delay_s >= 0:
            raise ValueError(f"fan_out_delay_s must be >= 0, not {fan_out_delay_s}")
        self._node = node
        self._store: ClusterStore = node.state_machine
        self.max_pending = max_pending
        self._delay = fan_out_delay_s
        self._watchers: set[_Watcher] = set()
        self._last = -1  # the newest revision handed to the watchers
        self._timer: asyncio.TimerHandle | None = None
        self._fanned_at = -math.inf  # loop time of the last fan-out
        self._idle: asyncio.TimerHandle | None = None  # a timer, not a task: nothing to
        # cancel-and-await when the loop goes away with streams still open
        self.batches_sent = 0  # fan-outs that found new events (for tests and metrics)
        self.dropped = 0  # watchers dropped for falling behind

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    @property
    def fan_out_interval(self) -> float:
        """The least time between two fan-outs, for this many watchers (seconds): the
        hub's ``fan_out_delay_s`` and what the watchers add, up to FAN_OUT_DELAY_MAX_S
        (with the default delay; the watchers add at most the difference to any other)."""
        grown = FAN_OUT_DELAY_PER_WATCHER_S * len(self._watchers)
        return self._delay + min(grown, FAN_OUT_DELAY_MAX_S - FAN_OUT_DELAY_S)

    # ------------------------------------------------------------------ subscriptions
    async def watch(self, since: int, *, dropped: asyncio.Event | None = None
                    ) -> AsyncGenerator[list[Batch], None]:
        """The batches after revision ``since``, several at a time when the consumer is
        slower than the fan-out; ``EventsCompacted`` when it fell too far behind or the
        store no longer keeps what it asks for. ``dropped`` is set the moment the watcher
        is dropped (for a consumer that waits on something else before taking more)."""
        watcher = self._subscribe(since, dropped)
        try:
            while True:
                if watcher.batches:
                    batches = list(watcher.batches)
                    watcher.batches.clear()
                    watcher.pending = 0
                    watcher.taken = batches[-1].last
                    yield batches
                    continue
                if watcher.compacted is not None:
                    raise watcher.compacted
                watcher.wake.clear()
                await watcher.wake.wait()
        finally:
            self._watchers.discard(watcher)
            if not self._watchers:
                self._unhook()

    def _subscribe(self, since: int, dropped: asyncio.Event | None) -> _Watcher:
        if not self._watchers:
            self._hook()
        else:
            self._fan_out()  # bring the others up to now: everything kept is then <= _last
        events = self._store.events_since(since)  # EventsCompacted: nothing subscribed
        watcher = _Watcher(since, dropped)
        if events:
            watcher.batches.append(Batch(events))
            watcher.pending = len(events)
            watcher.queued = events[-1].revision
        self._watchers.add(watcher)
        return watcher

    def _hook(self) -> None:
        kept = self._store.events.events
        self._last = kept[-1].revision if kept else self._store.events.floor
        self._node.on_apply.append(self._applied)
        self._idle = asyncio.get_running_loop().call_later(IDLE_CHECK_S, self._idle_check)

    def _unhook(self) -> None:
        with contextlib.suppress(ValueError):
            self._node.on_apply.remove(self._applied)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    # ------------------------------------------------------------------ fan-out
    def _applied(self, position: int, commands: Sequence[Command],
                 results: Sequence[bytes]) -> None:
        # Called right after commands apply, on the node's loop: just arm the timer.
        self._arm()

    def _arm(self) -> None:
        # An interval after the last fan-out, not after this call: a change that waited for
        # nothing goes out as soon as its turn is over (a timer due now runs after it), and
        # a loop running late catches up instead of adding its lateness to every batch.
        if self._timer is None:
            loop = asyncio.get_running_loop()
            due = max(loop.time(), self._fanned_at + self.fan_out_interval)
            self._timer = loop.call_at(due, self._fan_out)

    def _idle_check(self) -> None:
        self._idle = asyncio.get_running_loop().call_later(IDLE_CHECK_S, self._idle_check)
        self._arm()  # on the same schedule as after an apply

    def _fan_out(self) -> None:
        if self._timer is not None:  # called early (a new watcher): the batch goes out now
            self._timer.cancel()
            self._timer = None
        try:
            events = self._store.events_since(self._last)
        except EventsCompacted as exc:  # more changed than the store keeps: nobody can tell
            self._compact_all(exc.oldest)
            return
        if not events:
            return
        self._fanned_at = asyncio.get_running_loop().time()
        batch = Batch(events)
        self._last = batch.last
        self.batches_sent += 1
        for watcher in self._watchers:
            if watcher.compacted is not None:
                continue
            if watcher.queued >= batch.last:
                continue  # subscribed from a later revision
            if watcher.queued >= events[0].revision:
                part = Batch([e for e in events if e.revision > watcher.queued])
            else:
                part = batch
            self._offer(watcher, part)

    def _offer(self, watcher: _Watcher, batch: Batch) -> None:
        if watcher.pending and watcher.pending + len(batch.events) > self.max_pending:
            # Not waited for, not buffered: dropped, it re-reads and watches again.
            self._drop(watcher, EventsCompacted(watcher.taken, self._last))
            return
        watcher.batches.append(batch)
        watcher.pending += len(batch.events)
        watcher.queued = batch.last
        watcher.wake.set()

    def _drop(self, watcher: _Watcher, why: EventsCompacted) -> None:
        # What it was sent is delivered; what it has not taken yet is dropped with the rest.
        watcher.batches.clear()
        watcher.pending = 0
        watcher.compacted = why
        watcher.wake.set()
        if watcher.dropped is not None:
            watcher.dropped.set()
        self.dropped += 1

    def _compact_all(self, oldest: int) -> None:
        kept = self._store.events.events
        self._last = kept[-1].revision if kept else max(oldest, self._store.events.floor)
        for watcher in self._watchers:
            if watcher.compacted is not None:
                continue
            try:
                events = self._store.events_since(watcher.queued)
            except EventsCompacted:
                self._drop(watcher, EventsCompacted(watcher.taken, self._last))
                continue
            if events:  # its own batch: this happens once per snapshot, not per turn
                self._offer(watcher, Batch(events))
