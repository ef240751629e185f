import pytest

from cluster_state import ChangeEvent, EventLog, EventsCompacted


def event(revision: int, subject: str = "g") -> ChangeEvent:
    return ChangeEvent(revision, "placed", subject, ("chain", [], revision))


def test_since_returns_events_after_a_revision_in_order() -> None:
    log = EventLog(10)
    for revision, subject in [(1, "a"), (3, "b"), (3, "c"), (7, "d")]:
        log.append(event(revision, subject))
    assert [e.subject for e in log.since(-1)] == ["a", "b", "c", "d"]
    assert [e.subject for e in log.since(1)] == ["b", "c", "d"]
    assert [e.subject for e in log.since(3)] == ["d"]
    assert log.since(7) == [] and log.since(100) == []


def test_the_bound_drops_old_events_and_reports_compaction() -> None:
    log = EventLog(2)
    for revision, subject in [(1, "a"), (3, "b"), (3, "c")]:
        log.append(event(revision, subject))
    assert log.floor == 1
    with pytest.raises(EventsCompacted) as info:
        log.since(0)
    assert (info.value.revision, info.value.oldest) == (0, 1)
    assert [e.subject for e in log.since(1)] == ["b", "c"]
    log.append(event(4, "d"))  # drops b: a watcher at 2 would miss it
    with pytest.raises(EventsCompacted):
        log.since(2)
    assert [e.subject for e in log.since(3)] == ["d"]


def test_state_round_trip() -> None:
    log = EventLog(2)
    for revision in (1, 2, 5):
        log.append(event(revision))
    copy = EventLog(2)
    copy.load_state(log.to_state())
    assert copy.to_state() == log.to_state() and copy.since(1) == log.since(1)
    assert ChangeEvent.from_wire(event(9).to_wire()) == event(9)
    with pytest.raises(ValueError):
        EventLog(0)
