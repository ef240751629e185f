from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Member(_message.Message):
    __slots__ = ("pods", "leaves")
    PODS_FIELD_NUMBER: _ClassVar[int]
    LEAVES_FIELD_NUMBER: _ClassVar[int]
    pods: int
    leaves: int
    def __init__(self, pods: _Optional[int] = ..., leaves: _Optional[int] = ...) -> None: ...

class GroupSpec(_message.Message):
    __slots__ = ("name", "vc", "priority", "members", "leaf_type", "pinned", "lazy")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VC_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEAF_TYPE_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    LAZY_FIELD_NUMBER: _ClassVar[int]
    name: str
    vc: str
    priority: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    leaf_type: str
    pinned: str
    lazy: bool
    def __init__(self, name: _Optional[str] = ..., vc: _Optional[str] = ..., priority: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., leaf_type: _Optional[str] = ..., pinned: _Optional[str] = ..., lazy: _Optional[bool] = ...) -> None: ...

class Pod(_message.Message):
    __slots__ = ("leaves", "node", "devices")
    LEAVES_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    leaves: int
    node: str
    devices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, leaves: _Optional[int] = ..., node: _Optional[str] = ..., devices: _Optional[_Iterable[int]] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("client_id", "seq")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    seq: int
    def __init__(self, client_id: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("group", "session", "suggested")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SUGGESTED_FIELD_NUMBER: _ClassVar[int]
    group: GroupSpec
    session: Session
    suggested: SuggestedNodes
    def __init__(self, group: _Optional[_Union[GroupSpec, _Mapping]] = ..., session: _Optional[_Union[Session, _Mapping]] = ..., suggested: _Optional[_Union[SuggestedNodes, _Mapping]] = ...) -> None: ...

class SuggestedNodes(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("placed", "preempting", "waiting")
    PLACED_FIELD_NUMBER: _ClassVar[int]
    PREEMPTING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    placed: Placed
    preempting: Preempting
    waiting: Waiting
    def __init__(self, placed: _Optional[_Union[Placed, _Mapping]] = ..., preempting: _Optional[_Union[Preempting, _Mapping]] = ..., waiting: _Optional[_Union[Waiting, _Mapping]] = ...) -> None: ...

class Placed(_message.Message):
    __slots__ = ("group", "chain", "pods", "token")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    group: str
    chain: str
    pods: _containers.RepeatedCompositeFieldContainer[Pod]
    token: int
    def __init__(self, group: _Optional[str] = ..., chain: _Optional[str] = ..., pods: _Optional[_Iterable[_Union[Pod, _Mapping]]] = ..., token: _Optional[int] = ...) -> None: ...

class Preempting(_message.Message):
    __slots__ = ("group", "victims")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    VICTIMS_FIELD_NUMBER: _ClassVar[int]
    group: str
    victims: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group: _Optional[str] = ..., victims: _Optional[_Iterable[str]] = ...) -> None: ...

class Waiting(_message.Message):
    __slots__ = ("group", "reason")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    group: str
    reason: str
    def __init__(self, group: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PodPlacement(_message.Message):
    __slots__ = ("node", "devices")
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    node: str
    devices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node: _Optional[str] = ..., devices: _Optional[_Iterable[int]] = ...) -> None: ...

class BindRequest(_message.Message):
    __slots__ = ("group", "pods", "revision", "session")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    group: GroupSpec
    pods: _containers.RepeatedCompositeFieldContainer[PodPlacement]
    revision: int
    session: Session
    def __init__(self, group: _Optional[_Union[GroupSpec, _Mapping]] = ..., pods: _Optional[_Iterable[_Union[PodPlacement, _Mapping]]] = ..., revision: _Optional[int] = ..., session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class Conflict(_message.Message):
    __slots__ = ("group", "reason")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    group: str
    reason: str
    def __init__(self, group: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class BindReply(_message.Message):
    __slots__ = ("placed", "conflict")
    PLACED_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_FIELD_NUMBER: _ClassVar[int]
    placed: Placed
    conflict: Conflict
    def __init__(self, placed: _Optional[_Union[Placed, _Mapping]] = ..., conflict: _Optional[_Union[Conflict, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("group", "session")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    group: str
    session: Session
    def __init__(self, group: _Optional[str] = ..., session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class ReleaseReply(_message.Message):
    __slots__ = ("promoted", "already_released")
    PROMOTED_FIELD_NUMBER: _ClassVar[int]
    ALREADY_RELEASED_FIELD_NUMBER: _ClassVar[int]
    promoted: _containers.RepeatedScalarFieldContainer[str]
    already_released: bool
    def __init__(self, promoted: _Optional[_Iterable[str]] = ..., already_released: _Optional[bool] = ...) -> None: ...

class NodeHealthRequest(_message.Message):
    __slots__ = ("node", "healthy", "session")
    NODE_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    node: str
    healthy: bool
    session: Session
    def __init__(self, node: _Optional[str] = ..., healthy: _Optional[bool] = ..., session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class NodeHealthReply(_message.Message):
    __slots__ = ("changed", "cancelled", "warning")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    cancelled: _containers.RepeatedScalarFieldContainer[str]
    warning: str
    def __init__(self, changed: _Optional[bool] = ..., cancelled: _Optional[_Iterable[str]] = ..., warning: _Optional[str] = ...) -> None: ...

class ReconfigureRequest(_message.Message):
    __slots__ = ("config_yaml", "dry_run", "session", "typed")
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TYPED_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    dry_run: bool
    session: Session
    typed: bool
    def __init__(self, config_yaml: _Optional[str] = ..., dry_run: _Optional[bool] = ..., session: _Optional[_Union[Session, _Mapping]] = ..., typed: _Optional[bool] = ...) -> None: ...

class ReconfigureReply(_message.Message):
    __slots__ = ("digest", "changed", "report_json", "groups", "nodes_added", "nodes_removed", "vcs_added", "vcs_removed")
    class GroupsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: GroupOutcome
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[GroupOutcome, _Mapping]] = ...) -> None: ...
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    NODES_ADDED_FIELD_NUMBER: _ClassVar[int]
    NODES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    VCS_ADDED_FIELD_NUMBER: _ClassVar[int]
    VCS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    digest: str
    changed: bool
    report_json: str
    groups: _containers.MessageMap[str, GroupOutcome]
    nodes_added: _containers.RepeatedScalarFieldContainer[str]
    nodes_removed: _containers.RepeatedScalarFieldContainer[str]
    vcs_added: _containers.RepeatedScalarFieldContainer[str]
    vcs_removed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, digest: _Optional[str] = ..., changed: _Optional[bool] = ..., report_json: _Optional[str] = ..., groups: _Optional[_Mapping[str, GroupOutcome]] = ..., nodes_added: _Optional[_Iterable[str]] = ..., nodes_removed: _Optional[_Iterable[str]] = ..., vcs_added: _Optional[_Iterable[str]] = ..., vcs_removed: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupOutcome(_message.Message):
    __slots__ = ("outcome", "reason", "dropped", "moved_from", "moved_to")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    MOVED_FROM_FIELD_NUMBER: _ClassVar[int]
    MOVED_TO_FIELD_NUMBER: _ClassVar[int]
    outcome: str
    reason: str
    dropped: _containers.RepeatedScalarFieldContainer[str]
    moved_from: str
    moved_to: str
    def __init__(self, outcome: _Optional[str] = ..., reason: _Optional[str] = ..., dropped: _Optional[_Iterable[str]] = ..., moved_from: _Optional[str] = ..., moved_to: _Optional[str] = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ("kind", "name", "stale", "typed")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    TYPED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    stale: bool
    typed: bool
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., stale: _Optional[bool] = ..., typed: _Optional[bool] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("name", "stale", "typed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    TYPED_FIELD_NUMBER: _ClassVar[int]
    name: str
    stale: bool
    typed: bool
    def __init__(self, name: _Optional[str] = ..., stale: _Optional[bool] = ..., typed: _Optional[bool] = ...) -> None: ...

class JsonReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class LazyPreemption(_message.Message):
    __slots__ = ("preemptor", "position")
    PREEMPTOR_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    preemptor: str
    position: int
    def __init__(self, preemptor: _Optional[str] = ..., position: _Optional[int] = ...) -> None: ...

class Claim(_message.Message):
    __slots__ = ("slot", "uid", "pod")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    slot: int
    uid: str
    pod: str
    def __init__(self, slot: _Optional[int] = ..., uid: _Optional[str] = ..., pod: _Optional[str] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ("group", "incarnation", "slot", "uid", "pod", "previous", "session")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    group: str
    incarnation: int
    slot: int
    uid: str
    pod: str
    previous: str
    session: Session
    def __init__(self, group: _Optional[str] = ..., incarnation: _Optional[int] = ..., slot: _Optional[int] = ..., uid: _Optional[str] = ..., pod: _Optional[str] = ..., previous: _Optional[str] = ..., session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class Claimed(_message.Message):
    __slots__ = ("group", "incarnation", "slot", "uid")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    group: str
    incarnation: int
    slot: int
    uid: str
    def __init__(self, group: _Optional[str] = ..., incarnation: _Optional[int] = ..., slot: _Optional[int] = ..., uid: _Optional[str] = ...) -> None: ...

class ClaimReply(_message.Message):
    __slots__ = ("claimed", "conflict")
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_FIELD_NUMBER: _ClassVar[int]
    claimed: Claimed
    conflict: Conflict
    def __init__(self, claimed: _Optional[_Union[Claimed, _Mapping]] = ..., conflict: _Optional[_Union[Conflict, _Mapping]] = ...) -> None: ...

class Group(_message.Message):
    __slots__ = ("spec", "state", "downgraded", "lazy_preemption", "chain", "pods", "token", "victims", "preempted_by", "incarnation", "claims")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DOWNGRADED_FIELD_NUMBER: _ClassVar[int]
    LAZY_PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    VICTIMS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_BY_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    spec: GroupSpec
    state: str
    downgraded: bool
    lazy_preemption: LazyPreemption
    chain: str
    pods: _containers.RepeatedCompositeFieldContainer[Pod]
    token: int
    victims: _containers.RepeatedScalarFieldContainer[str]
    preempted_by: _containers.RepeatedScalarFieldContainer[str]
    incarnation: int
    claims: _containers.RepeatedCompositeFieldContainer[Claim]
    def __init__(self, spec: _Optional[_Union[GroupSpec, _Mapping]] = ..., state: _Optional[str] = ..., downgraded: _Optional[bool] = ..., lazy_preemption: _Optional[_Union[LazyPreemption, _Mapping]] = ..., chain: _Optional[str] = ..., pods: _Optional[_Iterable[_Union[Pod, _Mapping]]] = ..., token: _Optional[int] = ..., victims: _Optional[_Iterable[str]] = ..., preempted_by: _Optional[_Iterable[str]] = ..., incarnation: _Optional[int] = ..., claims: _Optional[_Iterable[_Union[Claim, _Mapping]]] = ...) -> None: ...

class GroupReply(_message.Message):
    __slots__ = ("json", "revision", "group")
    JSON_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    json: str
    revision: int
    group: Group
    def __init__(self, json: _Optional[str] = ..., revision: _Optional[int] = ..., group: _Optional[_Union[Group, _Mapping]] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("name", "vc", "priority", "state", "leaves", "chain", "token", "pods", "incarnation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VC_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEAVES_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    vc: str
    priority: int
    state: str
    leaves: int
    chain: str
    token: int
    pods: _containers.RepeatedCompositeFieldContainer[Pod]
    incarnation: int
    def __init__(self, name: _Optional[str] = ..., vc: _Optional[str] = ..., priority: _Optional[int] = ..., state: _Optional[str] = ..., leaves: _Optional[int] = ..., chain: _Optional[str] = ..., token: _Optional[int] = ..., pods: _Optional[_Iterable[_Union[Pod, _Mapping]]] = ..., incarnation: _Optional[int] = ...) -> None: ...

class AllocationsReply(_message.Message):
    __slots__ = ("json", "revision", "groups")
    JSON_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    json: str
    revision: int
    groups: _containers.RepeatedCompositeFieldContainer[Allocation]
    def __init__(self, json: _Optional[str] = ..., revision: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[Allocation, _Mapping]]] = ...) -> None: ...

class VcCells(_message.Message):
    __slots__ = ("chain", "level", "cell_type", "cells", "bound", "used", "free", "doomed", "bad")
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    CELL_TYPE_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    DOOMED_FIELD_NUMBER: _ClassVar[int]
    BAD_FIELD_NUMBER: _ClassVar[int]
    chain: str
    level: int
    cell_type: str
    cells: int
    bound: int
    used: int
    free: int
    doomed: int
    bad: int
    def __init__(self, chain: _Optional[str] = ..., level: _Optional[int] = ..., cell_type: _Optional[str] = ..., cells: _Optional[int] = ..., bound: _Optional[int] = ..., used: _Optional[int] = ..., free: _Optional[int] = ..., doomed: _Optional[int] = ..., bad: _Optional[int] = ...) -> None: ...

class PinnedCell(_message.Message):
    __slots__ = ("id", "chain", "level", "address", "used", "bad")
    ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    BAD_FIELD_NUMBER: _ClassVar[int]
    id: str
    chain: str
    level: int
    address: str
    used: bool
    bad: bool
    def __init__(self, id: _Optional[str] = ..., chain: _Optional[str] = ..., level: _Optional[int] = ..., address: _Optional[str] = ..., used: _Optional[bool] = ..., bad: _Optional[bool] = ...) -> None: ...

class VcLeaves(_message.Message):
    __slots__ = ("total", "used", "reserved", "bad_held")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FIELD_NUMBER: _ClassVar[int]
    BAD_HELD_FIELD_NUMBER: _ClassVar[int]
    total: int
    used: int
    reserved: int
    bad_held: int
    def __init__(self, total: _Optional[int] = ..., used: _Optional[int] = ..., reserved: _Optional[int] = ..., bad_held: _Optional[int] = ...) -> None: ...

class VirtualCluster(_message.Message):
    __slots__ = ("name", "cells", "pinned", "leaves", "groups")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    LEAVES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    cells: _containers.RepeatedCompositeFieldContainer[VcCells]
    pinned: _containers.RepeatedCompositeFieldContainer[PinnedCell]
    leaves: VcLeaves
    groups: int
    def __init__(self, name: _Optional[str] = ..., cells: _Optional[_Iterable[_Union[VcCells, _Mapping]]] = ..., pinned: _Optional[_Iterable[_Union[PinnedCell, _Mapping]]] = ..., leaves: _Optional[_Union[VcLeaves, _Mapping]] = ..., groups: _Optional[int] = ...) -> None: ...

class VcReply(_message.Message):
    __slots__ = ("json", "revision", "vc")
    JSON_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    VC_FIELD_NUMBER: _ClassVar[int]
    json: str
    revision: int
    vc: VirtualCluster
    def __init__(self, json: _Optional[str] = ..., revision: _Optional[int] = ..., vc: _Optional[_Union[VirtualCluster, _Mapping]] = ...) -> None: ...

class ChainUse(_message.Message):
    __slots__ = ("name", "leaf_type", "leaves", "free", "opportunistic", "guaranteed", "bad", "free_cells", "demand", "surplus")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEAF_TYPE_FIELD_NUMBER: _ClassVar[int]
    LEAVES_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    OPPORTUNISTIC_FIELD_NUMBER: _ClassVar[int]
    GUARANTEED_FIELD_NUMBER: _ClassVar[int]
    BAD_FIELD_NUMBER: _ClassVar[int]
    FREE_CELLS_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    SURPLUS_FIELD_NUMBER: _ClassVar[int]
    name: str
    leaf_type: str
    leaves: int
    free: int
    opportunistic: int
    guaranteed: int
    bad: int
    free_cells: _containers.RepeatedScalarFieldContainer[int]
    demand: _containers.RepeatedScalarFieldContainer[int]
    surplus: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., leaf_type: _Optional[str] = ..., leaves: _Optional[int] = ..., free: _Optional[int] = ..., opportunistic: _Optional[int] = ..., guaranteed: _Optional[int] = ..., bad: _Optional[int] = ..., free_cells: _Optional[_Iterable[int]] = ..., demand: _Optional[_Iterable[int]] = ..., surplus: _Optional[_Iterable[int]] = ...) -> None: ...

class Summary(_message.Message):
    __slots__ = ("chains", "nodes", "bad_nodes", "groups", "preempting", "vcs")
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    BAD_NODES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTING_FIELD_NUMBER: _ClassVar[int]
    VCS_FIELD_NUMBER: _ClassVar[int]
    chains: _containers.RepeatedCompositeFieldContainer[ChainUse]
    nodes: int
    bad_nodes: _containers.RepeatedScalarFieldContainer[str]
    groups: int
    preempting: int
    vcs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, chains: _Optional[_Iterable[_Union[ChainUse, _Mapping]]] = ..., nodes: _Optional[int] = ..., bad_nodes: _Optional[_Iterable[str]] = ..., groups: _Optional[int] = ..., preempting: _Optional[int] = ..., vcs: _Optional[_Iterable[str]] = ...) -> None: ...

class SummaryReply(_message.Message):
    __slots__ = ("json", "revision", "summary")
    JSON_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    json: str
    revision: int
    summary: Summary
    def __init__(self, json: _Optional[str] = ..., revision: _Optional[int] = ..., summary: _Optional[_Union[Summary, _Mapping]] = ...) -> None: ...

class PhysicalCell(_message.Message):
    __slots__ = ("address", "type", "level", "healthy", "state", "priority", "group", "partial", "node", "vc", "doomed", "virtual", "children")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    VC_FIELD_NUMBER: _ClassVar[int]
    DOOMED_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    address: str
    type: str
    level: int
    healthy: bool
    state: str
    priority: int
    group: str
    partial: bool
    node: str
    vc: str
    doomed: bool
    virtual: str
    children: _containers.RepeatedCompositeFieldContainer[PhysicalCell]
    def __init__(self, address: _Optional[str] = ..., type: _Optional[str] = ..., level: _Optional[int] = ..., healthy: _Optional[bool] = ..., state: _Optional[str] = ..., priority: _Optional[int] = ..., group: _Optional[str] = ..., partial: _Optional[bool] = ..., node: _Optional[str] = ..., vc: _Optional[str] = ..., doomed: _Optional[bool] = ..., virtual: _Optional[str] = ..., children: _Optional[_Iterable[_Union[PhysicalCell, _Mapping]]] = ...) -> None: ...

class ChainCells(_message.Message):
    __slots__ = ("chain", "cells")
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    chain: str
    cells: _containers.RepeatedCompositeFieldContainer[PhysicalCell]
    def __init__(self, chain: _Optional[str] = ..., cells: _Optional[_Iterable[_Union[PhysicalCell, _Mapping]]] = ...) -> None: ...

class VirtualCell(_message.Message):
    __slots__ = ("virtual", "address", "healthy", "state", "priority", "group", "children")
    VIRTUAL_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    virtual: str
    address: str
    healthy: bool
    state: str
    priority: int
    group: str
    children: _containers.RepeatedCompositeFieldContainer[VirtualCell]
    def __init__(self, virtual: _Optional[str] = ..., address: _Optional[str] = ..., healthy: _Optional[bool] = ..., state: _Optional[str] = ..., priority: _Optional[int] = ..., group: _Optional[str] = ..., children: _Optional[_Iterable[_Union[VirtualCell, _Mapping]]] = ...) -> None: ...

class VcCell(_message.Message):
    __slots__ = ("address", "chain", "type", "level", "pinned", "bound", "doomed", "used_leaves", "physical")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    DOOMED_FIELD_NUMBER: _ClassVar[int]
    USED_LEAVES_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_FIELD_NUMBER: _ClassVar[int]
    address: str
    chain: str
    type: str
    level: int
    pinned: str
    bound: bool
    doomed: bool
    used_leaves: int
    physical: VirtualCell
    def __init__(self, address: _Optional[str] = ..., chain: _Optional[str] = ..., type: _Optional[str] = ..., level: _Optional[int] = ..., pinned: _Optional[str] = ..., bound: _Optional[bool] = ..., doomed: _Optional[bool] = ..., used_leaves: _Optional[int] = ..., physical: _Optional[_Union[VirtualCell, _Mapping]] = ...) -> None: ...

class VcTree(_message.Message):
    __slots__ = ("vc", "cells")
    VC_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    vc: str
    cells: _containers.RepeatedCompositeFieldContainer[VcCell]
    def __init__(self, vc: _Optional[str] = ..., cells: _Optional[_Iterable[_Union[VcCell, _Mapping]]] = ...) -> None: ...

class Devices(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, devices: _Optional[_Iterable[int]] = ...) -> None: ...

class VirtualAddresses(_message.Message):
    __slots__ = ("addresses",)
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupTree(_message.Message):
    __slots__ = ("name", "vc", "priority", "state", "chain", "physical_placement", "virtual_placement", "victims", "preempted_by", "lazy_preemption", "allocated_pods")
    class PhysicalPlacementEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Devices
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Devices, _Mapping]] = ...) -> None: ...
    class VirtualPlacementEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: VirtualAddresses
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[VirtualAddresses, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VC_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    VICTIMS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_BY_FIELD_NUMBER: _ClassVar[int]
    LAZY_PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_PODS_FIELD_NUMBER: _ClassVar[int]
    name: str
    vc: str
    priority: int
    state: str
    chain: str
    physical_placement: _containers.MessageMap[str, Devices]
    virtual_placement: _containers.MessageMap[str, VirtualAddresses]
    victims: _containers.RepeatedScalarFieldContainer[str]
    preempted_by: _containers.RepeatedScalarFieldContainer[str]
    lazy_preemption: LazyPreemption
    allocated_pods: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., vc: _Optional[str] = ..., priority: _Optional[int] = ..., state: _Optional[str] = ..., chain: _Optional[str] = ..., physical_placement: _Optional[_Mapping[str, Devices]] = ..., virtual_placement: _Optional[_Mapping[str, VirtualAddresses]] = ..., victims: _Optional[_Iterable[str]] = ..., preempted_by: _Optional[_Iterable[str]] = ..., lazy_preemption: _Optional[_Union[LazyPreemption, _Mapping]] = ..., allocated_pods: _Optional[_Iterable[str]] = ...) -> None: ...

class PhysicalTrees(_message.Message):
    __slots__ = ("chains",)
    CHAINS_FIELD_NUMBER: _ClassVar[int]
    chains: _containers.RepeatedCompositeFieldContainer[ChainCells]
    def __init__(self, chains: _Optional[_Iterable[_Union[ChainCells, _Mapping]]] = ...) -> None: ...

class InspectReply(_message.Message):
    __slots__ = ("json", "revision", "physical", "vc", "group")
    JSON_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_FIELD_NUMBER: _ClassVar[int]
    VC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    json: str
    revision: int
    physical: PhysicalTrees
    vc: VcTree
    group: GroupTree
    def __init__(self, json: _Optional[str] = ..., revision: _Optional[int] = ..., physical: _Optional[_Union[PhysicalTrees, _Mapping]] = ..., vc: _Optional[_Union[VcTree, _Mapping]] = ..., group: _Optional[_Union[GroupTree, _Mapping]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("since", "typed", "from_now")
    SINCE_FIELD_NUMBER: _ClassVar[int]
    TYPED_FIELD_NUMBER: _ClassVar[int]
    FROM_NOW_FIELD_NUMBER: _ClassVar[int]
    since: int
    typed: bool
    from_now: bool
    def __init__(self, since: _Optional[int] = ..., typed: _Optional[bool] = ..., from_now: _Optional[bool] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("revision", "kind", "subject", "data_json", "placed", "preempting", "downgraded", "cancelled", "node_health", "reconfigured", "claimed")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    PLACED_FIELD_NUMBER: _ClassVar[int]
    PREEMPTING_FIELD_NUMBER: _ClassVar[int]
    DOWNGRADED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    NODE_HEALTH_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURED_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    revision: int
    kind: str
    subject: str
    data_json: str
    placed: PlacedEvent
    preempting: PreemptingEvent
    downgraded: DowngradedEvent
    cancelled: CancelledEvent
    node_health: NodeHealthEvent
    reconfigured: ReconfiguredEvent
    claimed: ClaimedEvent
    def __init__(self, revision: _Optional[int] = ..., kind: _Optional[str] = ..., subject: _Optional[str] = ..., data_json: _Optional[str] = ..., placed: _Optional[_Union[PlacedEvent, _Mapping]] = ..., preempting: _Optional[_Union[PreemptingEvent, _Mapping]] = ..., downgraded: _Optional[_Union[DowngradedEvent, _Mapping]] = ..., cancelled: _Optional[_Union[CancelledEvent, _Mapping]] = ..., node_health: _Optional[_Union[NodeHealthEvent, _Mapping]] = ..., reconfigured: _Optional[_Union[ReconfiguredEvent, _Mapping]] = ..., claimed: _Optional[_Union[ClaimedEvent, _Mapping]] = ...) -> None: ...

class PlacedEvent(_message.Message):
    __slots__ = ("chain", "pods", "token")
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    chain: str
    pods: _containers.RepeatedCompositeFieldContainer[Pod]
    token: int
    def __init__(self, chain: _Optional[str] = ..., pods: _Optional[_Iterable[_Union[Pod, _Mapping]]] = ..., token: _Optional[int] = ...) -> None: ...

class PreemptingEvent(_message.Message):
    __slots__ = ("victims",)
    VICTIMS_FIELD_NUMBER: _ClassVar[int]
    victims: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, victims: _Optional[_Iterable[str]] = ...) -> None: ...

class DowngradedEvent(_message.Message):
    __slots__ = ("preemptor",)
    PREEMPTOR_FIELD_NUMBER: _ClassVar[int]
    preemptor: str
    def __init__(self, preemptor: _Optional[str] = ...) -> None: ...

class CancelledEvent(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class NodeHealthEvent(_message.Message):
    __slots__ = ("healthy",)
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    healthy: bool
    def __init__(self, healthy: _Optional[bool] = ...) -> None: ...

class ReconfiguredEvent(_message.Message):
    __slots__ = ("digest",)
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    digest: str
    def __init__(self, digest: _Optional[str] = ...) -> None: ...

class ClaimedEvent(_message.Message):
    __slots__ = ("incarnation", "slot", "uid", "pod", "previous")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    incarnation: int
    slot: int
    uid: str
    pod: str
    previous: str
    def __init__(self, incarnation: _Optional[int] = ..., slot: _Optional[int] = ..., uid: _Optional[str] = ..., pod: _Optional[str] = ..., previous: _Optional[str] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("events", "compacted", "revision", "oldest", "through", "skipped")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    OLDEST_FIELD_NUMBER: _ClassVar[int]
    THROUGH_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    compacted: bool
    revision: int
    oldest: int
    through: int
    skipped: int
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., compacted: _Optional[bool] = ..., revision: _Optional[int] = ..., oldest: _Optional[int] = ..., through: _Optional[int] = ..., skipped: _Optional[int] = ...) -> None: ...

class WatchControl(_message.Message):
    __slots__ = ("start", "ack")
    START_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    start: WatchRequest
    ack: int
    def __init__(self, start: _Optional[_Union[WatchRequest, _Mapping]] = ..., ack: _Optional[int] = ...) -> None: ...

class ListMembersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterMember(_message.Message):
    __slots__ = ("id", "incarnation", "voter", "site", "peer_address", "client_address", "grpc_address", "metrics_address", "published")
    ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    VOTER_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    id: int
    incarnation: int
    voter: bool
    site: str
    peer_address: str
    client_address: str
    grpc_address: str
    metrics_address: str
    published: bool
    def __init__(self, id: _Optional[int] = ..., incarnation: _Optional[int] = ..., voter: _Optional[bool] = ..., site: _Optional[str] = ..., peer_address: _Optional[str] = ..., client_address: _Optional[str] = ..., grpc_address: _Optional[str] = ..., metrics_address: _Optional[str] = ..., published: _Optional[bool] = ...) -> None: ...

class ListMembersReply(_message.Message):
    __slots__ = ("members", "epoch", "replica", "applied")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[ClusterMember]
    epoch: int
    replica: int
    applied: int
    def __init__(self, members: _Optional[_Iterable[_Union[ClusterMember, _Mapping]]] = ..., epoch: _Optional[int] = ..., replica: _Optional[int] = ..., applied: _Optional[int] = ...) -> None: ...
