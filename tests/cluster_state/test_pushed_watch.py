"""The local fan-out of a shared watch stream (``cluster_state.pushed_watch``), alone: no gRPC.
A feed hands each message to every watcher it serves, each from its own start revision; a
watcher that falls beyond its bound is dropped with ``EventsCompacted`` and the others do not
notice; a later watcher joins where the feed can replay for it; the stream is acknowledged as
far as its fastest watcher took; a stream's end reaches every watcher after what it was
given."""

from __future__ import annotations

import asyncio

import pytest

from cluster_state.errors import EventsCompacted
from cluster_state.events import ChangeEvent
from cluster_state.pushed_watch import Feed, Page, Subscriber
from cluster_state.watch_hub import ACK_EVERY
from consensus.errors import IndefiniteFailure


def page(*revisions: int) -> Page:
    """One message's events: one per revision listed (a revision listed twice: two events)."""
    return tuple(ChangeEvent(r, "released", f"g{r}.{k}", ())
                 for k, r in enumerate(revisions))


def revisions(events: Page | None) -> list[int]:
    return [e.revision for e in events or ()]


def subscribed(feed: Feed, since: int) -> Subscriber:
    subscriber = Subscriber(since)
    feed.add(subscriber)
    return subscriber


def test_each_watcher_takes_the_events_after_its_own_start_once_in_order() -> None:
    async def run() -> None:
        feed = Feed(0, -1)
        early, later, beyond = subscribed(feed, -1), subscribed(feed, 3), subscribed(feed, 7)
        first = page(2, 3, 3, 5)
        feed.deliver(5, first)
        feed.deliver(9, page(8, 9))
        assert revisions(early.take()) == [2, 3, 3, 5, 8, 9]  # two messages, one page
        assert revisions(later.take()) == [5, 8, 9]
        assert revisions(beyond.take()) == [8, 9]
        assert early.take() is None and early.taken == 9
        # a message reaching every watcher whole is the same tuple for all: nothing copied
        other = subscribed(feed, 9)
        feed.deliver(12, shared := page(11, 12))
        assert early.take() is shared and other.take() is shared

    asyncio.run(run())


def test_a_watcher_beyond_its_bound_is_dropped_and_the_others_are_not() -> None:
    async def run() -> None:
        feed = Feed(0, -1, limit=4)
        slow, fast = subscribed(feed, -1), subscribed(feed, -1)
        feed.deliver(1, page(1))
        assert revisions(slow.take()) == [1]  # it took one page, then reads no more
        seen = revisions(fast.take())
        for r in range(2, 12):
            feed.deliver(r, page(r))
            seen += revisions(fast.take())
            assert slow.pending <= 4  # what it holds, at any time
        assert seen == list(range(1, 12))
        assert feed.dropped == 1 and slow.feed is None and list(feed.subscribers) == [fast]
        assert slow.take() is None  # holds nothing once dropped ...
        assert slow.done and isinstance(slow.error, EventsCompacted)
        assert slow.error.revision == 1  # ... and says what it took
        # a watcher with nothing queued takes a message of any size (it is shared)
        feed.deliver(20, big := page(*range(12, 21)))
        assert fast.take() is big and feed.dropped == 1

    asyncio.run(run())


def test_a_later_watcher_joins_where_the_feed_can_replay_for_it() -> None:
    async def run() -> None:
        feed = Feed(0, -1, limit=4)
        subscribed(feed, -1)
        feed.deliver(2, page(1, 2))
        feed.deliver(4, page(3, 4))
        assert feed.floor == -1 and feed.serves(-1)
        joined = subscribed(feed, 1)
        assert revisions(joined.take()) == [2, 3, 4]  # replayed from the kept messages
        feed.deliver(6, page(5, 6))  # the feed keeps 4 events: the oldest message goes
        assert feed.floor == 2 and feed.kept == 4
        assert not feed.serves(1) and feed.serves(2)
        assert revisions(subscribed(feed, 3).take()) == [4, 5, 6]
        # a message with no events (a TLS scheduler's, all left out) moves the feed on only
        feed.deliver(8, ())
        assert feed.position == 8 and feed.serves(7)
        assert subscribed(feed, 7).take() is None

    asyncio.run(run())


def test_a_watch_from_now_starts_where_the_replica_says() -> None:
    async def run() -> None:
        feed = Feed(0, None)
        watcher = subscribed(feed, -1)
        assert not feed.serves(-1) and not feed.serves(10 ** 9)  # nobody joins it yet
        feed.begin(41)
        assert watcher.queued == 41 and feed.serves(41) and not feed.serves(40)
        feed.deliver(43, page(42, 43))
        assert revisions(watcher.take()) == [42, 43]

    asyncio.run(run())


def test_the_end_of_a_stream_reaches_each_watcher_after_what_it_was_given() -> None:
    async def run() -> None:
        feed = Feed(0, -1)
        behind, ahead, quiet = subscribed(feed, -1), subscribed(feed, 2), subscribed(feed, -1)
        feed.deliver(3, page(1, 3))
        assert revisions(quiet.take()) == [1, 3]
        feed.end(EventsCompacted(3, 7))  # the replica cut the stream
        assert not feed.subscribers and behind.feed is None
        assert revisions(behind.take()) == [1, 3]  # what it was given first
        for watcher in (behind, ahead):
            assert watcher.done and isinstance(watcher.error, EventsCompacted)
            assert (watcher.error.revision, watcher.error.oldest) == (3, 7)
        other = Feed(0, -1)
        failed, closed = subscribed(other, -1), subscribed(Feed(1, -1), -1)
        other.end(failure := IndefiniteFailure("no watch stream"))
        assert failed.error is failure
        assert closed.feed is not None
        closed.feed.end(None)  # closed: it ends, nothing raised
        assert closed.done and closed.error is None

    asyncio.run(run())


def test_a_feed_refuses_an_impossible_bound() -> None:
    with pytest.raises(ValueError, match="max_pending"):
        Feed(0, -1, limit=0)


def test_the_stream_is_acknowledged_as_far_as_its_fastest_watcher_took() -> None:
    async def run() -> None:
        feed = Feed(0, -1, limit=4 * ACK_EVERY)
        fast, slow = subscribed(feed, -1), subscribed(feed, -1)
        half = ACK_EVERY // 2
        feed.deliver(half, page(*range(1, half + 1)))
        feed.deliver(ACK_EVERY, page(*range(half + 1, ACK_EVERY + 1)))
        assert not feed.ack_wanted.is_set()  # handed out, taken by nobody: not acknowledged
        assert fast.take() is not None
        assert feed.ack_wanted.is_set() and feed.ack == ACK_EVERY  # taken by one is enough
        feed.ack_wanted.clear()
        # a message with nothing for a watcher that holds nothing is as good as taken
        beyond = subscribed(feed, 10 * ACK_EVERY)
        feed.deliver(2 * ACK_EVERY, page(*range(ACK_EVERY + 1, 2 * ACK_EVERY + 1)))
        assert beyond.take() is None
        assert feed.ack_wanted.is_set() and feed.ack == 2 * ACK_EVERY
        assert slow.pending == 2 * ACK_EVERY  # the slow one still holds what it was given
        # a new stream (resumed elsewhere) owes nothing of the old one
        feed.ack_wanted.clear()
        feed.opened()
        assert not feed.unacked and feed.consumed == 0

    asyncio.run(run())
