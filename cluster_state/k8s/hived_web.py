"""HiveD's web server semantics (``pkg/webserver``, ``pkg/internal/utils.go``): its paths, its
answers' shapes and its error texts, so every caller of the extender — kube-scheduler, and
the tools that read HiveD's inspect API — sees what HiveD shows it.

Errors are HiveD's ``WebServerError {code, message}``: 4xx a *User Error*, 5xx a *Platform
Error*. How one reaches the caller depends on the path, as in HiveD:

================================  ==========================================================
path                              an error is answered as
================================  ==========================================================
``/v1/extender/filter``, ``bind`` HTTP 200 with the result's ``Error``: ``Code: 400,
                                  Message: hivedscheduler: User Error: [uid(ns/name)]:
                                  filterRoutine: Failed: <message>`` (kube-scheduler reads a
                                  200 answer's ``Error`` into the pod's events; it reads no
                                  body of another status)
``/v1/extender/preempt``          the error's HTTP status, the body the JSON string
                                  ``hivedscheduler: User Error: [...]: preemptRoutine: ...``
                                  (kube-scheduler's preemption result has no error field)
``/v1/inspect/...``, ``/``        the error's HTTP status and JSON string, without a routine
================================  ==========================================================

A request body that is not the path's JSON is a user error at the same place (``Failed to
unmarshal web request body to ExtenderArgs: ...``). Results carry every field of their Go
type, as Go's encoder writes them (``Nodes``, ``NodeNames``, ``FailedNodes``, ``Error``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from cluster_state.k8s.hived import PodRequest

__all__ = [
    "AFFINITY_GROUPS_PATH",
    "BIND_PATH",
    "CLUSTER_STATUS_PATH",
    "COMPONENT",
    "FILTER_PATH",
    "NOT_INFORMED",
    "PATHS",
    "PHYSICAL_CLUSTER_PATH",
    "PREEMPT_PATH",
    "VIRTUAL_CLUSTERS_PATH",
    "WAITING",
    "WebServerError",
    "binding_result",
    "filter_result",
    "go_json",
    "hived_reason",
    "hived_waits",
    "in_routine",
    "platform_error",
    "pod_key",
    "preemption_result",
    "shown",
    "user_error",
]

#: HiveD's component name: in its error texts and its FailedNodes key
COMPONENT = "hivedscheduler"
FILTER_PATH = "/v1/extender/filter"
BIND_PATH = "/v1/extender/bind"
PREEMPT_PATH = "/v1/extender/preempt"
AFFINITY_GROUPS_PATH = "/v1/inspect/affinitygroups/"
CLUSTER_STATUS_PATH = "/v1/inspect/clusterstatus"
PHYSICAL_CLUSTER_PATH = CLUSTER_STATUS_PATH + "/physicalcluster"
VIRTUAL_CLUSTERS_PATH = CLUSTER_STATUS_PATH + "/virtualclusters/"
#: what ``GET /`` lists: HiveD's paths in its order (``/healthz`` is this extender's own)
PATHS = ("/", FILTER_PATH, BIND_PATH, PREEMPT_PATH, AFFINITY_GROUPS_PATH, CLUSTER_STATUS_PATH,
         PHYSICAL_CLUSTER_PATH, VIRTUAL_CLUSTERS_PATH, "/healthz")
#: HiveD's answer for a pod its informer does not hold
NOT_INFORMED = "Pod does not exist, completed or has not been informed to the scheduler"
#: the start of HiveD's wait reason (its FailedNodes entry under ``COMPONENT``)
WAITING = "Pod is waiting for preemptible or free resource to appear"
USER, PLATFORM = 400, 500


class WebServerError(Exception):
    """HiveD's ``WebServerError``: ``code`` (4xx user, 5xx platform) and ``message``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"Code: {code}, Message: {message}")
        self.code = code
        self.message = message


def user_error(message: str) -> WebServerError:
    return WebServerError(USER, message)


def platform_error(message: str) -> WebServerError:
    return WebServerError(PLATFORM, message)


def in_routine(error: WebServerError, key: str, routine: str) -> WebServerError:
    """``error`` raised inside a routine for pod ``key`` (HiveD's ``HandleRoutinePanic``)."""
    return WebServerError(error.code, f"[{key}]: {routine}: Failed: {error.message}")


def shown(error: WebServerError) -> WebServerError:
    """``error`` with the prefix HiveD's ``HandleWebServerPanic`` gives it."""
    kind = "Platform Error" if error.code >= PLATFORM else "User Error"
    return WebServerError(error.code, f"{COMPONENT}: {kind}: {error.message}")


def pod_key(namespace: str, name: str, uid: str) -> str:
    """HiveD's pod key in messages: ``uid(namespace/name)``."""
    return f"{uid}({namespace}/{name})"


def go_json(value: Any) -> str:
    """``value`` as Go's ``json.Marshal`` writes it (compact; HTML characters escaped)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def filter_result(*, node_names: list[str] | None = None, failed: dict[str, str] | None = None,
                  nodes: Any = None, error: str = "") -> dict[str, Any]:
    """``ExtenderFilterResult``, every field as Go writes it."""
    return {"Nodes": nodes, "NodeNames": node_names, "FailedNodes": failed, "Error": error}


def binding_result(error: str = "") -> dict[str, Any]:
    """``ExtenderBindingResult``."""
    return {"Error": error}


def preemption_result(victims: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """``ExtenderPreemptionResult``: node -> the UIDs of the pods to preempt there."""
    if not victims:
        return {"NodeNameToMetaVictims": None}
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 0}
        for node, uids in victims.items()}}


# The store's refusals of a request that HiveD refuses too, and how HiveD words them
# (``validateSchedulingRequest``, ``scheduleNewAffinityGroup``). The store's reasons are
# ``cluster_state.allocator._chains_for``'s and ``cluster_state.ops``'; a test holds each
# pair to the real store and to HiveD's own answers.
_REASONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^unknown virtual cluster '(?P<vc>.*)'$"), "VC {vc} does not exists!"),
    (re.compile(r"^unknown leaf cell type '(?P<type>.*)'$"),
     "Pod requesting leaf cell type {type} which the whole cluster does not have"),
    (re.compile(r"^pinned cell '(?P<pin>.*)' is not one of (?P<vc>.*)'s$"),
     "VC {vc} does not have pinned cell {pin}"),
    (re.compile(r"^virtual cluster (?P<vc>\S+) has no leaf type (?P<type>.*)$"),
     "Pod requesting leaf cell type {type} which VC {vc} does not have"),
    (re.compile(r"^an opportunistic group \(priority -1\) cannot use a pinned cell$"),
     "opportunistic pod not supported to use pinned cell {pinned}"),
)


def hived_reason(reason: str, request: PodRequest) -> str:
    """The store's refusal ``reason`` of ``request``, as HiveD words it where it refuses the
    same (prefixed with the pod's key, as HiveD's are); else the store's."""
    for pattern, template in _REASONS:
        match = pattern.match(reason)
        if match is not None:
            text = template.format(**match.groupdict(), pinned=request.spec.pinned)
            return f"[{request.key}]: {text}"
    return reason


# The store's refusals of a request HiveD takes and leaves waiting for ever (its
# topology-aware scheduler finds no room, at every attempt): the extender answers them as HiveD
# does, as a wait, with the store's clearer reason.
_WAITS = (
    re.compile(r"^a pod of \d+ leaf cells does not fit in one node of "),
    re.compile(r"^the group needs \d+ leaf cells, pinned cell .* holds \d+: it can never fit$"),
    re.compile(r"^virtual cluster \S+ has no floating cells$"),
)


def hived_waits(reason: str) -> bool:
    """Whether HiveD lets a request the store refuses with ``reason`` wait instead."""
    return any(pattern.match(reason) for pattern in _WAITS)
