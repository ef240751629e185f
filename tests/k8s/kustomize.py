"""A small kustomize in Python, for the tests (no kustomize binary here): what
deploy/k8s's kustomizations use and nothing more — resources (files and directories),
ConfigMap and Secret generators (files; ``behavior: merge``; no name hash), JSON 6902 patches
by kind and name, and ``namespace``. Anything else it meets is an error, so a kustomization
that starts using more fails here instead of rendering wrongly."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

KNOWN = {"apiVersion", "kind", "resources", "namespace", "generatorOptions",
         "configMapGenerator", "secretGenerator", "patches"}
#: kinds that live outside namespaces
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
                  "StorageClass"}


def render(directory: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - KNOWN
    assert not unknown, f"{directory}: this renderer does not know {unknown}"
    assert spec.get("generatorOptions", {}).get("disableNameSuffixHash"), (
        f"{directory}: generated names must be fixed (the pods mount them by name)")
    objects: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        path = directory / resource
        if path.is_dir():
            objects += render(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for kind, key in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for generator in spec.get(key, []):
            data = {}
            for name in generator["files"]:
                raw = (directory / name).read_bytes()
                data[Path(name).name] = (base64.b64encode(raw).decode() if kind == "Secret"
                                         else raw.decode())
            if generator.get("behavior") == "merge":
                target = find(objects, kind, generator["name"])
                target["data"].update(data)
                continue
            obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind,
                                   "metadata": {"name": generator["name"]}, "data": data}
            if kind == "Secret":
                obj["type"] = "Opaque"
            objects.append(obj)
    for patch in spec.get("patches", []):
        target = find(objects, patch["target"]["kind"], patch["target"]["name"])
        for op in yaml.safe_load(patch["patch"]):
            json6902(target, op)
    namespace = spec.get("namespace")
    if namespace:
        for obj in objects:
            if obj["kind"] == "Namespace":
                obj["metadata"]["name"] = namespace
            elif obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = namespace
            for subject in obj.get("subjects", []):
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = namespace
    return objects


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def json6902(obj: dict[str, Any], op: dict[str, Any]) -> None:
    *parents, last = [p.replace("~1", "/").replace("~0", "~")
                      for p in op["path"].strip("/").split("/")]
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if op["op"] == "replace":
        if isinstance(node, list):
            node[int(last)] = op["value"]
        else:
            assert last in node, f"replace of a missing {op['path']}"
            node[last] = op["value"]
    elif op["op"] == "add":
        if isinstance(node, list):
            node.append(op["value"]) if last == "-" else node.insert(int(last), op["value"])
        else:
            node[last] = op["value"]
    elif op["op"] == "remove":
        del node[int(last) if isinstance(node, list) else last]
    else:
        raise AssertionError(f"unsupported JSON patch op {op['op']}")
