"""The replicated GPU/job allocation store (HiveD's model) built on ``consensus``.

Modules, one job each:

* ``config``    — HiveD's YAML configuration: parse, validate, synthesise;
* ``cells``     — the static cell tree, chains and the VCs' preassigned cells (``Topology``);
* ``index``     — per-cell counters and free-capacity indexes;
* ``buddy``     — free lists, binding VC cells to physical cells, safety, doomed bad cells;
* ``placement`` — packing a gang's pods and picking leaves (lowest common ancestor);
* ``allocator`` — groups, priorities, preemption, node health, conditional bind;
* ``reconfiguration`` — a new topology's allocator holding the running groups;
* ``reads``, ``inspection`` — status documents and HiveD's inspect trees (read models);
* ``ops``       — operation/result encoding and builders;
* ``events``    — the bounded watch stream;
* ``store``     — ``ClusterStore``, the ``consensus`` ``StateMachine``;
* ``errors``    — the exception hierarchy;
* ``client``    — ``AllocationStore``, the schedulers' API (embedded or remote);
* ``grpc_api``  — the gRPC service; ``ctl`` — ``sdpaxos ctl``;
* ``workload``, ``ledger``, ``demo`` — ``sdpaxos demo``'s job mix, GPU ownership witness, and run.
"""

from cluster_state.allocator import Allocator, Group
from cluster_state.cells import ChainInfo, Item, LevelInfo, Topology
from cluster_state.client import Allocations, AllocationStore
from cluster_state.config import (
    CellTypeSpec,
    ClusterConfig,
    PhysicalCellSpec,
    StoreOptions,
    VirtualCellSpec,
    VirtualClusterSpec,
    load_config,
    parse_config,
    synthetic_config,
)
from cluster_state.errors import (
    ClusterStateError,
    EventsCompacted,
    GpuConfigError,
    InvalidRequest,
    NotFound,
    OlderReplica,
    RequestError,
    SnapshotError,
)
from cluster_state.events import (
    CancelledDetails,
    ChangeEvent,
    DowngradedDetails,
    EventDetails,
    EventLog,
    NodeHealthDetails,
    PlacedDetails,
    PreemptingDetails,
    ReconfiguredDetails,
)
from cluster_state.ops import (
    MAX_PRIORITY,
    OPPORTUNISTIC,
    Bind,
    Conflict,
    Error,
    GetGroup,
    GetSummary,
    GetVC,
    GroupSpec,
    Inspect,
    ListGroups,
    Member,
    NodeHealthSet,
    Op,
    Placed,
    PlanReconfigure,
    Pod,
    PodPlacement,
    Preempting,
    Query,
    Reconfigure,
    Reconfigured,
    Release,
    Released,
    Result,
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
    inspect,
    list_groups,
    plan_reconfigure,
    reconfigure,
    release,
    set_node_health,
    submit,
)
from cluster_state.store import SNAPSHOT_FORMAT, ClusterStore

__all__ = [
    "MAX_PRIORITY",
    "OPPORTUNISTIC",
    "SNAPSHOT_FORMAT",
    "AllocationStore",
    "Allocations",
    "Allocator",
    "Bind",
    "CancelledDetails",
    "CellTypeSpec",
    "ChainInfo",
    "ChangeEvent",
    "ClusterConfig",
    "ClusterStateError",
    "ClusterStore",
    "Conflict",
    "DowngradedDetails",
    "Error",
    "EventDetails",
    "EventLog",
    "EventsCompacted",
    "GetGroup",
    "GetSummary",
    "GetVC",
    "GpuConfigError",
    "Group",
    "GroupSpec",
    "Inspect",
    "InvalidRequest",
    "Item",
    "LevelInfo",
    "ListGroups",
    "Member",
    "NodeHealthDetails",
    "NodeHealthSet",
    "NotFound",
    "OlderReplica",
    "Op",
    "PhysicalCellSpec",
    "Placed",
    "PlacedDetails",
    "PlanReconfigure",
    "Pod",
    "PodPlacement",
    "Preempting",
    "PreemptingDetails",
    "Query",
    "Reconfigure",
    "Reconfigured",
    "ReconfiguredDetails",
    "Release",
    "Released",
    "RequestError",
    "Result",
    "SetNodeHealth",
    "SnapshotError",
    "StoreOptions",
    "Submit",
    "Topology",
    "VirtualCellSpec",
    "VirtualClusterSpec",
    "Waiting",
    "bind",
    "decode_op",
    "decode_query",
    "decode_result",
    "encode_result",
    "get_group",
    "get_summary",
    "get_vc",
    "inspect",
    "list_groups",
    "load_config",
    "parse_config",
    "plan_reconfigure",
    "reconfigure",
    "release",
    "set_node_health",
    "submit",
    "synthetic_config",
]
