"""``sdpaxos extender``: a Kubernetes scheduler extender speaking HiveD's protocol, with every
decision taken by the replicated allocation store, so any number of extender instances (in
any number of regions, behind any number of kube-schedulers) serve one cluster.

Endpoints (HiveD's ``pkg/webserver``; bodies are the extender API's JSON: ``ExtenderArgs``,
``ExtenderFilterResult``, ``ExtenderPreemptionArgs``/``Result``, ``ExtenderBindingArgs``/
``Result``; field names are read case-insensitively, as Go's decoder does, so kube-schedulers
old (no JSON tags) and new (``k8s.io/kube-scheduler/extender/v1`` tags) both work):

* ``POST /v1/extender/filter`` — the *filtering phase*, which reserves nothing:
  a pod of a group the store has placed gets its node (idempotent: a re-filter of a binding
  pod answers the same node); a new group is planned with the store's dry run
  (``plan_submit``): a plan without victims is taken with a conditional ``bind`` of exactly
  that placement at the revision the plan read (it fails, and is planned again, if any of its
  GPUs changed meanwhile — another extender got there first); a plan that needs victims fails
  every node naming them, so kube-scheduler calls preempt; otherwise every node fails with
  the store's reason. With ``ignoreK8sSuggestedNodes: false`` the plan is made inside the
  nodes Kubernetes suggests (the store's search runs in them; HiveD's suggested nodes).
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
  token (``cluster_state.k8s.hived``). Every field of ``ExtenderBindingArgs`` (the pod's
  namespace, name and UID, the node) is required, as HiveD's.
* ``GET /v1/inspect/affinitygroups/[NAME]``, ``GET /v1/inspect/clusterstatus[/physicalcluster
  | /virtualclusters[/NAME]]`` — the store's groups and cell trees (linearizable reads).
* ``GET /healthz`` — here, the extender runs; ``sdpaxos extender`` answers it (and ``/readyz``)
  itself: 503 while the Kubernetes API or the store is out of reach (``cluster_state.k8s.cli.
  health_check``); ``/livez``: the process runs (``cluster_state.k8s.web``).

**Which pod gets which part of its group.** The store places the whole gang at once (one
placement per pod — a *member slot* — HiveD's affinity group); which pod takes which slot is a
fact of the store too: a ``claim`` (``cluster_state.ops``), one logged compare-and-set on the
group's incarnation, gives slot k to pod UID u. The filter of a pod of a placed group claims
its slot before answering the slot's node, and the bind claims it again (idempotent for the
same UID) before posting the Binding, so whatever each extender's pod listing shows, a slot's
GPUs go to one pod only: a second pod's claim of a held slot is refused, and its extender
reads the claims again and picks another. The listing only *suggests* the slot (so that
extenders rarely collide): the pod's claim if it has one, else the free slots of its
leafCellNumber (not claimed, and not held by a pod bound before claims existed, by its
``pod-bind-info``) in the pod-name order of the gang's unclaimed unbound pods. A slot held by
a pod that is gone for good — the API server answers 404 for it, another UID under its name,
or a pod deleting or finished, none of which Kubernetes binds any more — is taken over with a
claim naming that holder as the previous one (a restarted pod of a running gang). A pod that
is already bound keeps its GPUs until it is deleted, as HiveD's.

**Releasing.** ``GangReaper`` watches pods: when a HiveD pod is deleted and no live pod of its
gang remains, it releases the group in the store (HiveD's DeleteAllocatedPod /
DeleteUnallocatedPod: a preempting group's reservation is cancelled), which completes the
preemptions waiting for it. It reads the group's incarnation *before* listing the pods and
releases only that incarnation (``release_if``): a new gang of the same name placed after
that read is another incarnation, and one placed before it has its pods in the listing (a
pod exists before it is filtered), so a new gang is never released by an old one's reaper.
``NodeWatcher`` (``cluster_state.k8s.nodes``) feeds node health.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from cluster_state.client import AllocationStore
from cluster_state.errors import InvalidRequest
from cluster_state.k8s.hived import (
    SPEC_ANNOTATION,
    PodRequest,
    SpecError,
    bind_annotations,
    pod_request,
    slot_of_bound_pod,
)
from cluster_state.k8s.kube import CONFLICT, CREATED, NOT_FOUND, KubeApi
from cluster_state.k8s.web import HttpError, Reply
from cluster_state.ops import Claimed, Conflict, Placed, Pod, PodPlacement, Preempting, Waiting
from consensus.errors import SDPaxosError

__all__ = ["Extender", "GangReaper", "field"]

log = logging.getLogger(__name__)

#: how many times a filter plans again when another scheduler took its GPUs first
FILTER_ATTEMPTS = 5
#: how many times a pod claims a member slot again when another pod claimed it first
CLAIM_ATTEMPTS = 5
#: what a kube-scheduler reads in FailedNodes for a pod HiveD's way (the extender's name)
EXTENDER = "sdpaxos-extender"
#: pod phases that hold no resources any more
FINISHED = ("Succeeded", "Failed")
#: how long the reaper waits before watching again after its watch broke
REWATCH_S = 1.0


def field(obj: Any, name: str) -> Any:
    """``obj[name]`` matched case-insensitively (Go's JSON decoding), else None."""
    if not isinstance(obj, dict):
        return None
    if name in obj:
        return obj[name]
    lower = name.lower()
    return next((v for k, v in obj.items() if isinstance(k, str) and k.lower() == lower), None)


def _name(obj: Any) -> str:
    return str(((obj or {}).get("metadata") or {}).get("name") or "")


def _placed_from_info(info: dict[str, Any]) -> Placed:
    return Placed(
        str(info["name"]), str(info["chain"]),
        tuple(Pod(int(n), str(node), tuple(int(d) for d in devices))
              for n, node, devices in info["pods"]),
        int(info["token"]),
    )


def _live(pod: dict[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    return not meta.get("deletionTimestamp") and (
        (pod.get("status") or {}).get("phase") not in FINISHED)


def _gang_of(pod: dict[str, Any]) -> PodRequest | None:
    try:
        return pod_request(pod)
    except SpecError:
        return None


class Extender:
    """HiveD's extender over the replicated store (see the module documentation)."""

    def __init__(self, store: AllocationStore, kube: KubeApi) -> None:
        self.store = store
        self.kube = kube

    # ------------------------------------------------------------------ routing
    async def handle(self, method: str, path: str, query: dict[str, list[str]],
                     body: Any) -> Reply:
        try:
            if method == "POST" and path.startswith("/v1/extender/"):
                verb = path.removeprefix("/v1/extender/").strip("/")
                if verb == "filter":
                    return Reply(200, await self.filter(body))
                if verb == "preempt":
                    return Reply(200, await self.preempt(body))
                if verb == "bind":
                    return Reply(200, await self.bind(body))
                raise HttpError(404, f"no extender verb {verb!r}")
            if method == "GET" and path.startswith("/v1/inspect/"):
                return Reply(200, await self.inspect(path.removeprefix("/v1/inspect/")))
            if method == "GET" and path == "/healthz":
                return Reply(200, {"status": "ok"})
        except SpecError as exc:  # HiveD's user error
            return Reply(400, {"error": str(exc)})
        except InvalidRequest as exc:
            return Reply(400, {"error": str(exc)})
        except SDPaxosError as exc:  # the store is out of reach for now: retry later
            return Reply(503, {"error": f"allocation store unavailable: {exc}"})
        raise HttpError(404, f"no route {method} {path}")

    # ------------------------------------------------------------------ filter
    async def filter(self, args: Any) -> dict[str, Any]:
        """``ExtenderArgs`` in, ``ExtenderFilterResult`` out."""
        pod = field(args, "pod")
        if not isinstance(pod, dict):
            raise SpecError("ExtenderArgs has no pod")
        request = pod_request(pod)
        node_objects = field(field(args, "nodes"), "items")
        suggested = [str(n) for n in field(args, "nodeNames") or []] or [
            _name(n) for n in node_objects or []]
        outcome = await self._placement_for_filter(
            request, None if request.ignore_suggested else suggested)
        if isinstance(outcome, str):
            return {"nodenames": [], "failedNodes": dict.fromkeys(suggested, outcome),
                    "error": ""}
        claimed = await self._claim(request)
        if isinstance(claimed, str):
            return {"nodenames": [], "failedNodes": dict.fromkeys(suggested, claimed),
                    "error": ""}
        placed, slot = claimed
        node = placed.pods[slot][1]
        failed = {n: f"{EXTENDER}: the pod's group is placed on {node}"
                  for n in suggested if n != node}
        result: dict[str, Any] = {"nodenames": [node], "failedNodes": failed, "error": ""}
        if node_objects is not None:  # a scheduler without a node cache wants node objects
            chosen = [n for n in node_objects if _name(n) == node]
            result["nodes"] = {"items": chosen or [{"metadata": {"name": node}}]}
        return result

    async def _placement_for_filter(self, request: PodRequest,
                                    suggested: list[str] | None) -> Placed | str:
        """The group's placement, taking it if a plan (inside ``suggested``, if given) needs
        no victims; else why not."""
        spec, store = request.spec, self.store
        for _ in range(FILTER_ATTEMPTS):
            info = await store.status(spec.name)
            if info is not None:
                if info["state"] == "placed":
                    return _placed_from_info(info)
                if info["state"] == "preempting":
                    return (f"{EXTENDER}: waiting for the preemption of "
                            + ", ".join(info["victims"]))
                # reserved: the victims are gone, confirm the reservation (HiveD binds it now)
                confirmed = await store.submit(spec)
                if isinstance(confirmed, Placed):
                    return confirmed
                continue
            revision, plan = await store.plan_submit(spec, suggested=suggested)
            if isinstance(plan, Waiting):
                return f"{EXTENDER}: {plan.reason}"
            if isinstance(plan, Preempting):
                return f"{EXTENDER}: preemption needed: victims " + ", ".join(plan.victims)
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
        return f"{EXTENDER}: the cells kept changing under the plan; retry"

    # ------------------------------------------------------------------ pods of a gang
    async def _gang_pods(self, request: PodRequest) -> list[tuple[dict[str, Any], PodRequest]]:
        pods = (await self.kube.list_pods()).get("items") or []
        gang = []
        for pod in pods:
            if not _live(pod):
                continue
            member = _gang_of(pod)
            if member is not None and member.spec.name == request.spec.name:
                gang.append((pod, member))
        return gang

    async def _claim(self, request: PodRequest) -> tuple[Placed, int] | str:
        """The placed group of ``request`` and the member slot its pod holds in the store,
        claiming one first if it holds none (see the module documentation); else why not."""
        if not request.uid:
            raise SpecError(f"pod {request.namespace}/{request.name} has no uid")
        name = request.spec.name
        for _ in range(CLAIM_ATTEMPTS):
            info = await self.store.status(name)
            if info is None or info["state"] != "placed":
                return f"{EXTENDER}: group {name} is not placed; filter the pod again"
            placed = _placed_from_info(info)
            claims = {int(s): (str(uid), str(pod)) for s, uid, pod in info.get("claims") or []}
            mine = next((s for s, (uid, _) in claims.items() if uid == request.uid), None)
            if mine is not None:
                return placed, mine
            choice = await self._choose(request, placed, claims)
            if isinstance(choice, str):
                return choice
            slot, previous = choice
            result = await self.store.claim(
                name, int(info["incarnation"]), slot, request.uid,
                f"{request.namespace}/{request.name}", previous)
            if isinstance(result, Claimed):
                log.info("pod %s/%s (%s) claimed member pod %d of %s", request.namespace,
                         request.name, request.uid, slot, name)
                return placed, slot
            log.info("claim of %s slot %d: %s; reading the claims again", name, slot,
                     result.reason)
        return f"{EXTENDER}: the claims of group {name} kept changing; retry"

    async def _choose(self, request: PodRequest, placed: Placed,
                      claims: dict[int, tuple[str, str]]) -> tuple[int, str] | str:
        """The slot ``request`` should claim and its holder now ("" for none): a suggestion
        from the pod listing, which the store's claim checks."""
        gang = await self._gang_pods(request)
        claimed_uids = {uid for uid, _ in claims.values()}
        taken = set(claims)
        waiting: set[tuple[str, str]] = {(request.namespace, request.name)}
        for pod, member in gang:
            if (pod.get("spec") or {}).get("nodeName"):
                # a pod bound before claims existed holds what its bind info names
                legacy = slot_of_bound_pod(pod, placed)
                if legacy is not None and member.uid not in claimed_uids:
                    if member.uid == request.uid and legacy not in claims:
                        return legacy, ""  # the pod itself: it adopts what it holds
                    taken.add(legacy)
            elif member.leaves == request.leaves and member.uid not in claimed_uids:
                waiting.add((member.namespace, member.name))
        sized = [i for i, (n, _, _) in enumerate(placed.pods) if n == request.leaves]
        candidates: list[tuple[int, str]] = [(i, "") for i in sized if i not in taken]
        live = {member.uid for _, member in gang}
        for i in sized:  # then the slots of pods that are gone for good
            if i in claims and claims[i][0] not in live and await self._gone(*claims[i]):
                candidates.append((i, claims[i][0]))
        rank = sorted(waiting).index((request.namespace, request.name))
        if rank >= len(candidates):
            return (f"{EXTENDER}: group {request.spec.name} has no free place for another pod "
                    f"of {request.leaves} leaf cells (more pods than its members declare)")
        return candidates[rank]

    async def _gone(self, uid: str, pod: str) -> bool:
        """Whether the pod ``uid`` ("namespace/name" ``pod``) can never be bound again."""
        namespace, _, name = pod.partition("/")
        try:
            found = await self.kube.get_pod(namespace, name)
        except HttpError as exc:
            if exc.status == NOT_FOUND:
                return True
            raise
        return str((found.get("metadata") or {}).get("uid") or "") != uid or not _live(found)

    # ------------------------------------------------------------------ preempt
    async def preempt(self, args: Any) -> dict[str, Any]:
        """``ExtenderPreemptionArgs`` in, ``ExtenderPreemptionResult`` out."""
        pod = field(args, "pod")
        if not isinstance(pod, dict):
            raise SpecError("ExtenderPreemptionArgs has no pod")
        request = pod_request(pod)
        # the candidate nodes: by UID (a node cache), with the pods (none), or newer names
        candidates: set[str] = set()
        for key in ("nodeNameToMetaVictims", "nodeNameToVictims", "nodeToVictims"):
            candidates.update(str(node) for node in field(args, key) or {})
        none: dict[str, Any] = {"nodeNameToMetaVictims": {}}
        info = await self.store.status(request.spec.name)
        if info is not None and info["state"] == "placed":
            return none  # the next filter binds it
        suggested = None if request.ignore_suggested else candidates
        result = await self.store.submit(request.spec, suggested=suggested)
        if not isinstance(result, Preempting):
            return none
        victims = set(result.victims)
        by_node: dict[str, list[str]] = {}
        for victim in (await self.kube.list_pods()).get("items") or []:
            member = _gang_of(victim)
            node = (victim.get("spec") or {}).get("nodeName")
            if member is not None and node and _live(victim) and member.spec.name in victims:
                by_node.setdefault(str(node), []).append(member.uid)
        # every node with victims: kube-scheduler chooses the one it preempts on, and the
        # others follow on later calls (HiveD's algorithm names a random one)
        return {"nodeNameToMetaVictims": {
            node: {"pods": [{"uid": uid} for uid in sorted(uids)], "numPDBViolations": 0}
            for node, uids in sorted(by_node.items())}}

    # ------------------------------------------------------------------ bind
    async def bind(self, args: Any) -> dict[str, Any]:
        """``ExtenderBindingArgs`` in, ``ExtenderBindingResult`` out."""
        namespace = str(field(args, "podNamespace") or "")
        name = str(field(args, "podName") or "")
        uid = str(field(args, "podUID") or "")
        node = str(field(args, "node") or "")
        if not (namespace and name and uid and node):  # HiveD's check and message
            given = {"PodName": name, "PodNamespace": namespace, "PodUID": uid, "Node": node}
            raise SpecError(
                f"ExtenderBindingArgs: All fields should not be empty: {json.dumps(given)}")
        pod = await self.kube.get_pod(namespace, name)
        request = pod_request(pod)
        if uid != request.uid:
            return {"error": f"pod {namespace}/{name} is now uid {request.uid}, not {uid}"}
        claimed = await self._claim(request)  # the filter's claim, or a new one
        if isinstance(claimed, str):
            return {"error": claimed}
        placed, slot = claimed
        if placed.pods[slot][1] != node:
            return {"error": f"the pod's placement is on {placed.pods[slot][1]}, not {node}"}
        annotations = bind_annotations(request.spec, placed, slot)
        status, body = await self.kube.bind(namespace, name, request.uid, node, annotations)
        if status == CREATED:
            log.info("bound %s/%s to %s (group %s, token %d)", namespace, name, node,
                     request.spec.name, placed.token)
            return {"error": ""}
        if status == CONFLICT:
            return {"error": f"pod {namespace}/{name} is already bound"}
        return {"error": f"binding {namespace}/{name} failed: HTTP {status} {body}"}

    # ------------------------------------------------------------------ inspect
    async def inspect(self, path: str) -> Any:
        parts = [p for p in path.split("/") if p]
        store = self.store
        if parts[:1] == ["affinitygroups"]:
            if len(parts) == 1:
                return {"items": await store.allocations()}
            found = await store.inspect("group", "/".join(parts[1:]))
            if found is None:
                raise HttpError(404, f"no affinity group {'/'.join(parts[1:])}")
            return found
        if parts[:1] == ["clusterstatus"]:
            if parts[1:] == ["physicalcluster"]:
                return await store.inspect("physical")
            if parts[1:2] == ["virtualclusters"]:
                if len(parts) == 3:
                    return await store.inspect("vc", parts[2])
                return await self._virtual_clusters()
            if len(parts) == 1:
                return {"physicalCluster": await store.inspect("physical"),
                        "virtualClusters": await self._virtual_clusters()}
        raise HttpError(404, f"no inspect path /v1/inspect/{path}")

    async def _virtual_clusters(self) -> dict[str, Any]:
        vcs = (await self.store.summary())["vcs"]
        return {vc: await self.store.inspect("vc", vc) for vc in vcs}


class GangReaper:
    """Releases a group in the store once the last live pod of its gang is deleted."""

    def __init__(self, store: AllocationStore, kube: KubeApi) -> None:
        self.store = store
        self.kube = kube
        self.released: list[str] = []  # for tests and logs

    async def run(self) -> None:
        while True:
            try:
                listing = await self.kube.list_pods()
                version = str((listing.get("metadata") or {}).get("resourceVersion") or "0")
                async for event in self.kube.watch("pods", version):
                    if event.get("type") == "DELETED" or (
                            event.get("type") == "MODIFIED"
                            and not _live(event.get("object") or {})):
                        await self._gone(event.get("object") or {})
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server or the store went away: watch again
                log.warning("pod watch: %s; watching again", exc)
            await asyncio.sleep(REWATCH_S)

    async def _gone(self, pod: dict[str, Any]) -> None:
        member = _gang_of(pod)
        if member is None or SPEC_ANNOTATION not in ((pod.get("metadata") or {}).get(
                "annotations") or {}):
            return
        name = member.spec.name
        # The incarnation first, then the listing (see the module documentation).
        info = await self.store.status(name)
        if info is None:
            return
        pods = (await self.kube.list_pods()).get("items") or []
        if any(_live(p) and (m := _gang_of(p)) is not None and m.spec.name == name
               for p in pods):
            return
        with contextlib.suppress(InvalidRequest):  # released already (by another extender)
            result = await self.store.release_if(name, int(info["incarnation"]))
            if isinstance(result, Conflict):  # a new gang of that name: not ours to release
                log.info("group %s not released: %s", name, result.reason)
                return
            self.released.append(name)
            log.info("released group %s: its last pod is gone", name)
