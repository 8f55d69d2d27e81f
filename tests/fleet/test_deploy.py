"""deploy/: the Kubernetes manifests pass kubernetes-validate in strict mode, and hang together."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from sandbank.config import Settings
from tests.support import REPO

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.37.0"  # the newest schemas kubernetes-validate 1.37 carries


def resources() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in resources() if d["kind"] == kind]


def test_the_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize("doc", resources(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_manifest_is_valid_in_strict_mode(doc: dict[str, Any]) -> None:
    # Strict: unknown fields are errors, not silently dropped as the API server would.
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_misspelled_field_is_caught() -> None:
    doc = by_kind("Service")[0]
    bad = {**doc, "spec": {**doc["spec"], "publishNotReadyAdresses": True}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def containers() -> list[dict[str, Any]]:
    found = []
    for d in by_kind("StatefulSet") + by_kind("Deployment"):
        found += d["spec"]["template"]["spec"]["containers"]
    return found


def test_every_setting_the_manifests_name_exists() -> None:
    names = set()
    for c in containers():
        names |= {e["name"] for e in c.get("env", [])}
    for cm in by_kind("ConfigMap"):
        names |= set(cm["data"])
    fields = {f"SANDBANK_{k.upper()}" for k in Settings.model_fields}
    assert names and names <= fields, names - fields


def test_the_wiring_nodes_headless_and_reachable_from_fronts_only() -> None:
    (nodes,) = by_kind("StatefulSet")
    services = {s["metadata"]["name"]: s for s in by_kind("Service")}
    headless = services[nodes["spec"]["serviceName"]]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    node_labels = nodes["spec"]["template"]["metadata"]["labels"]
    assert headless["selector"] == node_labels
    (policy,) = by_kind("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == node_labels
    (front,) = by_kind("Deployment")
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert allowed == front["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["egress"] == []
    config = by_kind("ConfigMap")[0]["data"]
    assert config["SANDBANK_FLEET_DNS"].startswith(f"{nodes['spec']['serviceName']}.")
    assert {
        p["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        for p in by_kind("PodDisruptionBudget")
    } == {"node", "front"}


def test_only_nodes_are_privileged_and_no_pod_gets_a_cluster_credential() -> None:
    for d in by_kind("StatefulSet") + by_kind("Deployment"):
        spec = d["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
        privileged = any(c["securityContext"].get("privileged") for c in spec["containers"])
        assert privileged == (d["kind"] == "StatefulSet")


def test_the_image_is_debian_12_with_what_sandboxes_need() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "FROM debian:12" in dockerfile
    for package in ("bubblewrap", "util-linux", "e2fsprogs", "mount", "python3-venv"):
        assert package in dockerfile
    assert "runtime/requirements.txt" in dockerfile


def test_the_image_seals_and_packs_the_runtime_as_make_install_does() -> None:
    """Unsealed, sandboxes would see the build host's paths (console scripts, pyvenv.cfg,
    the bound directory in mountinfo) and pip would try the network."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    makefile = (DEPLOY.parent / "Makefile").read_text()
    assert "scripts/seal-runtime $(RUNTIME)" in makefile
    steps = dockerfile.split("RUN python3 -m venv .venv", 1)[1].split("\n\n", 1)[0]
    assert "COPY scripts/seal-runtime ./scripts/seal-runtime" in dockerfile
    order = [
        steps.index("-r runtime/requirements.txt"),
        steps.index("runtime/sb-init.c"),
        steps.index("python3 scripts/seal-runtime .runtime"),
        steps.index("test -f .runtime.img"),
    ]
    assert order == sorted(order)
