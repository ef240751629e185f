"""The membership rules (``consensus.protocol.membership.config``): one change at a time,
learners first, ids never reused, the next epoch's voters and sequencer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus.protocol.membership.config import (
    ADD,
    EPOCH_SHIFT,
    MAX_INFO_BYTES,
    NO_MEMBER,
    PROMOTE,
    PUBLISH,
    REMOVE,
    REPLACE,
    Change,
    Configuration,
    apply_change,
    bootstrap,
    decode_change,
    encode_change,
    next_epoch,
)


def applied(config: Configuration, *changes: Change) -> Configuration:
    for change in changes:
        config, result = apply_change(config, change)
        assert result.startswith("ok"), result
    return config


def test_a_learner_joins_then_is_promoted_in_the_next_epoch() -> None:
    config, result = apply_change(bootstrap(3), Change(ADD))
    assert result == "ok: 3 added as a learner"
    assert config.learners == (3,) and config.voters == (0, 1, 2) and config.next_id == 4
    config, result = apply_change(config, Change(PROMOTE, 3))
    assert config.closing == PROMOTE and "epoch closes" in result
    after = next_epoch(config, seal_slot=41)
    assert (after.epoch, after.base, after.voters, after.learners) == (1, 42, (0, 1, 2, 3), ())
    assert not after.closing and after.member(3) is not None and after.member(3).voter  # type: ignore[union-attr]


def test_sizes_three_four_five_four_three() -> None:
    config, sizes = bootstrap(3), [3]
    for new in (3, 4):
        config = next_epoch(applied(config, Change(ADD, new), Change(PROMOTE, new)), 0)
        sizes.append(len(config.voters))
    for old in (0, 1):
        config = next_epoch(applied(config, Change(REMOVE, old)), 0)
        sizes.append(len(config.voters))
    assert sizes == [3, 4, 5, 4, 3] and config.voters == (2, 3, 4) and config.epoch == 4


def test_removing_the_sequencer_moves_it_to_the_next_voter() -> None:
    config = next_epoch(applied(bootstrap(3), Change(REMOVE, 0)), 10)
    assert config.voters == (1, 2)
    assert config.start_view % len(config.voters) == 0  # index 0 (member 1) leads it
    assert config.start_view >> EPOCH_SHIFT == 1


def test_replace_swaps_one_voter_for_another_in_one_epoch() -> None:
    config = applied(bootstrap(3), Change(REPLACE, NO_MEMBER, replaces=1, info="x"))
    assert config.learners == (3,) and config.member(3).replaces == 1  # type: ignore[union-attr]
    config = next_epoch(applied(config, Change(PROMOTE, 3)), 5)
    assert config.voters == (0, 2, 3) and config.member(1) is None


@pytest.mark.parametrize(("change", "why"), [
    (Change(ADD, 1), "never reused"),
    (Change(PROMOTE, 1), "voter already"),
    (Change(PROMOTE, 9), "not a member"),
    (Change(REMOVE, 9), "not a member"),
    (Change(REPLACE, replaces=9), "not a voter"),
    (Change(""), "malformed"),
])
def test_impossible_changes_are_refused_and_change_nothing(change: Change, why: str) -> None:
    config = bootstrap(3)
    after, result = apply_change(config, change)
    assert after == config and result.startswith("refused") and why in result


def test_one_change_at_a_time() -> None:
    learning = applied(bootstrap(3), Change(ADD))
    for change in (Change(ADD), Change(REMOVE, 0), Change(REPLACE, replaces=0)):
        after, result = apply_change(learning, change)
        assert after == learning and "one change at a time" in result
    # the learner's own promotion or removal (which cancels it) is taken
    assert apply_change(learning, Change(PROMOTE, 3))[1].startswith("ok")
    cancelled = applied(learning, Change(REMOVE, 3))
    assert cancelled.learners == () and cancelled.next_id == 4  # 3 is never reused
    closing = applied(bootstrap(3), Change(REMOVE, 2))
    for change in (Change(ADD), Change(REMOVE, 1)):
        assert "one change at a time" in apply_change(closing, change)[1]


def test_the_last_voter_stays() -> None:
    config = bootstrap(1)
    assert "last voter" in apply_change(config, Change(REMOVE, 0))[1]


def test_publish_sets_a_members_info_at_any_time_and_survives_epochs() -> None:
    # a cluster's first members carry no info: each publishes its own
    config, result = apply_change(bootstrap(3), Change(PUBLISH, 1, info="where-1"))
    assert result == "ok: member 1 published its info"
    assert config.member(1).info == "where-1"  # type: ignore[union-attr]
    assert config.voters == (0, 1, 2) and config.next_id == 3 and config.epoch == 0
    again, result = apply_change(config, Change(PUBLISH, 1, info="where-1"))
    assert again == config and result == "ok: member 1's info is unchanged"
    # one change at a time does not hold it up: no voter changes
    busy = applied(config, Change(ADD, info="new"), Change(PROMOTE, 3))
    busy = applied(busy, Change(PUBLISH, 3, info="moved"), Change(PUBLISH, 0, info="where-0"))
    after = next_epoch(busy, seal_slot=9)
    assert [m.info for m in after.members] == ["where-0", "where-1", "", "moved"]


def test_publishing_for_no_member_is_refused_and_changes_nothing() -> None:
    removed = next_epoch(applied(bootstrap(3), Change(REMOVE, 2)), 4)
    for member in (2, 7):
        after, result = apply_change(removed, Change(PUBLISH, member, info="x"))
        assert after == removed and result == f"refused: {member} is not a member"


@given(kind=st.sampled_from([ADD, REPLACE, PROMOTE, REMOVE, PUBLISH]),
       member=st.integers(-1, 1 << 20), replaces=st.integers(-1, 1 << 20),
       incarnation=st.integers(1, 1 << 20), info=st.text(max_size=40))
def test_changes_round_trip(kind: str, member: int, replaces: int, incarnation: int,
                            info: str) -> None:
    change = Change(kind, member, replaces, incarnation, info)
    assert decode_change(encode_change(change)) == change


@pytest.mark.parametrize("op", [
    b"\xc1member:{", b"\xc1member:[]", b'\xc1member:{"kind":"add"}',
    b'\xc1member:{"kind":"add","member":-5,"replaces":-1,"incarnation":1,"info":""}',
    b'\xc1member:{"kind":"nuke","member":1,"replaces":-1,"incarnation":1,"info":""}',
    b'\xc1member:{"kind":"add","member":1,"replaces":-1,"incarnation":0,"info":""}',
])
def test_malformed_changes_decode_to_a_refused_one(op: bytes) -> None:
    change = decode_change(op)
    assert change is not None and change.kind == ""
    assert apply_change(bootstrap(3), change)[1].startswith("refused")


def test_other_ops_are_no_changes_and_info_is_bounded() -> None:
    assert decode_change(b"\x93\xa3put") is None  # a state machine's msgpack op
    long = Change(ADD, info="x" * (MAX_INFO_BYTES + 1))
    assert decode_change(encode_change(long)) == Change("")
