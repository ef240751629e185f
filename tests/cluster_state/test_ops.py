import unicodedata

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_state import (
    Bind,
    Conflict,
    Error,
    GetGroup,
    GetSummary,
    GetVC,
    GroupSpec,
    ListGroups,
    Member,
    NodeHealthSet,
    Placed,
    PodPlacement,
    Preempting,
    Release,
    Released,
    RequestError,
    SetNodeHealth,
    Submit,
    Waiting,
    bind,
    decode_op,
    decode_query,
    decode_result,
    encode_result,
    get_group,
    get_summary,
    get_vc,
    list_groups,
    release,
    set_node_health,
    submit,
)
from cluster_state.ops import MAX_NAME, MAX_PODS, Pod, name_problem
from cluster_state.snapshot_encoding import pack


def test_builders_decode_to_typed_ops() -> None:
    spec = GroupSpec(
        name="g",
        vc="VC1",
        priority=7,
        members=(Member(2, 8), Member(1, 4)),
        leaf_type="V100",
        pinned="",
        lazy=True,
    )
    op = submit("g", "VC1", 7, [(2, 8), (1, 4)], leaf_type="V100", lazy=True)
    assert msgpack.unpackb(op) == ["submit", ["g", "VC1", 7, [[2, 8], [1, 4]], "V100", "", True]]
    assert decode_op(op) == Submit(spec)
    assert spec.pod_sizes == [8, 8, 4]
    assert GroupSpec(name="h", vc="VC1", priority=1, members=(Member(3, 2),)).pod_sizes == [2] * 3
    placement = [("n1", [0, 1]), ("n1", [2, 3]), ("n2", [0, 1, 2, 3])]
    assert decode_op(bind("g", "VC1", 7, [(2, 8), (1, 4)], placement, 12, lazy=True)) == Bind(
        GroupSpec(name="g", vc="VC1", priority=7, members=spec.members, lazy=True),
        (PodPlacement("n1", (0, 1)), PodPlacement("n1", (2, 3)), PodPlacement("n2", (0, 1, 2, 3))),
        12,
    )
    assert decode_op(release("g")) == Release("g")
    assert decode_op(set_node_health("n1", False)) == SetNodeHealth("n1", False)
    assert decode_query(get_group("g")) == GetGroup("g")
    assert decode_query(get_vc("VC1")) == GetVC("VC1")
    assert decode_query(get_summary()) == GetSummary()
    assert decode_query(list_groups()) == ListGroups("")


def test_members_with_the_same_pod_size_are_merged_like_hived() -> None:
    op = decode_op(submit("g", "VC1", 1, [(1, 8), (2, 4), (3, 8)]))
    assert isinstance(op, Submit)
    assert op.spec.members == (Member(4, 8), Member(2, 4))


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb({"op": "submit"}), "must be an array"),
        (msgpack.packb(["submit", "g"]), "group must be"),
        (submit("g", "VC1", 1001, [(1, 1)]), "priority must be an integer in [-1, 1000]"),
        (submit("g", "VC1", -1, [(1, 1)], pinned="P"), "cannot use a pinned cell"),
        (submit("g", "VC1", 1, [(1, -1)]), "member [1, -1] must be"),
        (submit("g", "VC1", 1, []), "members must be a non-empty list"),
        (submit("g", "VC1", 1, [(0, 2)]), "member [0, 2] must be"),
        (msgpack.packb(["submit", ["g", "VC1", 1, [[True, 2]], "", "", False]]),
         "member [True, 2] must be"),
        (msgpack.packb(["submit", ["g", "VC1", 1, [[1, 2, 3]], "", "", False]]),
         "member [1, 2, 3] must be"),
        (msgpack.packb(["submit", ["g", "VC1", 1, [7], "", "", False]]), "member 7 must be"),
        (submit("g", "VC1", 1, [(MAX_PODS, 1), (1, 2)]), f"at most {MAX_PODS} pods"),
        (msgpack.packb(["release"]), "unknown or malformed op 'release'"),
        (msgpack.packb(["bind", ["g", "v", 1, [[1, 1]], "", "", False], [["n", 0]], 1]), "pod"),
    ],
)
def test_malformed_ops_are_request_errors(data: bytes, fragment: str) -> None:
    with pytest.raises(RequestError) as info:
        decode_op(data)
    assert fragment in info.value.reason and info.value.static


def test_malformed_queries_are_request_errors() -> None:
    for data in (msgpack.packb(["group"]), msgpack.packb(["summary", 1]), release("g")):
        with pytest.raises(RequestError):
            decode_query(data)


@pytest.mark.parametrize(
    "result",
    [
        Placed("g", "V100-RACK", ((8, "n1", (0, 1, 2, 3, 4, 5, 6, 7)), (1, "n2", (3,))), 42),
        Preempting("g", ("a", "b")),
        Waiting("g", "no room"),
        Conflict("g", "changed"),
        Released("g", ("p",)),
        NodeHealthSet("n1", False, True, ("p",)),
        Error("bad"),
    ],
)
def test_results_round_trip(result: object) -> None:
    assert decode_result(encode_result(result)) == result  # type: ignore[arg-type]


def test_a_placed_answer_packs_its_pods_as_arrays() -> None:
    # the bytes every build answered (pods as lists), from Pod tuples packed as they are
    pods = (Pod(8, "n1", (0, 1, 2, 3, 4, 5, 6, 7)), Pod(0, "", ()))
    assert encode_result(Placed("g", "V100-RACK", pods, 42)) == msgpack.packb(
        ["placed", "g", "V100-RACK", [[8, "n1", [0, 1, 2, 3, 4, 5, 6, 7]], [0, "", []]], 42])


def test_expired_session_answer_decodes_as_an_error() -> None:
    assert isinstance(decode_result(msgpack.packb(["expired"])), Error)
    with pytest.raises(ValueError):
        decode_result(msgpack.packb(["what"]))


def test_the_kept_packer_packs_what_packb_packs() -> None:
    # the thread's packer is kept: after a value it could not pack it still packs what
    # msgpack.packb packs
    values: list[object] = [["placed", "g", "V100", [[1, "n0", [0, 1]]], 7], {"a": None},
                            b"\x00" * 300, 1.5, -(2**40), "é" * 70]
    assert [pack(value) for value in values] == [msgpack.packb(value) for value in values]
    for value in values:
        with pytest.raises(TypeError):
            pack([value, object()])
        assert pack(value) == msgpack.packb(value)


TEXT = st.one_of(st.text(max_size=3), st.sampled_from(["", "x" * MAX_NAME, "y" * (MAX_NAME + 1)]),
                 st.integers(-3, 3), st.binary(max_size=2), st.none(), st.booleans())


@settings(max_examples=400, deadline=None, derandomize=True)
@given(field=st.sampled_from(["name", "vc", "leaf_type", "pinned", "lazy"]),
       value=st.one_of(TEXT, st.integers(0, 1)))
def test_a_spec_decodes_when_its_fields_are_what_the_format_says(field: str,
                                                                  value: object) -> None:
    # one field of a good spec set to ``value``: the group's names are strings of
    # 1..MAX_NAME characters, leaf_type and pinned of 0..MAX_NAME, lazy a boolean (the
    # decoder's quick checks say what the rule says)
    fields: dict[str, object] = {"name": "g", "vc": "VC1", "leaf_type": "", "pinned": "",
                                 "lazy": False, field: value}
    if field == "lazy":
        valid = isinstance(value, bool)
    else:
        valid = (isinstance(value, str) and len(value) <= MAX_NAME
                 and (bool(value) or field in ("leaf_type", "pinned")))
    op = msgpack.packb(["submit", [fields["name"], fields["vc"], 5, [[1, 1]],
                                   fields["leaf_type"], fields["pinned"], fields["lazy"]]])
    try:
        spec = decode_op(op).spec  # type: ignore[union-attr]
    except RequestError:
        assert not valid
    else:
        assert valid and getattr(spec, field) == value


@pytest.mark.parametrize("char", [chr(c) for c in range(0x100)] + ["\ud800", "\u2028", "é"])
def test_a_name_is_refused_for_a_control_character_wherever_it_is(char: str) -> None:
    # the ASCII names (the commonest) are let through at once when printable: the same
    # verdict as looking at the category of each character
    control = unicodedata.category(char) in {"Cc", "Cs"}
    for name in (char, f"job{char}", f"{char}0001-x"):
        problem = name_problem(name)
        assert (problem is not None) == control, (name, problem)
        if problem is not None:
            assert f"U+{ord(char):04X} at {name.index(char)}" in problem
