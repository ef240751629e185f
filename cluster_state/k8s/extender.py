"""``sdpaxos extender``: a Kubernetes scheduler extender speaking HiveD's protocol, with every
decision taken by the replicated allocation store, so any number of extender instances (in
any number of regions, behind any number of kube-schedulers) serve one cluster.

Endpoints: HiveD's (``pkg/webserver``), with its answers and its errors
(``cluster_state.k8s.hived_web``); request bodies are the extender API's JSON
(``ExtenderArgs``, ``ExtenderPreemptionArgs``, ``ExtenderBindingArgs``), field names read
case-insensitively as Go's decoder does, so kube-schedulers old (no JSON tags) and new
(``k8s.io/kube-scheduler/extender/v1`` tags) both work:

* ``POST /v1/extender/filter`` — the *filtering phase*, which reserves nothing:
  a pod of a group the store has placed gets its node (idempotent: a re-filter of a binding
  pod answers the same node); a new group is planned with the store's dry run
  (``plan_submit``): a plan without victims is taken with a conditional ``bind`` of exactly
  that placement at the revision the plan read (it fails, and is planned again, if any of its
  GPUs changed meanwhile — another extender got there first); a plan that needs victims fails
  the nodes of the victims' pods, naming them (``node(N) has preemptible Pods: ...``), so
  kube-scheduler calls preempt; otherwise the pod waits (``FailedNodes`` under
  ``hivedscheduler``: HiveD's wait reason, after ``waitingPodSchedulingBlockMilliSec`` during
  which this extender starts no other scheduling). A binding pod filtered again counts a bind
  attempt; at ``forcePodBindThreshold`` attempts, or when its node is not one Kubernetes
  suggested (or not a node at all, when the extender watches nodes), the extender binds it
  itself, as HiveD's force bind does. With ``ignoreK8sSuggestedNodes: false`` the plan is
  made inside the nodes Kubernetes suggests (the store's search runs in them; HiveD's
  suggested nodes).
* ``POST /v1/extender/preempt`` — the *preempting phase*: ``submit`` creates the reservation
  (the store's Preempting group: higher priorities only may take its cells) and the answer
  names the victims by pod UID: the live pods of the victim groups on every node they run on
  (kube-scheduler picks the node it preempts on). With ``ignoreK8sSuggestedNodes: false`` the
  candidate nodes (``nodeNameToMetaVictims``, ``nodeNameToVictims`` or newer schedulers'
  ``nodeToVictims``) are the suggested ones: the reservation is made inside them, and one
  made before whose nodes are no longer all among them is cancelled and made again (HiveD's
  preempting phase). A group already placed, or one with no victims, answers no victims
  (the next filter binds it).
* ``POST /v1/extender/bind`` — the pod's Binding through the Kubernetes API, carrying HiveD's
  ``pod-bind-info`` and ``pod-leaf-cell-isolation`` annotations and the allocation's fencing
  token in its own annotation (``cluster_state.k8s.hived``). Every field of
  ``ExtenderBindingArgs`` (the pod's namespace, name and UID, the node) is required, as
  HiveD's.
* ``GET /`` (HiveD's paths), ``GET /v1/inspect/affinitygroups/[NAME]``, ``GET
  /v1/inspect/clusterstatus[/physicalcluster | /virtualclusters/[NAME]]`` — HiveD's inspect
  objects (``cluster_state.hived_view``; linearizable reads); a Preempting group's
  ``preemptingPods`` are its unbound pods this extender's pod cache holds.
* ``GET /healthz`` — here, the extender runs; ``sdpaxos extender`` answers it (and ``/readyz``)
  itself: 503 while the Kubernetes API or the store is out of reach or the pod cache has not
  synced (``cluster_state.k8s.cli.health_check``); ``/livez``: the process runs
  (``cluster_state.k8s.web``).

Every pod the extender reads comes from its pod cache (``cluster_state.k8s.pods``: a watch,
HiveD's informer); a pod the cache does not hold (yet) is read from the API server once, and
one that is gone there is HiveD's ``Pod does not exist, completed or has not been informed
to the scheduler``.

**Which pod gets which part of its group.** The store places the whole gang at once (one
placement per pod — a *member slot* — HiveD's affinity group); which pod takes which slot is a
fact of the store too: a ``claim`` (``cluster_state.ops``), one logged compare-and-set on the
group's incarnation, gives slot k to pod UID u. The filter of a pod of a placed group claims
its slot before answering the slot's node, and the bind claims it again (idempotent for the
same UID) before posting the Binding, so whatever each extender's pod cache shows, a slot's
GPUs go to one pod only: a second pod's claim of a held slot is refused, and its extender
reads the claims again and picks another. The cache only *suggests* the slot (so that
extenders rarely collide): the pod's claim if it has one, else the free slots of its
leafCellNumber (not claimed, and not held by a pod bound before claims existed, by its
``pod-bind-info``) in the pod-name order of the gang's unclaimed unbound pods. A slot held by
a pod that is gone for good — the API server answers 404 for it, another UID under its name,
or a pod deleting or finished, none of which Kubernetes binds any more — is taken over with a
claim naming that holder as the previous one (a restarted pod of a running gang). A pod that
is already bound keeps its GPUs until it is deleted, as HiveD's.

**Releasing.** ``GangReaper`` reads the pods the cache saw go: when a HiveD pod is gone and no
live pod of its gang remains, it releases the group in the store (HiveD's DeleteAllocatedPod /
DeleteUnallocatedPod: a preempting group's reservation is cancelled), which completes the
preemptions waiting for it. It reads the group's incarnation *before* listing the pods from
the API server and releases only that incarnation (``release_if``): a new gang of the same
name placed after that read is another incarnation, and one placed before it has its pods in
the listing (a pod exists before it is filtered), so a new gang is never released by an old
one's reaper. (It lists only when the cache shows no live pod of the gang left: once per
gang, not once per pod.) ``NodeWatcher`` (``cluster_state.k8s.nodes``) feeds node health.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from cluster_state.client import AllocationStore
from cluster_state.errors import InvalidRequest, NotFound
from cluster_state.k8s.hived import (
    SPEC_ANNOTATION,
    PodRequest,
    SpecError,
    bind_annotations,
    pod_request,
    slot_of_bound_pod,
)
from cluster_state.k8s.hived_web import (
    AFFINITY_GROUPS_PATH,
    BIND_PATH,
    CLUSTER_STATUS_PATH,
    COMPONENT,
    FILTER_PATH,
    NOT_INFORMED,
    PATHS,
    PHYSICAL_CLUSTER_PATH,
    PREEMPT_PATH,
    VIRTUAL_CLUSTERS_PATH,
    WAITING,
    WebServerError,
    binding_result,
    filter_result,
    go_json,
    hived_reason,
    hived_waits,
    in_routine,
    platform_error,
    pod_key,
    preemption_result,
    shown,
    user_error,
)
from cluster_state.k8s.kube import CREATED, NOT_FOUND, KubeApi
from cluster_state.k8s.pods import CachedPod, PodCache, interesting, live
from cluster_state.k8s.web import HttpError, Reply
from cluster_state.ops import Claimed, Conflict, Placed, Pod, PodPlacement, Preempting, Waiting
from consensus.errors import SDPaxosError

__all__ = ["Extender", "GangReaper", "field"]

log = logging.getLogger(__name__)

#: how many times a filter plans again when another scheduler took its GPUs first
FILTER_ATTEMPTS = 5
#: how many times a pod claims a member slot again when another pod claimed it first
CLAIM_ATTEMPTS = 5
#: HiveD's defaults (``pkg/api/config.go``): filters of a binding pod before the extender
#: binds it itself, and how long a waiting pod's filter holds the scheduling back
FORCE_POD_BIND_THRESHOLD = 3
WAITING_POD_SCHEDULING_BLOCK_MS = 0


def field(obj: Any, name: str) -> Any:
    """``obj[name]`` matched case-insensitively (Go's JSON decoding), else None."""
    if not isinstance(obj, dict):
        return None
    if name in obj:
        return obj[name]
    lower = name.lower()
    return next((v for k, v in obj.items() if isinstance(k, str) and k.lower() == lower), None)


def _meta(pod: Any) -> dict[str, Any]:
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    return meta if isinstance(meta, dict) else {}


def _name(obj: Any) -> str:
    return str(_meta(obj).get("name") or "")


def _placed_from_info(info: dict[str, Any]) -> Placed:
    return Placed(
        str(info["name"]), str(info["chain"]),
        tuple(Pod(int(n), str(node), tuple(int(d) for d in devices))
              for n, node, devices in info["pods"]),
        int(info["token"]),
    )


def _decode(raw: bytes, what: str) -> Any:
    """A request body as Go decodes it into ``what``; HiveD's user error if it does not."""
    try:
        args = json.loads(raw) if raw.strip() else None
    except ValueError as exc:
        raise user_error(f"Failed to unmarshal web request body to {what}: {exc}") from None
    if raw.strip() == b"":
        raise user_error(f"Failed to unmarshal web request body to {what}: EOF")
    if args is not None and not isinstance(args, dict):
        kind = "array" if isinstance(args, list) else type(args).__name__
        raise user_error(f"Failed to unmarshal web request body to {what}: json: cannot "
                         f"unmarshal {kind} into Go value of type api.{what}")
    return args or {}


class Extender:
    """HiveD's extender over the replicated store (see the module documentation).

    ``pods`` is the extender's pod cache; whoever runs the extender runs ``pods.run()`` too
    (``sdpaxos extender`` does). ``node_known``, if given, says whether a node exists (the
    node watcher's view), for the force bind's check of a binding pod's node."""

    def __init__(self, store: AllocationStore, kube: KubeApi, pods: PodCache | None = None, *,
                 force_bind_threshold: int = FORCE_POD_BIND_THRESHOLD,
                 waiting_block_ms: int = WAITING_POD_SCHEDULING_BLOCK_MS,
                 node_known: Callable[[str], bool] | None = None) -> None:
        self.store = store
        self.kube = kube
        self.pods = pods if pods is not None else PodCache(kube)
        self.force_bind_threshold = force_bind_threshold
        self.waiting_block_s = waiting_block_ms / 1000
        self.node_known = node_known
        #: pod UID -> filters of it since it was given its node (HiveD's PodBindAttempts)
        self.bind_attempts: dict[str, int] = {}
        self.forced_binds: set[asyncio.Task[None]] = set()
        self._scheduling = asyncio.Lock()  # held while a waiting pod blocks the scheduling

    # ------------------------------------------------------------------ routing
    async def handle(self, method: str, path: str, query: dict[str, list[str]],
                     body: bytes) -> Reply:
        if path in (FILTER_PATH, BIND_PATH):
            verb = self.filter if path == FILTER_PATH else self.bind
            what = "ExtenderArgs" if path == FILTER_PATH else "ExtenderBindingArgs"
            result = filter_result if path == FILTER_PATH else binding_result
            try:
                return Reply(200, await verb(_decode(body, what)))
            except WebServerError as exc:
                return Reply(200, result(error=str(shown(exc))))
        try:
            if path == PREEMPT_PATH:
                return Reply(200, await self.preempt(_decode(body, "ExtenderPreemptionArgs")))
            if path == "/healthz":
                return Reply(200, {"status": "ok"})
            return Reply(200, await self._inspect(method, path))
        except WebServerError as exc:
            error = shown(exc)
            return Reply(error.code, error.message)

    async def _routine(self, routine: str, key: str, request: PodRequest | None,
                       call: Callable[[], Any]) -> Any:
        """``call()`` as HiveD's routine ``routine`` for pod ``key``: every failure becomes
        HiveD's error, prefixed with the pod and the routine."""
        try:
            return await call()
        except WebServerError as exc:
            raise in_routine(exc, key, routine) from None
        except SpecError as exc:
            raise in_routine(user_error(str(exc)), key, routine) from None
        except InvalidRequest as exc:  # the store refuses the request
            reason = str(exc) if request is None else hived_reason(str(exc), request)
            raise in_routine(user_error(reason), key, routine) from None
        except (SDPaxosError, HttpError) as exc:  # the store or the API server: retry later
            what = "allocation store" if isinstance(exc, SDPaxosError) else "Kubernetes API"
            raise in_routine(platform_error(f"{what} unavailable: {exc}"), key,
                             routine) from None
        except Exception as exc:  # a bug: HiveD's platform error, and the extender goes on
            log.exception("%s of %s", routine, key)
            raise in_routine(platform_error(f"{type(exc).__name__}: {exc}"), key,
                             routine) from None

    async def _pod_routine(self, routine: str, pod: dict[str, Any],
                           call: Callable[[], Any]) -> dict[str, Any]:
        """``_routine`` for the pod of a filter or a preemption (its request, if it reads,
        words the store's refusals as HiveD does)."""
        meta = _meta(pod)
        key = pod_key(*(str(meta.get(k) or "") for k in ("namespace", "name", "uid")))
        request: PodRequest | None = None
        with contextlib.suppress(SpecError):
            request = pod_request(pod)
        result: dict[str, Any] = await self._routine(routine, key, request, call)
        return result

    async def _admitted(self, namespace: str, name: str, uid: str) -> CachedPod:
        """The pod as HiveD's informer holds it: live, asking for HiveD, this UID; read from
        the API server if the cache does not hold it (yet). Else HiveD's user error."""
        cached = self.pods.by_uid(uid) if uid else self.pods.pod(namespace, name)
        if cached is None:
            try:
                found = await self.kube.get_pod(namespace, name)
            except HttpError as exc:
                if exc.status == NOT_FOUND:
                    raise user_error(NOT_INFORMED) from None
                raise
            if (uid and str(_meta(found).get("uid") or "") != uid) or not interesting(found):
                raise user_error(NOT_INFORMED)
            try:
                cached = CachedPod(found, pod_request(found))
            except SpecError:
                cached = CachedPod(found, None)
        if cached.node:
            raise user_error(f"Pod has already been bound to node {cached.node}")
        return cached

    async def _unblocked(self) -> None:
        """Wait while a waiting pod holds the scheduling back (HiveD's lock)."""
        if self.waiting_block_s > 0:
            async with self._scheduling:
                pass

    # ------------------------------------------------------------------ filter
    async def filter(self, args: Any) -> dict[str, Any]:
        """``ExtenderArgs`` in, ``ExtenderFilterResult`` out."""
        pod = field(args, "pod")
        node_objects = field(field(args, "nodes"), "items")
        names = field(args, "nodeNames")
        if not isinstance(pod, dict):
            echo = {"Pod": None, "Nodes": field(args, "nodes"),
                    "NodeNames": names if names is not None else []}
            raise user_error(f"ExtenderArgs: Pod field should not be nil: {go_json(echo)}")
        suggested = [str(n) for n in names or []] or [_name(n) for n in node_objects or []]
        meta = _meta(pod)
        namespace, name, uid = (str(meta.get(k) or "") for k in ("namespace", "name", "uid"))
        await self._unblocked()

        async def routine() -> dict[str, Any]:
            await self._admitted(namespace, name, uid)
            return await self._filter(pod_request(pod), suggested, node_objects)

        return await self._pod_routine("filterRoutine", pod, routine)

    async def _filter(self, request: PodRequest, suggested: list[str],
                      node_objects: Any) -> dict[str, Any]:
        try:
            outcome = await self._placement_for_filter(
                request, None if request.ignore_suggested else suggested)
        except InvalidRequest as exc:
            if not hived_waits(exc.reason):
                raise
            outcome = exc.reason
        if isinstance(outcome, dict):  # preemptible pods named per node
            return filter_result(failed=outcome)
        if isinstance(outcome, str):
            return await self._waiting(outcome)
        claimed = await self._claim(request)
        if isinstance(claimed, str):
            return await self._waiting(claimed)
        info, slot, held = claimed
        node = str(info["pods"][slot][1])
        self._count_bind_attempt(request, node, suggested, held)
        nodes = None
        if node_objects is not None:  # a scheduler without a node cache wants node objects
            chosen = [n for n in node_objects if _name(n) == node]
            nodes = {"items": chosen or [{"metadata": {"name": node}}]}
        return filter_result(node_names=[node], nodes=nodes)

    async def _waiting(self, reason: str) -> dict[str, Any]:
        """HiveD's answer for a pod that waits, after holding the scheduling back for
        ``waitingPodSchedulingBlockMilliSec`` (for a stricter first-come first-served)."""
        if self.waiting_block_s > 0:
            async with self._scheduling:
                await asyncio.sleep(self.waiting_block_s)
        return filter_result(failed={COMPONENT: f"{WAITING}: {reason}" if reason else WAITING})

    def _count_bind_attempt(self, request: PodRequest, node: str, suggested: list[str],
                            held: bool) -> None:
        """HiveD's ``shouldForceBind``: a binding pod filtered again counts an attempt; at
        the threshold, or if its node is not one Kubernetes suggested (or does not exist),
        the extender binds the pod itself, in the background."""
        attempts = self.bind_attempts.get(request.uid, -1) + 1 if held else 0
        self.bind_attempts[request.uid] = attempts
        if len(self.bind_attempts) > 2 * len(self.pods) + 64:  # forget the pods bound since
            self.bind_attempts = {uid: n for uid, n in self.bind_attempts.items()
                                  if (cached := self.pods.by_uid(uid)) and not cached.node}
        why = ""
        if attempts >= self.force_bind_threshold:
            why = (f"the pod binding has already been tried {attempts} times, the "
                   f"forcePodBindThreshold {self.force_bind_threshold}")
        elif self.node_known is not None and not self.node_known(node):
            why = f"its node {node} does not exist or has not been informed to the extender"
        elif node not in suggested:
            why = f"its node {node} is not within the nodes Kubernetes suggested"
        if why:
            log.warning("will force bind %s: %s", request.key, why)
            args = {"PodName": request.name, "PodNamespace": request.namespace,
                    "PodUID": request.uid, "Node": node}
            task = asyncio.create_task(self._force_bind(args), name=f"bind {request.key}")
            self.forced_binds.add(task)
            task.add_done_callback(self.forced_binds.discard)

    async def _force_bind(self, args: dict[str, str]) -> None:
        try:
            await self.bind(args)
        except WebServerError as exc:
            log.warning("force bind: %s", shown(exc))
        except Exception:
            log.exception("force bind of %s/%s", args["PodNamespace"], args["PodName"])

    async def _placement_for_filter(self, request: PodRequest, suggested: list[str] | None
                                    ) -> Placed | dict[str, str] | str:
        """The group's placement, taking it if a plan (inside ``suggested``, if given) needs
        no victims; else the nodes whose pods a preemption needs (HiveD's FailedNodes), or why
        the pod waits."""
        spec, store = request.spec, self.store
        for _ in range(FILTER_ATTEMPTS):
            info = await store.status(spec.name)
            if info is not None:
                if info["state"] == "placed":
                    return _placed_from_info(info)
                if info["state"] == "preempting":
                    return (self._preemptible(info["victims"])
                            or f"preemption of {', '.join(info['victims'])} in progress")
                # reserved: the victims are gone, confirm the reservation (HiveD binds it now)
                confirmed = await store.submit(spec)
                if isinstance(confirmed, Placed):
                    return confirmed
                continue
            revision, plan = await store.plan_submit(spec, suggested=suggested)
            if isinstance(plan, Waiting):
                return plan.reason
            if isinstance(plan, Preempting):
                return (self._preemptible(plan.victims)
                        or f"preemption needed: victims {', '.join(plan.victims)}")
            pods = tuple(PodPlacement(node, devices) for _, node, devices in plan.pods)
            try:
                taken = await store.bind(spec, pods, revision)
            except InvalidRequest as exc:  # another extender placed the group meanwhile
                log.info("filter %s: %s; reading it again", spec.name, exc)
                continue
            if isinstance(taken, Placed):
                return taken
            assert isinstance(taken, Conflict)
            log.info("filter %s: %s; planning again", spec.name, taken.reason)
        return "the cells kept changing under the plan; retry"

    def _preemptible(self, groups: Iterable[str]) -> dict[str, str]:
        """HiveD's FailedNodes for a placement with victims: per node, its pods to preempt
        (``node(N) has preemptible Pods: uid(ns/name), ...``)."""
        failed: dict[str, list[str]] = {}
        for group in groups:
            for cached in self.pods.gang(group):
                if cached.node:
                    meta = _meta(cached.pod)
                    failed.setdefault(cached.node, []).append(pod_key(
                        str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                        cached.uid))
        return {node: f"node({node}) has preemptible Pods: {', '.join(keys)}"
                for node, keys in sorted(failed.items())}

    # ------------------------------------------------------------------ pods of a gang
    def _gang_pods(self, request: PodRequest) -> list[tuple[dict[str, Any], PodRequest]]:
        return [(cached.pod, cached.request) for cached in self.pods.gang(request.spec.name)
                if cached.request is not None]

    async def _claim(self, request: PodRequest) -> tuple[dict[str, Any], int, bool] | str:
        """The placed group of ``request`` (its status), the member slot its pod holds in
        the store and whether it held it before, claiming one first if it holds none (see
        the module documentation); else why not."""
        if not request.uid:
            raise SpecError(f"pod {request.namespace}/{request.name} has no uid")
        name = request.spec.name
        for _ in range(CLAIM_ATTEMPTS):
            info = await self.store.status(name)
            if info is None or info["state"] != "placed":
                return f"group {name} is not placed; filter the pod again"
            claims = {int(s): (str(uid), str(pod)) for s, uid, pod in info.get("claims") or []}
            mine = next((s for s, (uid, _) in claims.items() if uid == request.uid), None)
            if mine is not None:
                return info, mine, True
            choice = await self._choose(request, _placed_from_info(info), claims)
            slot, previous = choice
            result = await self.store.claim(
                name, int(info["incarnation"]), slot, request.uid,
                f"{request.namespace}/{request.name}", previous)
            if isinstance(result, Claimed):
                log.info("pod %s/%s (%s) claimed member pod %d of %s", request.namespace,
                         request.name, request.uid, slot, name)
                return info, slot, False
            log.info("claim of %s slot %d: %s; reading the claims again", name, slot,
                     result.reason)
        return f"the claims of group {name} kept changing; retry"

    async def _choose(self, request: PodRequest, placed: Placed,
                      claims: dict[int, tuple[str, str]]) -> tuple[int, str]:
        """The slot ``request`` should claim and its holder now ("" for none): a suggestion
        from the pod cache, which the store's claim checks. HiveD's user error if every slot
        of the pod's size is held by a live pod (more pods than the members declare)."""
        gang = self._gang_pods(request)
        claimed_uids = {uid for uid, _ in claims.values()}
        taken = set(claims)
        waiting: set[tuple[str, str]] = {(request.namespace, request.name)}
        for pod, member in gang:
            if (pod.get("spec") or {}).get("nodeName"):
                # a pod bound before claims existed holds what its bind info names
                legacy = slot_of_bound_pod(pod, placed)
                if legacy is not None and member.uid not in claimed_uids:
                    taken.add(legacy)
            elif member.leaves == request.leaves and member.uid not in claimed_uids:
                waiting.add((member.namespace, member.name))
        sized = [i for i, (n, _, _) in enumerate(placed.pods) if n == request.leaves]
        candidates: list[tuple[int, str]] = [(i, "") for i in sized if i not in taken]
        alive = {member.uid for _, member in gang}
        for i in sized:  # then the slots of pods that are gone for good
            if i in claims and claims[i][0] not in alive and await self._gone(*claims[i]):
                candidates.append((i, claims[i][0]))
        if not candidates:  # every member pod of this size is held by a live pod
            raise user_error(
                f"Requesting more pods than the configured number for {request.leaves} leaf "
                f"cells ({len(sized)} pods) in affinity group {request.spec.name}")
        # a cache may still hold pods that are gone: past the free slots, try the last one
        # (the claim decides)
        rank = sorted(waiting).index((request.namespace, request.name))
        return candidates[min(rank, len(candidates) - 1)]

    async def _gone(self, uid: str, pod: str) -> bool:
        """Whether the pod ``uid`` ("namespace/name" ``pod``) can never be bound again."""
        namespace, _, name = pod.partition("/")
        try:
            found = await self.kube.get_pod(namespace, name)
        except HttpError as exc:
            if exc.status == NOT_FOUND:
                return True
            raise
        return str(_meta(found).get("uid") or "") != uid or not live(found)

    # ------------------------------------------------------------------ preempt
    async def preempt(self, args: Any) -> dict[str, Any]:
        """``ExtenderPreemptionArgs`` in, ``ExtenderPreemptionResult`` out."""
        pod = field(args, "pod")
        meta_victims = field(args, "nodeNameToMetaVictims")
        if not isinstance(pod, dict):
            echo = {"Pod": None, "NodeNameToVictims": field(args, "nodeNameToVictims"),
                    "NodeNameToMetaVictims": meta_victims or {}}
            raise user_error(
                f"ExtenderPreemptionArgs: Pod field should not be nil: {go_json(echo)}")
        # the candidate nodes: by UID (a node cache), with the pods (none), or newer names
        candidates: set[str] = set()
        for key in ("nodeNameToMetaVictims", "nodeNameToVictims", "nodeToVictims"):
            candidates.update(str(node) for node in field(args, key) or {})
        meta = _meta(pod)
        namespace, name, uid = (str(meta.get(k) or "") for k in ("namespace", "name", "uid"))
        await self._unblocked()

        async def routine() -> dict[str, Any]:
            await self._admitted(namespace, name, uid)
            return await self._preempt(pod_request(pod), candidates)

        return await self._pod_routine("preemptRoutine", pod, routine)

    async def _preempt(self, request: PodRequest, candidates: set[str]) -> dict[str, Any]:
        info = await self.store.status(request.spec.name)
        if info is not None and info["state"] == "placed":
            for slot, uid, _ in info.get("claims") or []:
                if uid == request.uid:  # HiveD's Binding pod
                    raise user_error(
                        f"Pod has already been binding to node {info['pods'][int(slot)][1]}")
            return preemption_result()  # the next filter binds it
        suggested = None if request.ignore_suggested else candidates
        try:
            result = await self.store.submit(request.spec, suggested=suggested)
        except InvalidRequest as exc:
            if not hived_waits(exc.reason):
                raise
            return preemption_result()
        if not isinstance(result, Preempting):
            return preemption_result()
        by_node: dict[str, list[str]] = {}
        for group in result.victims:
            for cached in self.pods.gang(group):
                if cached.node:
                    by_node.setdefault(cached.node, []).append(cached.uid)
        # every node with victims: kube-scheduler chooses the one it preempts on, and the
        # others follow on later calls (HiveD's algorithm names a random one)
        return preemption_result({node: sorted(uids) for node, uids in sorted(by_node.items())})

    # ------------------------------------------------------------------ bind
    async def bind(self, args: Any) -> dict[str, Any]:
        """``ExtenderBindingArgs`` in, ``ExtenderBindingResult`` out."""
        namespace = str(field(args, "podNamespace") or "")
        name = str(field(args, "podName") or "")
        uid = str(field(args, "podUID") or "")
        node = str(field(args, "node") or "")
        if not (namespace and name and uid and node):  # HiveD's check and message
            echo = {"PodName": name, "PodNamespace": namespace, "PodUID": uid, "Node": node}
            raise user_error(
                f"ExtenderBindingArgs: All fields should not be empty: {go_json(echo)}")
        await self._unblocked()

        async def routine() -> dict[str, Any]:
            cached = await self._admitted(namespace, name, uid)
            return await self._bind(pod_request(cached.pod), node)

        result: dict[str, Any] = await self._routine(
            "bindRoutine", pod_key(namespace, name, uid), None, routine)
        return result

    async def _bind(self, request: PodRequest, node: str) -> dict[str, Any]:
        info = await self.store.status(request.spec.name)
        if info is None or info["state"] != "placed":
            state = "Preempting" if info is not None else "Waiting"
            raise user_error("Pod cannot be bound without a scheduling placement: Pod current "
                             f"scheduling state {state}, received node {node}")
        claimed = await self._claim(request)  # the filter's claim, or a new one
        if isinstance(claimed, str):
            raise platform_error(claimed)
        info, slot, _ = claimed
        expected = str(info["pods"][slot][1])
        if expected != node:
            raise user_error(f"Pod binding node mismatch: expected {expected}, received {node}")
        annotations = bind_annotations(info, slot)
        status, body = await self.kube.bind(request.namespace, request.name, request.uid, node,
                                            annotations)
        if status != CREATED:
            message = body.get("message") if isinstance(body, dict) else body
            raise platform_error(f"Failed to bind Pod: HTTP {status}: {message}")
        self.bind_attempts.pop(request.uid, None)
        log.info("bound %s to %s (group %s, token %s)", request.key, node, request.spec.name,
                 info["token"])
        return binding_result()

    # ------------------------------------------------------------------ inspect
    async def _inspect(self, method: str, path: str) -> Any:
        """HiveD's inspect paths (``cluster_state.hived_view``), routed as Go's ServeMux
        routes HiveD's: the ``.../`` paths serve their subtree (and their name without the
        slash, which ServeMux redirects there), the others only themselves, ``/`` the rest."""
        groups = _subtree(path, AFFINITY_GROUPS_PATH)
        vcs = _subtree(path, VIRTUAL_CLUSTERS_PATH)
        if groups is None and vcs is None and path not in (CLUSTER_STATUS_PATH,
                                                           PHYSICAL_CLUSTER_PATH):
            if path != "/":
                raise WebServerError(NOT_FOUND, f"Path not found: {path}")
            return {"paths": list(PATHS)}
        if method != "GET":
            raise user_error(f"NotImplemented: {method}: {path}")
        store = self.store
        try:
            if groups == "":
                listing = await store.hived_inspect("groups")
                for group in listing["items"]:
                    self._add_preempting_pods(group)
                return listing
            if groups is not None:
                group = await store.hived_inspect("group", groups)
                if group is None:
                    raise user_error(f"Affinity group {groups} does not exist since it is not "
                                     "allocated or preempting")
                return self._add_preempting_pods(group)
            if path == CLUSTER_STATUS_PATH:
                return await store.hived_inspect("cluster")
            if path == PHYSICAL_CLUSTER_PATH:
                return await store.hived_inspect("physical")
            if not vcs:
                return await store.hived_inspect("vcs")
            try:
                return await store.hived_inspect("vc", vcs)
            except NotFound:
                raise user_error(f"VC {vcs} not found") from None
        except SDPaxosError as exc:
            raise platform_error(f"allocation store unavailable: {exc}") from None

    def _add_preempting_pods(self, group: dict[str, Any]) -> dict[str, Any]:
        """A Preempting group's ``preemptingPods``: its unbound pods the cache holds."""
        if group["status"]["state"] == "Preempting":
            uids = [c.uid for c in self.pods.gang(group["metadata"]["name"]) if not c.node]
            if uids:
                group["status"]["preemptingPods"] = uids
        return group


def _subtree(path: str, prefix: str) -> str | None:
    """What follows ``prefix`` (a ``.../`` path) in ``path``: "" for the prefix itself or its
    name without the slash; None if ``path`` is not under it."""
    if path == prefix[:-1]:
        return ""
    return path[len(prefix):] if path.startswith(prefix) else None


class GangReaper:
    """Releases a group in the store once the last live pod of its gang is gone (it reads
    the pods the cache saw go; see the module documentation)."""

    def __init__(self, store: AllocationStore, kube: KubeApi, pods: PodCache) -> None:
        self.store = store
        self.kube = kube
        self.pods = pods
        self.released: list[str] = []  # for tests and logs

    async def run(self) -> None:
        while True:
            pod = await self.pods.gone.get()
            try:
                await self._gone(pod)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server or the store went away: the next
                # pod of the gang to go (or a restart) releases it
                log.warning("releasing the group of %s/%s: %s", _meta(pod).get("namespace"),
                            _name(pod), exc)

    async def _gone(self, pod: dict[str, Any]) -> None:
        if SPEC_ANNOTATION not in (_meta(pod).get("annotations") or {}):
            return
        try:
            member = pod_request(pod)
        except SpecError:
            return
        name = member.spec.name
        if self.pods.gang(name):
            return  # the cache still holds a live pod of the gang
        # The incarnation first, then the listing (see the module documentation).
        info = await self.store.status(name)
        if info is None:
            return
        pods = (await self.kube.list_pods()).get("items") or []
        for other in pods:
            if not interesting(other):
                continue
            with contextlib.suppress(SpecError):
                if pod_request(other).spec.name == name:
                    return
        with contextlib.suppress(InvalidRequest):  # released already (by another extender)
            result = await self.store.release_if(name, int(info["incarnation"]))
            if isinstance(result, Conflict):  # a new gang of that name: not ours to release
                log.info("group %s not released: %s", name, result.reason)
                return
            self.released.append(name)
            log.info("released group %s: its last pod is gone", name)
