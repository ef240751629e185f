"""Kubernetes: a HiveD-compatible scheduler extender over the replicated allocation store.

* ``hived``    — HiveD's pod scheduling spec in, its bind annotations out;
* ``extender`` — filter / preempt / bind / inspect, every decision through the store; the
  gang reaper that releases a group when its pods are gone;
* ``nodes``    — node health from the API server's node list and watch;
* ``kube``     — the few API server calls (Binding, lists, watches) on ``kubernetes_asyncio``
  (the ``k8s`` extra); ``web`` — the minimal HTTP server the extender answers on;
* ``cli``      — ``sdpaxos extender``.

The manifests (the store as a StatefulSet, the extender, kube-scheduler's configuration) are
in ``deploy/k8s/``.
"""
