"""The subset of Kustomize that deploy/kubernetes uses, rendered in Python for the tests.

`kubectl` is not installed where the tests run, and no Python package renders Kustomize, so this
renders what `kubectl apply -k` would apply, with Kustomize's semantics for the fields it knows:
`resources` (files, and directories holding a kustomization), `namespace`, `labels` (metadata
only, as without `includeSelectors`), `images`, `replicas`, `patches` (JSON 6902 operations on a
target's kind and name) and `secretGenerator` from env files (`disableNameSuffixHash`). Any
other field, or a patch that matches nothing, is an error: a manifest that needs more fails here
instead of being rendered wrongly.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

FIELDS = {
    "apiVersion", "kind", "namespace", "labels", "resources", "secretGenerator",
    "generatorOptions", "replicas", "images", "patches",
}  # fmt: skip
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}

Doc = dict[str, Any]


class KustomizeError(Exception):
    """The kustomization uses what this renderer does not implement, or is inconsistent."""


def render(root: Path) -> list[Doc]:
    """The objects the kustomization in `root` makes, in order."""
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
    unknown = set(kustomization) - FIELDS
    if unknown:
        raise KustomizeError(f"{root}: fields this renderer does not implement: {unknown}")
    docs: list[Doc] = []
    for entry in kustomization.get("resources", []):
        path = (root / entry).resolve()
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    options = kustomization.get("generatorOptions", {})
    for generator in kustomization.get("secretGenerator", []):
        docs.append(_secret(root, generator, options))
    for patch in kustomization.get("patches", []):
        _patch(docs, patch)
    namespace = kustomization.get("namespace")
    for doc in docs:
        if namespace and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = namespace
    for label in kustomization.get("labels", []):
        if label.get("includeSelectors") or label.get("includeTemplates"):
            raise KustomizeError("labels with includeSelectors/includeTemplates")
        for doc in docs:
            doc["metadata"].setdefault("labels", {}).update(label["pairs"])
    for image in kustomization.get("images", []):
        _image(docs, image)
    for replicas in kustomization.get("replicas", []):
        found = [
            d for d in docs if d["kind"] in WORKLOADS and d["metadata"]["name"] == replicas["name"]
        ]
        if not found:
            raise KustomizeError(f"replicas: nothing is named {replicas['name']}")
        for doc in found:
            doc["spec"]["replicas"] = replicas["count"]
    return docs


def _secret(root: Path, generator: Doc, options: Doc) -> Doc:
    if not options.get("disableNameSuffixHash"):
        raise KustomizeError("secretGenerator without disableNameSuffixHash")
    if set(generator) - {"name", "envs"}:
        raise KustomizeError(f"secretGenerator fields: {set(generator)}")
    data: dict[str, str] = {}
    for name in generator["envs"]:
        for line in (root / name).read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise KustomizeError(f"{root / name}: {line!r} is not KEY=VALUE")
            data[key] = base64.b64encode(value.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": generator["name"]},
        "type": "Opaque",
        "data": data,
    }


def _patch(docs: list[Doc], patch: Doc) -> None:
    target = patch["target"]
    if set(target) - {"kind", "name"} or set(patch) - {"target", "patch"}:
        raise KustomizeError(f"patch fields: {patch}")
    found = [
        d for d in docs if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]
    ]
    if not found:
        raise KustomizeError(f"patch target {target} matches nothing")
    for operation in yaml.safe_load(patch["patch"]):
        for doc in found:
            _apply(doc, operation)


def _apply(doc: Doc, operation: Doc) -> None:
    """One JSON Patch operation (RFC 6902: add, replace, remove) at a JSON Pointer."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
    parent: Any = doc
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    last = parts[-1]
    op = operation["op"]
    value = copy.deepcopy(operation.get("value"))
    if isinstance(parent, list):
        if op == "add":
            parent.insert(len(parent) if last == "-" else int(last), value)
        elif op == "replace":
            parent[int(last)] = value
        elif op == "remove":
            del parent[int(last)]
        else:
            raise KustomizeError(f"operation {op}")
        return
    if op in ("replace", "remove") and last not in parent:
        raise KustomizeError(f"{operation['path']}: nothing to {op}")
    if op in ("add", "replace"):
        parent[last] = value
    elif op == "remove":
        del parent[last]
    else:
        raise KustomizeError(f"operation {op}")


def _image(docs: list[Doc], image: Doc) -> None:
    for doc in docs:
        template = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in template.get("containers", []) + template.get("initContainers", []):
            name = (
                container["image"].split("@")[0].rsplit(":", 1)[0]
                if ":" in container["image"].rsplit("/", 1)[-1]
                else container["image"].split("@")[0]
            )
            if name == image["name"]:
                new = image.get("newName", name)
                container["image"] = f"{new}:{image['newTag']}" if "newTag" in image else new
