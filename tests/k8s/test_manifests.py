"""deploy/k8s: every object of both overlays validates against Kubernetes' schemas
(kubernetes-validate, strict), renders as ``kubectl kustomize`` renders it, and the pieces fit
together: the cluster file names the StatefulSet's pods through its headless Service, one
replica per ordinal, each replica's pod (its init container run as the kubelet would) holds
its own certificate and key and no other key (the CA's neither), the extender sees only the
CA's and the admin's, probes hit the metrics port's /livez and /readyz, the disruption budget
keeps a majority, the commands are real CLI verbs, and kube-scheduler's extender
configuration reaches the extender's Service and routes."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bench.cli import build_parser
from cluster_state.config import load_config
from cluster_state.k8s.extender import Extender
from consensus.errors import ConfigError
from consensus.runtime.cluster_config import load_cluster_config

from .kustomize import find, render

ROOT = Path(__file__).parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = {"three": 3, "five": 5}
VERSION = kubernetes_validate.latest_version()


def rendered(tmp_path: Path, overlay: str) -> list[dict[str, Any]]:
    """The overlay's objects, with TLS files made as the README says (sdpaxos cert init)."""
    copy_root = tmp_path / "k8s"
    shutil.copytree(K8S, copy_root, ignore=shutil.ignore_patterns("*.pem", "*.key"))
    config = copy_root / "overlays" / overlay / "cluster.toml"
    done = subprocess.run([sys.executable, "-m", "bench.cli", "cert", "init", "--config",
                           str(config)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return render(copy_root / "overlays" / overlay)


def parse_cli(words: list[str]) -> Any:
    return build_parser(words[0]).parse_args(words)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(
    tmp_path: Path, overlay: str
) -> None:
    objects = rendered(tmp_path, overlay)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(["Namespace", "StatefulSet", "Service", "Service", "Service",
                            "PodDisruptionBudget", "ServiceAccount", "ClusterRole",
                            "ClusterRoleBinding", "Deployment", "ConfigMap", "Secret"])
    for obj in objects:
        kubernetes_validate.validate(obj, VERSION, strict=True)


def test_the_validation_catches_a_broken_manifest(tmp_path: Path) -> None:
    sts = copy.deepcopy(find(rendered(tmp_path, "three"), "StatefulSet", "sdpaxos"))
    sts["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, VERSION, strict=True)
    sts["spec"]["replicas"] = 3
    sts["spec"]["template"]["spec"]["containers"][0]["livenessProb"] = {}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, VERSION, strict=True)


def mounted(objects: list[dict[str, Any]], volume: dict[str, Any], into: Path) -> Path:
    """Write a volume's files (a ConfigMap, a Secret or a projection of them, with their
    ``items`` if they name some) as the kubelet would."""
    into.mkdir()
    sources = volume["projected"]["sources"] if "projected" in volume else [volume]
    for source in sources:
        if "configMap" in source:
            config_map = source["configMap"]
            data = {name: text.encode() for name, text in find(
                objects, "ConfigMap", config_map["name"])["data"].items()}
        else:
            config_map = source["secret"]
            name = config_map.get("name") or config_map["secretName"]
            data = {key: base64.b64decode(b64)
                    for key, b64 in find(objects, "Secret", name)["data"].items()}
        items = config_map.get("items") or [{"key": key, "path": key} for key in data]
        for item in items:
            (into / item["path"]).write_bytes(data[item["key"]])
    return into


def replica_pod(objects: list[dict[str, Any]], ordinal: int, root: Path) -> Path:
    """Replica ``ordinal``'s pod as its replica container sees it, ``root`` standing for
    ``/``: every volume the init containers mount written as the kubelet would, then the init
    containers run (their scripts, with ``root`` for ``/``). Returns the pod's root."""
    pod = find(objects, "StatefulSet", "sdpaxos")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for init in pod["initContainers"]:
        for mount in init["volumeMounts"]:
            where = root / mount["mountPath"].lstrip("/")
            if where.exists():
                continue
            where.parent.mkdir(parents=True, exist_ok=True)
            volume = volumes[mount["name"]]
            if "emptyDir" in volume:
                where.mkdir()
            else:
                mounted(objects, volume, where)
        assert init["command"] == ["sh", "-c"]
        script = init["args"][0].replace("/etc/", f"{root}/etc/")
        env = {e["name"]: str(ordinal) for e in init["env"]
               if e["valueFrom"]["fieldRef"]["fieldPath"].endswith("pod-index']")}
        done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, done.stderr
    return root


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_store_cross_references(tmp_path: Path, overlay: str) -> None:
    n = OVERLAYS[overlay]
    objects = rendered(tmp_path, overlay)
    sts = find(objects, "StatefulSet", "sdpaxos")
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert set(mounts) <= set(volumes) | claims and claims <= set(mounts)
    # the command: a real verb, the config inside the mounted directory, the id the ordinal
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_ORDINAL"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']")
    args = parse_cli([re.sub(r"\$\(POD_ORDINAL\)", "1", a) for a in container["args"]])
    assert args.id == 1 and args.config == env["SDPAXOS_CONFIG"]["value"]
    config_dir = Path(args.config).parent
    assert mounts["cluster"] == str(config_dir)
    # the cluster file, loaded from the volume as the pod sees it
    root = replica_pod(objects, 1, tmp_path / "pod")
    mount = root / str(config_dir).lstrip("/")
    config = load_cluster_config(mount / Path(args.config).name)
    assert [r.id for r in config.replicas] == list(range(n)) == list(range(sts["spec"]["replicas"]))
    assert str(config.data_dir) == mounts["data"]
    peers = find(objects, "Service", sts["spec"]["serviceName"])
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for spec in config.replicas:
        for (host, port), name in ((spec.address, "peer"), (spec.client_address, "client"),
                                   (spec.metrics_address, "metrics"),
                                   (spec.grpc_address, "grpc")):
            assert host == f"{sts['metadata']['name']}-{spec.id}.{peers['metadata']['name']}"
            assert ports[name] == port
    assert {p["name"]: p["port"] for p in peers["spec"]["ports"]} == ports
    # the TLS files replica 1 reads are in its volume (the others: test_each_replica_...)
    assert config.tls is not None and not config.tls.metrics  # the kubelet probes plaintext
    named = [config.tls.ca, config.tls.client.cert, config.tls.client.key]  # type: ignore[union-attr]
    named += [f for r in config.tls.replicas.values() for f in (r.cert, r.key)]
    assert all(path.exists() for path in named)
    assert config.tls.ca_key is not None and not config.tls.ca_key.exists()
    gpu = load_config(mount / config.state_machine_options["gpu_config"].name)
    assert gpu.options.initial_node_health == "bad"  # nodes count once Kubernetes says Ready
    # probes on the metrics port: /livez keeps the pod, /readyz routes clients
    for probe, path in (("livenessProbe", "/livez"), ("startupProbe", "/livez"),
                        ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}
    # a majority survives voluntary disruptions; the budget selects these pods
    pdb = find(objects, "PodDisruptionBudget", "sdpaxos")
    assert pdb["spec"]["minAvailable"] == n // 2 + 1
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # non-root as the image's user, resources, spread over nodes and zones
    uid = re.search(r"--uid (\d+)", (ROOT / "Dockerfile").read_text())
    assert uid and pod["securityContext"]["runAsUser"] == int(uid.group(1))
    assert pod["securityContext"]["runAsNonRoot"]
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"][
        "memory"]
    anti = pod["affinity"]["podAntiAffinity"]
    assert anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == (
        "kubernetes.io/hostname")
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"][
        "topologyKey"] == "topology.kubernetes.io/zone"


def test_the_extender_and_kube_scheduler_cross_references(tmp_path: Path) -> None:
    objects = rendered(tmp_path, "three")
    namespace = find(objects, "Namespace", "sdpaxos")["metadata"]["name"]
    deployment = find(objects, "Deployment", "sdpaxos-extender")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = parse_cli(container["args"])
    assert args.watch_nodes and args.listen[1] == container["ports"][0]["containerPort"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = mounted(objects, volumes["cluster"], tmp_path / "mount")
    assert container["volumeMounts"][0]["mountPath"] == str(Path(args.config).parent)
    config = load_cluster_config(mount / Path(args.config).name)
    assert config.tls is not None and config.tls.client is not None
    config.tls.tool()  # the admin's certificate and key load: what the extender presents
    assert not any(r.key.exists() for r in config.tls.replicas)  # no replica's key
    binding = find(objects, "ClusterRoleBinding", "sdpaxos-extender")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": namespace}]
    rules = find(objects, "ClusterRole", binding["roleRef"]["name"])["rules"]
    assert any("pods/binding" in r["resources"] and "create" in r["verbs"] for r in rules)
    service = find(objects, "Service", "sdpaxos-extender")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"][
        "labels"].items()
    # kube-scheduler reaches that Service, and each verb is one of the extender's routes
    scheduler = yaml.safe_load((K8S / "kube-scheduler-config.yaml").read_text())
    assert scheduler["kind"] == "KubeSchedulerConfiguration"
    (extender,) = scheduler["extenders"]
    match = re.fullmatch(r"http://([^.]+)\.([^.]+)\.svc:(\d+)(/.*)", extender["urlPrefix"])
    assert match
    assert match.group(1, 2) == (service["metadata"]["name"], namespace)
    assert int(match.group(3)) == service["spec"]["ports"][0]["port"]
    handler = Extender(None, None).handle  # type: ignore[arg-type]
    for verb, what in (("filterVerb", "ExtenderArgs"), ("preemptVerb", "ExtenderPreemptionArgs"),
                       ("bindVerb", "ExtenderBindingArgs")):
        path = f"{match.group(4)}/{extender[verb]}"
        reply = asyncio.run(handler("POST", path, {}, b"{}"))
        # a bad request (HiveD's answer for the path's arguments), not an unknown route
        assert what in json.dumps(reply.body), (path, reply)
    assert extender["managedResources"][0]["name"] == (
        "hivedscheduler.microsoft.com/pod-scheduling-enable")
    assert scheduler["profiles"][0]["schedulerName"] == "hivedscheduler"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_replica_pod_reads_only_its_own_key(tmp_path: Path, overlay: str) -> None:
    objects = rendered(tmp_path, overlay)
    sts = find(objects, "StatefulSet", "sdpaxos")
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    # the replica mounts no Secret, only what its init container wrote (in memory)
    mounted_by_replica = [volumes[m["name"]] for m in container["volumeMounts"]
                          if m["name"] in volumes]
    assert not any("secret" in v or "projected" in v for v in mounted_by_replica)
    assert volumes["cluster"]["emptyDir"]["medium"] == "Memory"
    args = parse_cli([re.sub(r"\$\(POD_ORDINAL\)", "0", a) for a in container["args"]])
    for ordinal in range(OVERLAYS[overlay]):
        root = replica_pod(objects, ordinal, tmp_path / f"pod-{ordinal}")
        config = load_cluster_config(root / args.config.lstrip("/"))
        assert config.tls is not None and config.tls.ca_key is not None
        # its own certificate and key load, as the replica loads them
        config.tls.server(ordinal)
        config.tls.dialer(ordinal)
        # no other replica's key, nor the admin's, nor the CA's, is there to read
        for other in range(OVERLAYS[overlay]):
            if other != ordinal:
                assert not config.tls.replicas[other].key.exists()
                with pytest.raises(ConfigError):
                    config.tls.server(other)
        assert config.tls.client is not None and not config.tls.client.key.exists()
        assert not config.tls.ca_key.exists()
        # the cluster file is the ConfigMap's, through a link (a reload reads an update)
        assert (root / args.config.lstrip("/")).is_symlink()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl here")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kubectl_kustomize_renders_what_these_tests_check(tmp_path: Path, overlay: str) -> None:
    objects = rendered(tmp_path, overlay)
    done = subprocess.run(["kubectl", "kustomize", str(tmp_path / "k8s" / "overlays" / overlay)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    theirs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, theirs)) == sorted(map(key, objects))
    for obj in theirs:
        assert strip(obj) == strip(find(objects, *key(obj))), key(obj)


def strip(obj: Any) -> Any:
    """``obj`` without what kustomize adds of its own (empty containers; a Secret's data is
    compared decoded: kubectl wraps its base64 lines)."""
    if isinstance(obj, dict) and obj.get("kind") == "Secret":
        obj = {**obj, "data": {k: base64.b64decode(v) for k, v in obj["data"].items()}}
    if isinstance(obj, dict):
        return {k: strip(v) for k, v in obj.items() if v not in ({}, [], None)}
    if isinstance(obj, list):
        return [strip(v) for v in obj]
    return obj
