"""The objects made without ``__init__`` on the apply path (``cluster_state.frozen``) are the
objects ``__init__`` makes."""

from dataclasses import dataclass

import msgpack
import pytest
from cs_helpers import multi_chain_config

from cluster_state import ClusterStore, release, submit
from cluster_state.events import ChangeEvent
from cluster_state.frozen import slot_setters
from cluster_state.ops import (
    GroupSpec,
    Member,
    Placed,
    Pod,
    Release,
    Released,
    Submit,
    decode_op,
    decode_result,
    encode_result,
)


def test_a_decoded_spec_is_the_spec_init_makes() -> None:
    op = decode_op(submit("g", "VC1", 7, [(1, 8), (2, 4), (3, 8)], leaf_type="V100",
                          lazy=True))
    expected = GroupSpec(name="g", vc="VC1", priority=7,
                         members=(Member(4, 8), Member(2, 4)), leaf_type="V100", lazy=True)
    assert op == Submit(expected)
    assert isinstance(op, Submit)
    spec = op.spec
    assert hash(spec) == hash(expected) and repr(spec) == repr(expected)
    assert [hash(m) for m in spec.members] == [hash(m) for m in expected.members]
    with pytest.raises(AttributeError):  # still frozen
        spec.name = "h"  # type: ignore[misc]


def test_made_objects_equal_what_init_makes() -> None:
    new = object.__new__
    event = new(ChangeEvent)
    for setter, value in zip(slot_setters(ChangeEvent, "revision", "kind", "subject", "data"),
                             (5, "placed", "g", ("c", [], 5)), strict=True):
        setter(event, value)
    assert event == ChangeEvent(5, "placed", "g", ("c", [], 5))
    placed = new(Placed)
    pods = (Pod(8, "n1", tuple(range(8))),)
    for set_field, value in zip(slot_setters(Placed, "group", "chain", "pods", "token"),
                                ("g", "c", pods, 5), strict=True):
        set_field(placed, value)
    assert placed == Placed("g", "c", pods, 5)
    assert msgpack.packb(placed.pods) == msgpack.packb(Placed("g", "c", pods, 5).pods)


def test_setters_must_name_every_field_in_order() -> None:
    with pytest.raises(TypeError, match="declares"):
        slot_setters(Member, "leaves", "pods")
    with pytest.raises(TypeError, match="declares"):
        slot_setters(Member, "pods")

    @dataclass(frozen=True)
    class NoSlots:
        a: int

    with pytest.raises(TypeError, match="slotted"):
        slot_setters(NoSlots, "a")

    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            assert self.a >= 0

    with pytest.raises(TypeError, match="__post_init__"):
        slot_setters(Checked, "a")


def test_a_release_and_its_answer_are_what_init_makes() -> None:
    store = ClusterStore(multi_chain_config())
    assert isinstance(store.allocator.submit(
        GroupSpec(name="g", vc="VC1", priority=1, members=(Member(1, 1),)), 1), Placed)
    op = decode_op(release("g"))
    assert op == Release("g") and hash(op) == hash(Release("g"))
    assert isinstance(op, Release)
    answer = store.allocator.release(op.name, 2)
    assert answer == Released("g", ()) and hash(answer) == hash(Released("g", ()))


def test_a_decoded_answer_is_what_init_makes() -> None:
    pods = (Pod(8, "n1", tuple(range(8))), Pod(0, "", ()))
    for answer in (Placed("g", "c", pods, 5), Released("g", ("p", "q")),
                   Released("g", (), already_released=True)):
        decoded = decode_result(encode_result(answer))
        assert decoded == answer and hash(decoded) == hash(answer)
        assert repr(decoded) == repr(answer)
    placed = decode_result(encode_result(Placed("g", "c", pods, 5)))
    assert isinstance(placed, Placed)
    assert all(type(pod) is Pod for pod in placed.pods) and placed.pods[0].node == "n1"
