"""Operations and results of the allocation store: msgpack arrays, builders, typed views.

Writes (``Command.op`` of a logged command; build them with the functions below):

=============================================================  ===================================
op                                                             result
=============================================================  ===================================
``["submit", group]``                                          ``placed`` | ``preempting`` |
``["submit", group, [node, ...]]``                             ``waiting`` | ``error``
``["bind", group, [[node, [device, ...]], ...], revision]``    ``placed`` | ``conflict`` |
                                                               ``error``
``["release", name]``                                          ``["released", name, [promoted]]``
                                                               (``[..., true]``: released before)
``["release", name, incarnation]``                             ``released`` | ``conflict`` |
                                                               ``error``
``["claim", name, incarnation, slot, uid, pod, previous]``     ``["claimed", name, incarnation,
                                                               slot, uid]`` | ``conflict`` |
                                                               ``error``
``["node_health", node, healthy]``                             ``["node_health", node, healthy,
                                                               changed, [cancelled], warning]``
``["reconfigure", yaml_text]``                                 ``["reconfigured", sha256_hex,
                                                               changed, report]`` | ``error``
``["reconfigure", yaml_text, "file"]``                         the same (a configuration file's
                                                               proposal: see below)
=============================================================  ===================================

where ``group`` is ``[name, vc, priority, [[pod_number, leaf_cell_number], ...], leaf_type,
pinned_cell_id, lazy_preemption]`` (``leaf_type`` and ``pinned_cell_id`` are "" for "any" /
"none"). ``[node, ...]`` are the nodes Kubernetes suggests for the group (its filter's or its
preemption candidates, HiveD's ``suggestedNodes`` with ``ignoreK8sSuggestedNodes: false``):
a new group is placed inside them only (the search tries the other chains and leaf types
and the VC's other cells before it waits), a group already placed keeps its placement (as
HiveD insists), and a preempting or reserved group whose placement is no longer inside them
is cancelled and planned again inside them (HiveD's preempting phase; ``plan_submit``,
HiveD's filtering phase, cancels nothing). Without the list, every node will do, and the op is
what builds before suggested nodes wrote and read; those builds refuse the three-element form
as malformed, so every replica must run a build that reads it before a scheduler sends it
(as for ``claim``). Results:

* ``["placed", name, chain, [[leaf_cell_number, node, [device, ...]], ...], token]`` — one
  entry per pod, members in the order given, ``pod_number`` pods each; ``token`` is the global
  log position the allocation took effect at (a fencing token: it only grows).
* ``["preempting", name, [victim, ...]]`` — the group reserved its cells; it is placed (an
  event, and a ``placed`` answer to a repeated submit) once every victim is released.
* ``["waiting", name, reason]`` — nothing changed; submit again later.
* ``["conflict", name, reason]`` — a ``bind`` whose cells changed after ``revision`` or are
  not free; nothing changed.
* ``["error", reason]`` — invalid request; nothing changed.
* A group's *incarnation* is the log position that created it (``incarnation`` in its
  ``group`` query): a group released and submitted again under the same name is another
  incarnation. ``["release", name, incarnation]`` releases the group only if it is still that
  incarnation (else ``conflict``, nothing changed), so a releaser that decided from an old
  view never releases a newer gang of the same name.
* ``claim`` records which pod takes which member pod (*slot*: an index into ``placed``'s
  pods) of a placed group: slot ``slot`` of incarnation ``incarnation`` of group ``name`` is
  given to the pod of UID ``uid`` (``pod``: its "namespace/name", for whoever must check it is
  gone) provided the slot is held by ``previous`` now ("" for nobody: a compare-and-set; a
  scheduler names the previous holder only once it knows that pod is gone for good). It
  answers ``claimed`` again, changing nothing, when ``uid`` holds that slot already; it is a
  ``conflict`` (nothing changed) when the group is gone, another incarnation or not placed,
  when the slot is held by another pod than ``previous``, or when ``uid`` holds another slot.
  So one slot's GPUs are never handed to two live pods, whoever asks and in whatever order.
  The group's ``claims`` (its ``group`` query) list ``[slot, uid, pod]``; releasing the group
  drops them.
* ``node_health``'s ``warning`` is "" unless the report was ignored (a node the configuration
  does not know: HiveD ignores those too).
* ``["reconfigured", sha256_hex, changed, report]`` — the store now runs the configuration in
  ``yaml_text`` (HiveD's format, validated again by every replica; an invalid one is an
  ``error`` and changes nothing); ``changed`` is false when it was already running it.
  ``report`` says what happened to every group (``reconfiguration.reconfigured`` has the rules).
  A replica's configuration file is proposed with ``"file"``: it changes nothing
  (``changed`` false) when the log ran that configuration before (``ClusterStore`` has the
  rule). The first
  ``"file"`` proposal a log holds is its configuration from the start; any other update before
  it is an ``error`` (``NOT_CONFIGURED``): send it again as a new request.
* A preemptor whose victims are all gone is *reserved* (its ``group`` query says so and a
  ``reserved`` event is emitted) until the scheduler confirms it with a second ``submit`` or a
  ``bind`` of exactly its reserved placement, which answer ``placed`` (HiveD's Preempting
  state); ``storeOptions: {reservations: immediate}`` places it at once instead.

Reads (``ClusterStore.query``): ``["group", name]``, ``["vc", name]``, ``["summary"]``,
``["groups", vc_or_empty]``; each answers ``[kind, revision, info]`` with ``info`` a map
(``None`` for an unknown group). ``["events", since]`` answers ``["events", revision,
[[revision, kind, subject, data], ...]]`` (a page of the watch stream after ``since``, whole
revisions only) or ``["compacted", since, oldest]`` when events after ``since`` are gone.
``["digest"]`` answers ``["digest", revision, {"revision": r, "sha256": hex}]``, the hash of the
replica's snapshot: replicas that applied the same log answer the same (a divergence check).
``["inspect", "physical" | "vc" | "group", name]`` answers ``["inspect", revision, tree]``: the
physical cell trees (``name``: a chain, or "" for all), a VC's virtual cell trees, or a group's
physical and virtual placement and lazy-preemption status. ``["hived", kind, name]`` answers
``["hived", revision, object]``: the state as HiveD's own inspect API objects
(``cluster_state.hived_view``; ``kind`` is one of ``HIVED_KINDS``: ``groups``, ``group``
``name`` (None if unknown), ``cluster``, ``physical``, ``vcs``, ``vc`` ``name``).
``["plan", yaml_text]`` answers ``["plan", revision, report]``: what ``reconfigure`` would do
now (a dry run; nothing changes). ``["plan_submit", group]`` answers ``["plan_submit",
revision, result]``: the wire form of what ``submit`` would answer now (a dry run on a copy:
nothing changes, nothing is reserved — HiveD's filtering phase); ``["plan_submit", group,
[node, ...]]`` plans inside those nodes.

The ``decode_*`` functions validate untrusted bytes and raise ``RequestError``; the
``encode_result``/``decode_result`` pair converts the typed results.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import msgpack

from cluster_state.errors import InvalidRequest, RequestError
from cluster_state.frozen import slot_setters
from cluster_state.snapshot_encoding import pack

__all__ = [
    "FROM_FILE",
    "MAX_NAME",
    "MAX_PODS",
    "MAX_PRIORITY",
    "MAX_SUGGESTED",
    "NOT_CONFIGURED",
    "OPPORTUNISTIC",
    "Bind",
    "Claim",
    "Claimed",
    "Conflict",
    "Error",
    "GetDigest",
    "GetEvents",
    "GetGroup",
    "GetSummary",
    "GetVC",
    "GroupSpec",
    "HivedInspect",
    "Inspect",
    "ListGroups",
    "Member",
    "NodeHealthSet",
    "Op",
    "Placed",
    "PlanReconfigure",
    "PlanSubmit",
    "Pod",
    "PodPlacement",
    "Preempting",
    "Query",
    "Reconfigure",
    "Reconfigured",
    "Release",
    "ReleaseIf",
    "Released",
    "Result",
    "SetNodeHealth",
    "Submit",
    "Waiting",
    "bind",
    "claim",
    "decode_op",
    "decode_query",
    "decode_result",
    "encode_result",
    "get_digest",
    "get_events",
    "get_group",
    "get_summary",
    "get_vc",
    "hived_inspect",
    "inspect",
    "list_groups",
    "name_problem",
    "new_placed",
    "new_released",
    "plan_reconfigure",
    "plan_submit",
    "reconfigure",
    "release",
    "release_if",
    "set_node_health",
    "submit",
]

#: Priority of an opportunistic group; guaranteed groups use 0..MAX_PRIORITY.
OPPORTUNISTIC = -1
MAX_PRIORITY = 1000
#: Upper bounds that keep one op's work bounded.
MAX_PODS = 4096
MAX_NAME = 256
#: Upper bound of a claim's pod key, "namespace/name" (Kubernetes: 63 + 1 + 253 characters).
MAX_POD_KEY = 2 * MAX_NAME
#: Upper bound of a suggested node list (a request naming every node of a large cluster).
MAX_SUGGESTED = 1 << 17
#: The kinds of tree ``inspect`` draws.
INSPECT_KINDS = ("physical", "vc", "group")
#: The HiveD inspect objects ``hived_inspect`` answers (``cluster_state.hived_view``).
HIVED_KINDS = ("groups", "group", "cluster", "physical", "vcs", "vc")


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class Member:
    """``pods`` pods of ``leaves`` leaf cells each (HiveD: podNumber, leafCellNumber)."""

    pods: int
    leaves: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSpec:
    """An affinity group (gang): every member pod is placed at once, in one chain."""

    name: str
    vc: str
    priority: int
    members: tuple[Member, ...]
    leaf_type: str = ""
    pinned: str = ""
    lazy: bool = False

    @property
    def pod_sizes(self) -> list[int]:
        """Leaf cells per pod, members in order, each repeated ``pods`` times."""
        members = self.members
        if len(members) == 1:  # (the commonest gang: made in C)
            return [members[0].leaves] * members[0].pods
        return [m.leaves for m in members for _ in range(m.pods)]

    def to_wire(self) -> list[Any]:
        return [
            self.name,
            self.vc,
            self.priority,
            [[m.pods, m.leaves] for m in self.members],
            self.leaf_type,
            self.pinned,
            self.lazy,
        ]


@dataclass(frozen=True, slots=True)
class PodPlacement:
    node: str
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Submit:
    """Place ``spec``; ``suggested``: inside these nodes only (None: any node)."""

    spec: GroupSpec
    suggested: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Bind:
    """Place ``spec`` exactly at ``pods`` (one per pod, in ``pod_sizes`` order), provided no
    leaf involved changed after ``revision``."""

    spec: GroupSpec
    pods: tuple[PodPlacement, ...]
    revision: int


@dataclass(frozen=True, slots=True)
class Release:
    name: str


@dataclass(frozen=True, slots=True)
class SetNodeHealth:
    node: str
    healthy: bool


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """Run the configuration ``text`` (HiveD's YAML format) from now on, keeping the groups.
    ``from_file``: a replica's configuration file, run only if the log never ran it."""

    text: str
    from_file: bool = False


@dataclass(frozen=True, slots=True)
class ReleaseIf:
    """Release group ``name`` only if it is still incarnation ``incarnation``."""

    name: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class Claim:
    """Give member pod ``slot`` of incarnation ``incarnation`` of group ``name`` to the pod
    ``uid`` (``pod``: "namespace/name"), if ``previous`` ("" for nobody) holds it now."""

    name: str
    incarnation: int
    slot: int
    uid: str
    pod: str
    previous: str = ""


Op = Submit | Bind | Release | SetNodeHealth | Reconfigure | ReleaseIf | Claim


@dataclass(frozen=True, slots=True)
class GetGroup:
    name: str


@dataclass(frozen=True, slots=True)
class GetVC:
    name: str


@dataclass(frozen=True, slots=True)
class GetSummary:
    pass


@dataclass(frozen=True, slots=True)
class ListGroups:
    vc: str = ""


@dataclass(frozen=True, slots=True)
class GetEvents:
    """Change events after revision ``since`` (the watch stream, read in pages)."""

    since: int


@dataclass(frozen=True, slots=True)
class GetDigest:
    """The hash of the store's snapshot (replicas at the same point of the log agree)."""


@dataclass(frozen=True, slots=True)
class Inspect:
    """A cell tree: ``kind`` is ``physical`` (``name``: a chain or ""), ``vc`` or ``group``."""

    kind: str
    name: str = ""


@dataclass(frozen=True, slots=True)
class HivedInspect:
    """HiveD's inspect object ``kind`` (one of ``HIVED_KINDS``; ``name``: a group or VC)."""

    kind: str
    name: str = ""


@dataclass(frozen=True, slots=True)
class PlanReconfigure:
    """What reconfiguring to ``text`` would do now (a dry run)."""

    text: str


@dataclass(frozen=True, slots=True)
class PlanSubmit:
    """What submitting ``spec`` would answer now (a dry run: HiveD's filtering phase)."""

    spec: GroupSpec
    suggested: frozenset[str] | None = None


Query = (
    GetGroup | GetVC | GetSummary | ListGroups | GetEvents | GetDigest | Inspect | PlanReconfigure
    | PlanSubmit | HivedInspect
)


# --------------------------------------------------------------------------- results


class Pod(NamedTuple):
    """One member pod's GPUs (a tuple too: ``leaves, node, devices = pod`` still works)."""

    leaves: int  # GPUs (leaf cells)
    node: str  # "" once its node left the configuration
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Placed:
    group: str
    chain: str
    pods: tuple[Pod, ...]  # one per member pod, members in order
    token: int


@dataclass(frozen=True, slots=True)
class Preempting:
    group: str
    victims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Waiting:
    group: str
    reason: str


@dataclass(frozen=True, slots=True)
class Conflict:
    group: str
    reason: str


@dataclass(frozen=True, slots=True)
class Released:
    group: str
    promoted: tuple[str, ...]  # preemptors that got placed because this group left
    #: the group was released before (nothing changed; see ``ClusterStore``)
    already_released: bool = False


@dataclass(frozen=True, slots=True)
class NodeHealthSet:
    node: str
    healthy: bool
    changed: bool
    cancelled: tuple[str, ...]  # preempting groups cancelled because the node went bad
    warning: str = ""  # why the report was ignored (an unknown node), else ""


@dataclass(frozen=True, slots=True)
class Reconfigured:
    digest: str  # sha256 hex of the configuration now running
    changed: bool
    report: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Claimed:
    group: str
    incarnation: int
    slot: int
    uid: str


@dataclass(frozen=True, slots=True)
class Error:
    reason: str


Result = (
    Placed | Preempting | Waiting | Conflict | Released | NodeHealthSet | Reconfigured | Claimed
    | Error
)


def encode_result(result: Result) -> bytes:
    wire: list[Any]
    if type(result) is Placed:  # (the commonest answer first, without a match)
        # (msgpack packs a tuple, a ``Pod`` too, as the array its list would be)
        return _pack(["placed", result.group, result.chain, result.pods, result.token])
    match result:
        case Preempting(group, victims):
            wire = ["preempting", group, list(victims)]
        case Waiting(group, reason):
            wire = ["waiting", group, reason]
        case Conflict(group, reason):
            wire = ["conflict", group, reason]
        case Released(group, promoted, already_released):
            # the flag only when set: an ordinary release answers what older builds answer
            wire = (["released", group, list(promoted), True] if already_released
                    else ["released", group, list(promoted)])
        case NodeHealthSet(node, healthy, changed, cancelled, warning):
            wire = ["node_health", node, healthy, changed, list(cancelled), warning]
        case Reconfigured(digest, changed, report):
            wire = ["reconfigured", digest, changed, report]
        case Claimed(group, incarnation, slot, uid):
            wire = ["claimed", group, incarnation, slot, uid]
        case Error(reason):
            wire = ["error", reason]
    return _pack(wire)


# The objects every operation makes, made without ``__init__`` (``cluster_state.frozen``).
_new = object.__new__
_new_tuple = tuple.__new__
_set_name, _set_vc, _set_priority, _set_members, _set_leaf_type, _set_pinned, _set_lazy = (
    slot_setters(GroupSpec, "name", "vc", "priority", "members", "leaf_type", "pinned", "lazy"))
_set_pods, _set_leaves = slot_setters(Member, "pods", "leaves")
_set_spec, _set_suggested = slot_setters(Submit, "spec", "suggested")
(_set_group_name,) = slot_setters(Release, "name")
(_set_placed_group, _set_placed_chain, _set_placed_pods,
 _set_placed_token) = slot_setters(Placed, "group", "chain", "pods", "token")
_set_released_group, _set_promoted, _set_already_released = slot_setters(
    Released, "group", "promoted", "already_released")


def new_placed(group: str, chain: str, pods: tuple[Pod, ...], token: int) -> Placed:
    """``Placed(group, chain, pods, token)``, made without ``__init__``."""
    placed = _new(Placed)
    _set_placed_group(placed, group)
    _set_placed_chain(placed, chain)
    _set_placed_pods(placed, pods)
    _set_placed_token(placed, token)
    return placed


def new_released(group: str, promoted: tuple[str, ...]) -> Released:
    """``Released(group, promoted)``, made without ``__init__``."""
    released = _new(Released)
    _set_released_group(released, group)
    _set_promoted(released, promoted)
    _set_already_released(released, False)
    return released


def decode_result(data: bytes) -> Result:
    """The typed result of ``ClusterStore.apply`` bytes (for clients)."""
    r = msgpack.unpackb(data)
    # (the commonest two answers first, without the patterns' look-ups: the same objects)
    if type(r) is list and r:
        kind = r[0]
        if (kind == "placed" and len(r) == 5 and type(r[1]) is str and type(r[2]) is str
                and type(r[3]) is list and type(r[4]) is int
                and all(type(p) is list and len(p) == 3 for p in r[3])):
            return new_placed(r[1], r[2], tuple([_new_tuple(Pod, (n, node, tuple(d)))
                                                 for n, node, d in r[3]]), r[4])
        if kind == "released" and len(r) == 3 and type(r[1]) is str and type(r[2]) is list:
            return new_released(r[1], tuple(r[2]))
    match r:
        case ["placed", str(group), str(chain), list(pods), int(token)]:
            return Placed(group, chain, tuple(Pod(n, node, tuple(d)) for n, node, d in pods),
                          token)
        case ["preempting", str(group), list(victims)]:
            return Preempting(group, tuple(victims))
        case ["waiting", str(group), str(reason)]:
            return Waiting(group, reason)
        case ["conflict", str(group), str(reason)]:
            return Conflict(group, reason)
        case ["released", str(group), list(promoted)]:
            return Released(group, tuple(promoted))
        case ["released", str(group), list(promoted), bool(already_released)]:
            return Released(group, tuple(promoted), already_released)
        case ["node_health", str(node), bool(healthy), bool(changed), list(cancelled)]:
            return NodeHealthSet(node, healthy, changed, tuple(cancelled))
        case [
            "node_health", str(node), bool(healthy), bool(changed), list(cancelled), str(warning)
        ]:
            return NodeHealthSet(node, healthy, changed, tuple(cancelled), warning)
        case ["reconfigured", str(digest), bool(changed), dict(report)]:
            return Reconfigured(digest, changed, report)
        case ["claimed", str(group), int(incarnation), int(slot), str(uid)]:
            return Claimed(group, incarnation, slot, uid)
        case ["error", str(reason)]:
            return Error(reason)
        case ["expired"]:
            return Error("expired: the request ran long ago and its result is forgotten")
    raise ValueError(f"not a cluster_state result: {r!r}")


# --------------------------------------------------------------------------- builders


_pack = pack


def _spec(
    name: str,
    vc: str,
    priority: int,
    members: list[tuple[int, int]] | tuple[tuple[int, int], ...] | tuple[Member, ...],
    leaf_type: str,
    pinned: str,
    lazy: bool,
) -> list[Any]:
    pairs = [[m.pods, m.leaves] if isinstance(m, Member) else [m[0], m[1]] for m in members]
    return [_named(name, "a group name"), _named(vc, "a virtual cluster name"), priority, pairs,
            _named(leaf_type, "a GPU type", empty=True),
            _named(pinned, "a pinned cell id", empty=True), lazy]


def submit(
    name: str,
    vc: str,
    priority: int,
    members: list[tuple[int, int]] | tuple[tuple[int, int], ...] | tuple[Member, ...],
    *,
    leaf_type: str = "",
    pinned: str = "",
    lazy: bool = False,
    suggested: Iterable[str] | None = None,
) -> bytes:
    """Submit affinity group ``name``: ``members`` are ``(pod_number, leaf_cell_number)``;
    ``suggested``: place it inside these nodes only (None: anywhere)."""
    op = ["submit", _spec(name, vc, priority, members, leaf_type, pinned, lazy)]
    return _pack(_with_suggested(op, suggested))


def _with_suggested(op: list[Any], suggested: Iterable[str] | None) -> list[Any]:
    """``op`` with its suggested nodes, sorted (the wire form of an op without them is what
    builds before suggested nodes wrote)."""
    return op if suggested is None else [*op, sorted(set(suggested))]


def bind(
    name: str,
    vc: str,
    priority: int,
    members: list[tuple[int, int]] | tuple[tuple[int, int], ...] | tuple[Member, ...],
    pods: list[tuple[str, list[int]]] | tuple[PodPlacement, ...],
    revision: int,
    *,
    leaf_type: str = "",
    pinned: str = "",
    lazy: bool = False,
) -> bytes:
    """Place group ``name`` exactly at ``pods`` (``(node, [device, ...])`` per pod) unless a
    leaf involved changed after ``revision`` (read it from a query)."""
    placement = [
        [_named(p.node, "a node name"), list(p.devices)] if isinstance(p, PodPlacement)
        else [_named(p[0], "a node name"), list(p[1])]
        for p in pods
    ]
    spec = _spec(name, vc, priority, members, leaf_type, pinned, lazy)
    return _pack(["bind", spec, placement, revision])


def release(name: str) -> bytes:
    return _pack(["release", _named(name, "a group name")])


def release_if(name: str, incarnation: int) -> bytes:
    """Release group ``name`` only if it is still ``incarnation`` (its ``group`` query's)."""
    return _pack(["release", _named(name, "a group name"), incarnation])


def claim(name: str, incarnation: int, slot: int, uid: str, pod: str,
          previous: str = "") -> bytes:
    """Give member pod ``slot`` of group ``name`` (incarnation ``incarnation``) to pod ``uid``
    ("namespace/name" ``pod``) if ``previous`` ("" for nobody) holds it now."""
    return _pack(["claim", name, incarnation, slot, uid, pod, previous])


def set_node_health(node: str, healthy: bool) -> bytes:
    return _pack(["node_health", _named(node, "a node name"), healthy])


#: the third element of a ``reconfigure`` op proposed from a replica's configuration file
FROM_FILE: Final = "file"
#: the reason of the error an update gets before the log holds its first configuration
NOT_CONFIGURED: Final = ("the log holds no GPU configuration yet (the cluster is starting: "
                         "its first reconfigure sets it): send it again")


def reconfigure(text: str, *, from_file: bool = False) -> bytes:
    """Run the configuration ``text`` (HiveD YAML) from now on; validate it first with
    ``cluster_state.config.parse_config`` (the store refuses an invalid one, changing nothing).
    ``from_file``: a replica's configuration file, which changes nothing if the log ran that
    configuration before (``ClusterStore``)."""
    return _pack(["reconfigure", text, FROM_FILE] if from_file else ["reconfigure", text])


def plan_reconfigure(text: str) -> bytes:
    """A dry run of ``reconfigure(text)``: what would happen to every group."""
    return _pack(["plan", text])


def plan_submit(
    name: str,
    vc: str,
    priority: int,
    members: list[tuple[int, int]] | tuple[tuple[int, int], ...] | tuple[Member, ...],
    *,
    leaf_type: str = "",
    pinned: str = "",
    lazy: bool = False,
    suggested: Iterable[str] | None = None,
) -> bytes:
    """A dry run of ``submit``: what it would answer now (nothing changes, nothing reserved)."""
    op = ["plan_submit", _spec(name, vc, priority, members, leaf_type, pinned, lazy)]
    return _pack(_with_suggested(op, suggested))


def inspect(kind: str, name: str = "") -> bytes:
    """A cell tree: ``physical`` (``name``: a chain or "" for all), ``vc`` or ``group``."""
    return _pack(["inspect", kind, name])


def hived_inspect(kind: str, name: str = "") -> bytes:
    """HiveD's inspect object ``kind`` (``HIVED_KINDS``), of group or VC ``name``."""
    return _pack(["hived", kind, name])


def get_group(name: str) -> bytes:
    return _pack(["group", name])


def get_vc(name: str) -> bytes:
    return _pack(["vc", name])


def get_summary() -> bytes:
    return _pack(["summary"])


def get_events(since: int) -> bytes:
    return _pack(["events", since])


def get_digest() -> bytes:
    return _pack(["digest"])


def list_groups(vc: str = "") -> bytes:
    return _pack(["groups", vc])


# --------------------------------------------------------------------------- decoding


def _unpack(data: bytes) -> list[Any]:
    try:
        value = msgpack.unpackb(data)
    except Exception:
        raise RequestError("op is not msgpack") from None
    if not isinstance(value, list) or not value or not isinstance(value[0], str):
        raise RequestError("op must be an array [name, ...]")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: object, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME or (not value and not empty):
        raise RequestError(f"{what} must be a string of {0 if empty else 1}..{MAX_NAME} "
                           "characters"
                           + (f", not {len(value)}" if isinstance(value, str) else ""))
    return value


def name_problem(value: str, what: str = "a name", *, empty: bool = False) -> str | None:
    """Why ``value`` cannot name a group, virtual cluster, node, GPU type or pinned cell
    (None: it can): it is 1..``MAX_NAME`` characters (0.. with ``empty``) and holds no
    control character (a NUL in a name is placed, then hard to type again). The encoders
    below refuse such names before they reach the log (``InvalidRequest``); the store's own
    check, as it applies a command, stays the older, looser one, so a log written before
    this check executes the same again."""
    if len(value) > MAX_NAME or (not value and not empty):
        return (f"{what} must be {0 if empty else 1}..{MAX_NAME} characters, not "
                f"{len(value)}")
    if value.isascii() and value.isprintable():  # (the ASCII controls are its unprintables)
        return None
    for index, char in enumerate(value):
        if unicodedata.category(char) in _CONTROL:
            return (f"{what} must not hold control characters: U+{ord(char):04X} at "
                    f"{index} of {value!r}")
    return None


#: Unicode categories a name may not hold: controls (C0, DEL, C1) and lone surrogates
_CONTROL = frozenset({"Cc", "Cs"})


def _named(value: str, what: str, *, empty: bool = False) -> str:
    """``value`` if it may name something (``name_problem``), else ``InvalidRequest``."""
    problem = name_problem(value, what, empty=empty)
    if problem is not None:
        raise InvalidRequest(problem)
    return value


def _decode_spec(raw: object) -> GroupSpec:
    if not isinstance(raw, list) or len(raw) != 7:
        raise RequestError(
            "group must be [name, vc, priority, members, leaf_type, pinned, lazy]"
        )
    name_raw, vc_raw, priority, members_raw, leaf_raw, pinned_raw, lazy = raw
    # (what msgpack decodes a good spec to is checked without a call; anything else is
    # checked again by ``_text`` &c., which say what is wrong)
    name = (name_raw if type(name_raw) is str and 0 < len(name_raw) <= MAX_NAME
            else _text(name_raw, "group name"))
    vc = (vc_raw if type(vc_raw) is str and 0 < len(vc_raw) <= MAX_NAME
          else _text(vc_raw, "virtual cluster"))
    # (``type(v) is int or _is_int(v)`` is ``_is_int(v)``, without a call for what msgpack
    # decodes an integer to)
    if (not (type(priority) is int or _is_int(priority))
            or not OPPORTUNISTIC <= priority <= MAX_PRIORITY):
        raise RequestError(
            f"priority must be an integer in [{OPPORTUNISTIC}, {MAX_PRIORITY}], not {priority!r}"
        )
    if not isinstance(members_raw, list) or not members_raw:
        raise RequestError("members must be a non-empty list of [pod_number, leaf_cell_number]")
    merged: dict[int, int] = {}
    pod_count = 0
    for m in members_raw:
        # (one loop, no generator per member: every submit decodes its spec once per replica)
        if not isinstance(m, list) or len(m) != 2:
            raise RequestError(f"member {m!r} must be [pod_number >= 1, leaf_cell_number >= 1]")
        pods, leaves = m
        if not ((type(pods) is int or _is_int(pods)) and pods >= 1
                and (type(leaves) is int or _is_int(leaves)) and leaves >= 1):
            raise RequestError(f"member {m!r} must be [pod_number >= 1, leaf_cell_number >= 1]")
        # HiveD merges members that ask for the same number of leaf cells per pod.
        merged[leaves] = merged.get(leaves, 0) + pods
        pod_count += pods
    if pod_count > MAX_PODS:
        raise RequestError(f"a group may have at most {MAX_PODS} pods")
    members = tuple([_member(pods, leaves) for leaves, pods in merged.items()])
    leaf_type = (leaf_raw if type(leaf_raw) is str and len(leaf_raw) <= MAX_NAME
                 else _text(leaf_raw, "leaf_type", empty=True))
    pinned = (pinned_raw if type(pinned_raw) is str and len(pinned_raw) <= MAX_NAME
              else _text(pinned_raw, "pinned cell id", empty=True))
    if type(lazy) is not bool:
        raise RequestError("lazy must be true or false")
    if pinned and priority == OPPORTUNISTIC:
        raise RequestError("an opportunistic group (priority -1) cannot use a pinned cell")
    spec = _new(GroupSpec)
    _set_name(spec, name)
    _set_vc(spec, vc)
    _set_priority(spec, priority)
    _set_members(spec, members)
    _set_leaf_type(spec, leaf_type)
    _set_pinned(spec, pinned)
    _set_lazy(spec, lazy)
    return spec


def _member(pods: int, leaves: int) -> Member:
    """``Member(pods, leaves)``, made without ``__init__``."""
    member = _new(Member)
    _set_pods(member, pods)
    _set_leaves(member, leaves)
    return member


def _decode_suggested(raw: object) -> frozenset[str]:
    # (one pass over thousands of names, no call per name: a preempt of a large cluster's
    # pod names every node)
    if (not isinstance(raw, list) or len(raw) > MAX_SUGGESTED
            or not all(type(node) is str and 0 < len(node) <= MAX_NAME for node in raw)):
        raise RequestError(f"suggested nodes must be a list of at most {MAX_SUGGESTED} "
                           f"node names (non-empty strings of at most {MAX_NAME})")
    return frozenset(raw)


def _decode_claim(op: list[Any]) -> Claim:
    _, group, incarnation, slot, uid, pod, previous = op
    if not _is_int(incarnation) or incarnation < 0:
        raise RequestError("claim's incarnation must be an integer >= 0")
    if not _is_int(slot) or not 0 <= slot < MAX_PODS:
        raise RequestError(f"claim's slot must be an integer in [0, {MAX_PODS})")
    if not isinstance(pod, str) or not pod or len(pod) > MAX_POD_KEY:
        raise RequestError(f"claim's pod must be a non-empty string of <= {MAX_POD_KEY}")
    return Claim(_text(group, "group name"), incarnation, slot, _text(uid, "pod uid"), pod,
                 _text(previous, "previous pod uid", empty=True))


def decode_op(data: bytes) -> Op:
    """The typed write operation in ``data``; ``RequestError`` if it is not one."""
    op = _unpack(data)
    name = op[0]
    if name == "submit" and len(op) in (2, 3):
        submitting = _new(Submit)
        _set_spec(submitting, _decode_spec(op[1]))
        _set_suggested(submitting, _decode_suggested(op[2]) if len(op) == 3 else None)
        return submitting
    if name == "bind" and len(op) == 4:
        spec = _decode_spec(op[1])
        if not isinstance(op[2], list) or not _is_int(op[3]):
            raise RequestError("bind must be [bind, group, [[node, [device, ...]], ...], revision]")
        pods = []
        for p in op[2]:
            if (
                not isinstance(p, list)
                or len(p) != 2
                or not isinstance(p[1], list)
                or not all(_is_int(d) and d >= 0 for d in p[1])
            ):
                raise RequestError(f"pod placement {p!r} must be [node, [device, ...]]")
            pods.append(PodPlacement(_text(p[0], "node"), tuple(p[1])))
        return Bind(spec, tuple(pods), op[3])
    if name == "release" and len(op) == 2:
        group = op[1]
        releasing = _new(Release)
        _set_group_name(releasing, group if type(group) is str and 0 < len(group) <= MAX_NAME
                        else _text(group, "group name"))
        return releasing
    if name == "release" and len(op) == 3:
        if not _is_int(op[2]) or op[2] < 0:
            raise RequestError("release must be [release, name, incarnation >= 0]")
        return ReleaseIf(_text(op[1], "group name"), op[2])
    if name == "claim" and len(op) == 7:
        return _decode_claim(op)
    if name == "node_health" and len(op) == 3 and isinstance(op[2], bool):
        return SetNodeHealth(_text(op[1], "node"), op[2])
    if name == "reconfigure" and len(op) == 2 and isinstance(op[1], str):
        return Reconfigure(op[1])
    if name == "reconfigure" and len(op) == 3 and isinstance(op[1], str) and op[2] == FROM_FILE:
        return Reconfigure(op[1], from_file=True)
    raise RequestError(f"unknown or malformed op {name!r}")


def decode_query(data: bytes) -> Query:
    """The typed read-only query in ``data``; ``RequestError`` if it is not one."""
    op = _unpack(data)
    name = op[0]
    if name == "group" and len(op) == 2:
        return GetGroup(_text(op[1], "group name"))
    if name == "vc" and len(op) == 2:
        return GetVC(_text(op[1], "virtual cluster"))
    if name == "summary" and len(op) == 1:
        return GetSummary()
    if name == "groups" and len(op) == 2:
        return ListGroups(_text(op[1], "virtual cluster", empty=True))
    if name == "events" and len(op) == 2 and _is_int(op[1]) and op[1] >= -1:
        return GetEvents(op[1])
    if name == "digest" and len(op) == 1:
        return GetDigest()
    if name == "inspect" and len(op) == 3 and op[1] in INSPECT_KINDS:
        return Inspect(op[1], _text(op[2], "name", empty=True))
    if name == "hived" and len(op) == 3 and op[1] in HIVED_KINDS:
        return HivedInspect(op[1], _text(op[2], "name", empty=True))
    if name == "plan" and len(op) == 2 and isinstance(op[1], str):
        return PlanReconfigure(op[1])
    if name == "plan_submit" and len(op) in (2, 3):
        suggested = _decode_suggested(op[2]) if len(op) == 3 else None
        return PlanSubmit(_decode_spec(op[1]), suggested)
    raise RequestError(f"unknown or malformed query {name!r}")
