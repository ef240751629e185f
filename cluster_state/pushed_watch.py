"""``PushedWatch``: every watch of a process over the replicas' pushed gRPC stream, one stream
per target however many watch (as etcd's gRPC proxy coalesces its clients' watchers).

A *feed* is one ``WatchAcked`` stream. It decodes each message once and hands the same page
(a tuple of events, shared: nobody may change it) to every watcher it serves, each from its
own start revision. A watcher's memory is a queue of references to shared pages, bounded by
``max_pending`` events as the replica bounds a stream (``WatchHub``): one that reads more
slowly than the others is not waited for. Its queue is dropped and its watch raises
``EventsCompacted`` once it took what it was given, while the others sharing the feed go on.
The feed acknowledges what its fastest watcher took (``ACK_EVERY`` events at a time), so the
replica sends at the pace of the fastest reader, not of the slowest; when none reads (a lone
watcher that stopped, or a whole process too slow), the replica stops sending and, its queue
for the stream full, cuts it: each of the feed's watchers ends with ``EventsCompacted`` after
what it was sent. A broken stream resumes at the next target after the last revision the
feed saw (messages hold whole revisions), and its watchers notice nothing.

A feed keeps the events of its last few messages (``max_pending`` events at most), so a
watcher that starts while one already runs joins it if its start revision is at or after the
oldest revision the feed can still replay; otherwise it gets a stream of its own that is
folded into the shared one as soon as the shared one can replay what it misses (its watchers
then move over, and the extra stream ends). A watch *from now* (``from_now``) is such a
stream too: the replica reads its revision linearizably and sends that first (see
``WatchRequest.from_now``), so a lagging replica never starts it before what the cluster
acknowledged; it joins the shared stream once that one reaches the revision.

The queueing is sans-I/O (``Feed``, ``Subscriber``: no gRPC, tested alone); behind each
``PushedWatch`` a ``_Streams`` runs a task per feed and moves watchers between feeds (one per
process and loop for the same replicas and credentials, with ``PushedWatch.shared``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

from cluster_state.errors import ClusterStateError, EventsCompacted, OlderReplica
from cluster_state.events import ChangeEvent
from cluster_state.watch_hub import ACK_EVERY, DEFAULT_MAX_PENDING
from consensus.errors import IndefiniteFailure

if TYPE_CHECKING:
    import grpc

    from cluster_state.grpc_api import cluster_state_pb2 as pb

__all__ = ["Feed", "Page", "PushedWatch", "Subscriber"]

#: the gRPC status codes after which a pushed watch resumes at the next target
_WATCH_RETRY_CODES = ("UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED", "INTERNAL", "UNKNOWN")
#: a pushed watch gives up after this many broken streams in a row without an event
_WATCH_ATTEMPTS = 6
#: ... pausing this long between rounds over every target
_WATCH_RETRY_PAUSE_S = 0.2

#: a page of events: in revision order, whole revisions, shared by the watchers it reaches
Page = tuple[ChangeEvent, ...]


class Subscriber:
    """One watch: its queue of pages, where it is, and how it ended."""

    __slots__ = ("done", "error", "feed", "pages", "pending", "queued", "taken", "wake")

    def __init__(self, since: int) -> None:
        self.pages: deque[Page] = deque()
        self.pending = 0  # events in ``pages``
        self.queued = since  # the newest revision offered to it (or where it starts)
        self.taken = since  # the newest revision it took
        self.done = False  # once ``pages`` is empty: raise ``error``, or end (None)
        self.error: BaseException | None = None
        self.wake = asyncio.Event()
        self.feed: Feed | None = None

    def take(self) -> Page | None:
        """Everything queued, as one page (None if nothing is)."""
        if not self.pages:
            return None
        pages = self.pages
        page = pages[0] if len(pages) == 1 else tuple(itertools.chain.from_iterable(pages))
        self.pages = deque()
        self.pending = 0
        self.taken = page[-1].revision
        if self.feed is not None:
            self.feed.took(self.queued)
        return page

    def end(self, error: BaseException | None) -> None:
        self.done = True
        self.error = error
        self.wake.set()


class Feed:
    """What one stream delivered, handed to the subscribers it serves (module docstring).
    ``position``: the newest revision the stream covered (None until a stream from now was
    told where it starts); it can replay every event after ``floor``."""

    __slots__ = ("ack", "ack_wanted", "consumed", "dropped", "floor", "home", "kept", "limit",
                 "position", "progress", "ring", "subscribers", "task", "unacked")

    def __init__(self, home: int, since: int | None, limit: int = DEFAULT_MAX_PENDING) -> None:
        if limit < 1:
            raise ValueError("max_pending must be at least 1")
        self.home = home  # the target it starts at
        self.limit = limit
        self.position = since
        self.floor = since
        self.ring: deque[tuple[int, Page]] = deque()  # (through, events) of recent messages
        self.kept = 0  # events in ``ring``
        self.subscribers: dict[Subscriber, None] = {}  # in the order they came
        self.dropped = 0  # subscribers dropped for falling behind
        self.task: asyncio.Task[None] | None = None
        # the stream's flow: (through, events and skipped ones) of the messages not yet
        # acknowledged, the newest revision a watcher took everything through, the events
        # taken since the last ack, and the ack to send (``ack_wanted`` is set)
        self.unacked: deque[tuple[int, int]] = deque()
        self.progress = since if since is not None else -1
        self.consumed = 0
        self.ack = -1
        self.ack_wanted = asyncio.Event()

    def serves(self, since: int) -> bool:
        """Whether a watch from ``since`` can join: the feed replays everything after it."""
        return self.floor is not None and self.floor <= since

    def opened(self) -> None:
        """A new stream: the replica counts only what it sends on it."""
        self.unacked.clear()
        self.consumed = 0
        self.ack_wanted.clear()

    def begin(self, revision: int) -> None:
        """A stream from now starts after ``revision`` (its first message)."""
        self.position = self.floor = self.progress = revision
        for subscriber in self.subscribers:
            subscriber.queued = subscriber.taken = revision

    def add(self, subscriber: Subscriber) -> None:
        """Serve ``subscriber`` from now on, after what the feed can replay for it."""
        assert self.floor is None or self.floor <= subscriber.queued, "the feed cannot serve it"
        subscriber.feed = self
        self.subscribers[subscriber] = None
        for through, events in self.ring:
            if through > subscriber.queued:
                self._offer(subscriber, through, events)

    def remove(self, subscriber: Subscriber) -> None:
        self.subscribers.pop(subscriber, None)
        if subscriber.feed is self:
            subscriber.feed = None

    def deliver(self, through: int, events: Page, skipped: int = 0) -> None:
        """One message: the events after ``position`` through revision ``through`` (and
        ``skipped`` more the replica left out for this client)."""
        self.position = through
        self.unacked.append((through, len(events) + skipped))
        if events:
            self.ring.append((through, events))
            self.kept += len(events)
            while self.kept > self.limit:
                self.floor, dropped = self.ring.popleft()
                self.kept -= len(dropped)
        for subscriber in list(self.subscribers):
            self._offer(subscriber, through, events)

    def took(self, revision: int) -> None:
        """A watcher took everything through ``revision``: every ``ACK_EVERY`` events so
        taken, an ack is wanted (``ack``, ``ack_wanted``)."""
        assert self.position is not None
        self.progress = max(self.progress, min(revision, self.position))
        while self.unacked and self.unacked[0][0] <= self.progress:
            through, count = self.unacked.popleft()
            self.consumed += count
            if self.consumed >= ACK_EVERY:
                self.ack, self.consumed = through, 0
                self.ack_wanted.set()

    def end(self, error: BaseException | None) -> None:
        """The stream ended for good: each subscriber raises ``error`` after what it was
        given (the replica's cut as ``EventsCompacted`` after the revision it was offered
        last), or just ends (None)."""
        for subscriber in list(self.subscribers):
            self.remove(subscriber)
            if isinstance(error, EventsCompacted):
                subscriber.end(EventsCompacted(subscriber.queued, error.oldest))
            else:
                subscriber.end(error)

    def _offer(self, subscriber: Subscriber, through: int, events: Page) -> None:
        part: Page = ()
        if through > subscriber.queued:
            part = events
            if events and events[0].revision <= subscriber.queued:
                part = tuple(e for e in events if e.revision > subscriber.queued)
            subscriber.queued = through
        if not part:
            if not subscriber.pending:  # nothing for it and nothing held: as good as taken
                self.took(through)
            return
        if subscriber.pending and subscriber.pending + len(part) > self.limit:
            # Not waited for, not buffered: dropped; it re-reads and watches again.
            subscriber.pages.clear()
            subscriber.pending = 0
            self.remove(subscriber)
            self.dropped += 1
            subscriber.end(EventsCompacted(subscriber.taken, through))
            return
        subscriber.pages.append(part)
        subscriber.pending += len(part)
        subscriber.wake.set()


#: what ``PushedWatch.shared`` tells apart: the loop (a gRPC channel belongs to one), the
#: targets and the credentials object
_SharedKey = tuple[asyncio.AbstractEventLoop, tuple[str, ...], object]
_shared: dict[_SharedKey, _Streams] = {}


class PushedWatch:
    """Watch streams pushed by the replicas' gRPC service (``WatchAcked``), one channel per
    target and one stream per target for every ``watch`` started there (module docstring).
    ``close`` ends this object's watches; the streams end with the last user of them."""

    def __init__(self, targets: Sequence[str], *,
                 credentials: grpc.ChannelCredentials | None = None,
                 max_pending: int = DEFAULT_MAX_PENDING) -> None:
        """``credentials``: a TLS cluster's (``cluster_state.grpc_api.tls``);
        ``max_pending``: the events a watcher may have queued here before it is dropped with
        ``EventsCompacted`` (and what a stream keeps to let a later watcher join)."""
        self._streams = _Streams(targets, credentials, max_pending)
        self._mine: dict[Subscriber, None] = {}
        self._closed = False

    @classmethod
    def shared(cls, targets: Sequence[str], *,
               credentials: grpc.ChannelCredentials | None = None) -> PushedWatch:
        """A ``PushedWatch`` over this process's streams to ``targets`` (with this
        ``credentials`` object) on the running event loop: every ``AllocationStore``
        connected to the same replicas shares them. Without a running loop, its own."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return cls(targets, credentials=credentials)
        key = (loop, tuple(targets), credentials)
        streams = _shared.get(key)
        if streams is None:
            streams = _shared[key] = _Streams(targets, credentials, DEFAULT_MAX_PENDING, key)
        else:
            streams.users += 1
        pushed = cls.__new__(cls)
        pushed._streams, pushed._mine, pushed._closed = streams, {}, False
        return pushed

    @property
    def targets(self) -> list[str]:
        return self._streams.targets

    @property
    def streams(self) -> int:
        """The streams open (or opening) now, for every user of them."""
        return len(self._streams.feeds)

    @property
    def dropped(self) -> int:
        """Watchers dropped so far for falling behind, by every user of the streams."""
        streams = self._streams
        return streams.dropped + sum(feed.dropped for feed in streams.feeds)

    async def watch(self, since: int = -1, first: int = 0, *, from_now: bool = False
                    ) -> AsyncGenerator[Page, None]:
        """Pages of events after ``since`` (``from_now``: after the revision the cluster is
        at now, read linearizably; leave ``since`` out then), from target ``first`` on:
        everything queued for this watcher at once, in order, once each. Raises
        ``EventsCompacted`` if the replica no longer keeps what it asks for, or this watcher
        (or the whole process) read too slowly; ``IndefiniteFailure`` after
        ``_WATCH_ATTEMPTS`` rounds over the targets without an event. Ends once ``close``
        was called and it took what it was given."""
        if from_now and since != -1:
            raise ValueError("a watch starts at since or from now, not both")
        if self._closed:
            raise ClusterStateError("this PushedWatch is closed")
        subscriber = Subscriber(since)
        self._streams.attach(subscriber, first, from_now)
        self._mine[subscriber] = None
        try:
            while True:
                page = subscriber.take()
                if page is not None:
                    yield page
                    continue
                if subscriber.done:
                    if subscriber.error is not None:
                        raise subscriber.error
                    return
                subscriber.wake.clear()
                await subscriber.wake.wait()
        finally:
            self._mine.pop(subscriber, None)
            self._streams.detach(subscriber)

    async def __aenter__(self) -> PushedWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """End this object's watches (each once it took what it was given, no error) and,
        with the last user of them, the streams."""
        if self._closed:
            return
        self._closed = True
        for subscriber in list(self._mine):
            self._streams.detach(subscriber)
            if not subscriber.done:  # one dropped meanwhile still says so
                subscriber.end(None)
        self._streams.users -= 1
        if self._streams.users == 0:
            await self._streams.close()


class _Streams:
    """The channels and streams behind one or more ``PushedWatch``: feeds, each run by a
    task, and the moves of watchers between them."""

    def __init__(self, targets: Sequence[str], credentials: grpc.ChannelCredentials | None,
                 max_pending: int, key: _SharedKey | None = None) -> None:
        import grpc

        from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc
        from cluster_state.grpc_api.tls import CHANNEL_OPTIONS

        if not targets:
            raise ValueError("PushedWatch needs at least one gRPC target (host:port)")
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self.targets = list(targets)
        self.max_pending = max_pending
        self._channels = [
            grpc.aio.insecure_channel(target) if credentials is None
            else grpc.aio.secure_channel(target, credentials, options=CHANNEL_OPTIONS)
            for target in self.targets
        ]
        self._stubs = [pb_grpc.AllocationServiceStub(c)  # type: ignore[no-untyped-call]
                       for c in self._channels]
        self.feeds: list[Feed] = []
        self.users = 1  # the ``PushedWatch`` objects over it not closed yet
        self.dropped = 0  # watchers the feeds that ended dropped
        self._key = key  # where ``_shared`` holds it, if it does

    async def close(self) -> None:
        if self._key is not None:
            del _shared[self._key]
        tasks = [feed.task for feed in self.feeds if feed.task is not None]
        for feed in list(self.feeds):
            self._retire(feed)
            feed.end(None)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for channel in self._channels:
            await channel.close()

    # ------------------------------------------------------------------ feeds
    def attach(self, subscriber: Subscriber, first: int, from_now: bool) -> None:
        home = first % len(self._stubs)
        if not from_now:
            for feed in self.feeds:
                if feed.home == home and feed.serves(subscriber.queued):
                    feed.add(subscriber)
                    return
        feed = Feed(home, None if from_now else subscriber.queued, self.max_pending)
        feed.add(subscriber)
        self.feeds.append(feed)
        feed.task = asyncio.ensure_future(self._run(feed))

    def detach(self, subscriber: Subscriber) -> None:
        feed = subscriber.feed
        if feed is None:
            return
        feed.remove(subscriber)
        if not feed.subscribers:
            self._retire(feed)

    def _retire(self, feed: Feed) -> None:
        if feed in self.feeds:
            self.feeds.remove(feed)
            self.dropped += feed.dropped
        if feed.task is not None and feed.task is not asyncio.current_task():
            feed.task.cancel()

    def _coalesce(self, feed: Feed) -> None:
        """Fold ``feed`` and another stream of the same target into one when one of them can
        replay what the other's watchers miss: the one behind moves over to the other."""
        if feed.position is None:
            return
        for other in self.feeds:
            if other is feed or other.home != feed.home or other.position is None:
                continue
            if other.serves(feed.position) and feed.position <= other.position:
                behind, ahead = feed, other
            elif feed.serves(other.position) and other.position <= feed.position:
                behind, ahead = other, feed
            else:
                continue
            for subscriber in list(behind.subscribers):
                behind.remove(subscriber)
                ahead.add(subscriber)
            self._retire(behind)
            return

    async def _run(self, feed: Feed) -> None:
        try:
            await self._stream(feed)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the end of every watch it serves
            feed.end(exc)
        finally:
            self._retire(feed)

    async def _stream(self, feed: Feed) -> None:
        """Run ``feed``'s stream, at the next target when one breaks, while it serves."""
        import grpc

        from cluster_state.grpc_api import cluster_state_pb2 as pb

        k, failures, n = feed.home, 0, len(self._stubs)
        while feed.subscribers:
            call = self._stubs[k].WatchAcked()
            feed.opened()
            acks = asyncio.ensure_future(self._acknowledge(feed, call))
            try:
                start = (pb.WatchRequest(since=-1, typed=True, from_now=True)
                         if feed.position is None
                         else pb.WatchRequest(since=feed.position, typed=True))
                await call.write(pb.WatchControl(start=start))
                async for batch in call:
                    if batch.compacted:
                        raise EventsCompacted(batch.revision, batch.oldest)
                    if feed.position is None:
                        self._begin(feed, batch, self.targets[k])
                    elif self._deliver(feed, batch):
                        failures = 0
                    if not feed.subscribers:
                        return  # every watcher left (or moved to another stream)
                broke = "the stream ended"  # the server is stopping: resume elsewhere
            except grpc.aio.AioRpcError as exc:
                if exc.code().name not in _WATCH_RETRY_CODES:
                    raise
                broke = str(exc.details())
            finally:
                acks.cancel()
                call.cancel()
            failures += 1
            if failures >= _WATCH_ATTEMPTS * n:
                raise IndefiniteFailure(f"no watch stream from {self.targets}: {broke}")
            k = (k + 1) % n
            if k == feed.home:
                await asyncio.sleep(_WATCH_RETRY_PAUSE_S)

    @staticmethod
    async def _acknowledge(feed: Feed, call: Any) -> None:
        """Write the acks ``feed`` wants on ``call`` (alongside its reads)."""
        from cluster_state.grpc_api import cluster_state_pb2 as pb

        while not call.done():
            await feed.ack_wanted.wait()
            feed.ack_wanted.clear()
            # a stream the replica ended OK refuses writes: its reads end it
            with contextlib.suppress(asyncio.InvalidStateError):
                await call.write(pb.WatchControl(ack=feed.ack))

    def _begin(self, feed: Feed, batch: pb.EventBatch, target: str) -> None:
        if batch.events or batch.skipped:
            raise OlderReplica(f"the replica at {target} does not start watches from now (a "
                               "build before WatchRequest.from_now): watch from a revision")
        feed.begin(batch.through)
        self._coalesce(feed)

    def _deliver(self, feed: Feed, batch: pb.EventBatch) -> bool:
        """Hand one message to ``feed``'s watchers; whether it held events."""
        from cluster_state.grpc_api.convert import event_from_pb

        events = tuple(event_from_pb(e) for e in batch.events)
        through = max(batch.through, events[-1].revision) if events else batch.through
        assert feed.position is not None
        if through > feed.position:
            feed.deliver(through, events, batch.skipped)
            self._coalesce(feed)
        return bool(events)
