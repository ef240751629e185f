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
    __slots__ = ("group", "session")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    group: GroupSpec
    session: Session
    def __init__(self, group: _Optional[_Union[GroupSpec, _Mapping]] = ..., session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

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
    __slots__ = ("promoted",)
    PROMOTED_FIELD_NUMBER: _ClassVar[int]
    promoted: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, promoted: _Optional[_Iterable[str]] = ...) -> None: ...

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
    __slots__ = ("config_yaml", "dry_run", "session")
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    dry_run: bool
    session: Session
    def __init__(self, config_yaml: _Optional[str] = ..., dry_run: _Optional[bool] = ..., session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class ReconfigureReply(_message.Message):
    __slots__ = ("digest", "changed", "report_json")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    digest: str
    changed: bool
    report_json: str
    def __init__(self, digest: _Optional[str] = ..., changed: _Optional[bool] = ..., report_json: _Optional[str] = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ("kind", "name", "stale")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    stale: bool
    def __init__(self, kind: _Optional[str] = ..., name: _Optional[str] = ..., stale: _Optional[bool] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("name", "stale")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    name: str
    stale: bool
    def __init__(self, name: _Optional[str] = ..., stale: _Optional[bool] = ...) -> None: ...

class JsonReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("since",)
    SINCE_FIELD_NUMBER: _ClassVar[int]
    since: int
    def __init__(self, since: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("revision", "kind", "subject", "data_json")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    revision: int
    kind: str
    subject: str
    data_json: str
    def __init__(self, revision: _Optional[int] = ..., kind: _Optional[str] = ..., subject: _Optional[str] = ..., data_json: _Optional[str] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("events", "compacted", "revision", "oldest")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    OLDEST_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    compacted: bool
    revision: int
    oldest: int
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., compacted: _Optional[bool] = ..., revision: _Optional[int] = ..., oldest: _Optional[int] = ...) -> None: ...
