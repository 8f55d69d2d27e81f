"""deploy/: the Kubernetes overlays render (Kustomize's semantics, tests/fleet/kustomize.py),
pass kubernetes-validate in strict mode, and hang together: what the README says they run is
what they run, and what the containers would read starts a server."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any, cast

import kubernetes_validate
import pytest
import yaml

from sandbank.config import Settings, unknown_variables
from sandbank.startup import check_exposure
from tests.fleet.kustomize import KustomizeError, render
from tests.support import REPO

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir())
KUBERNETES_VERSION = "1.37.0"  # the newest schemas kubernetes-validate 1.37 carries
BUILT_IN = ("v1", "apps/v1", "policy/v1", "networking.k8s.io/v1", "batch/v1")
Doc = dict[str, Any]


def copy_with_secrets(root: Path) -> Path:
    """The tree with each overlay's secret files written from their examples, as a reader does."""
    tree = root / "kubernetes"
    shutil.copytree(K8S, tree)
    for example in tree.glob("overlays/*/*.env.example"):
        example.with_name(example.name.removesuffix(".example")).write_text(example.read_text())
    return tree


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_with_secrets(tmp_path_factory.mktemp("deploy"))


def rendered(tree: Path, overlay: str) -> list[Doc]:
    return render(tree / "overlays" / overlay)


def of(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    (found,) = of(docs, kind, name)
    return found


def container(docs: list[Doc], kind: str) -> Doc:
    (found,) = one(docs, kind)["spec"]["template"]["spec"]["containers"]
    return cast(Doc, found)


def secret(docs: list[Doc], name: str) -> dict[str, str]:
    data = one(docs, "Secret", name)["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def environment(docs: list[Doc], kind: str) -> dict[str, str]:
    """The variables a front's or node's container gets (fieldRefs as a pod's name would be)."""
    c = container(docs, kind)
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        if "configMapRef" in source:
            env.update(one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
        else:
            env.update(secret(docs, source["secretRef"]["name"]))
    for item in c.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            values = secret(docs, ref["name"])
            if ref["key"] in values:
                env[item["name"]] = values[ref["key"]]
            else:
                assert ref.get("optional"), ref
        else:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            env[item["name"]] = f"{one(docs, kind)['metadata']['name']}-0"
    return env


def test_the_base_lists_every_manifest_beside_it() -> None:
    listed = set(yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in (K8S / "base").glob("*.yaml")} - {"kustomization.yaml"}
    for overlay in OVERLAYS:
        here = K8S / "overlays" / overlay
        used = set(yaml.safe_load((here / "kustomization.yaml").read_text())["resources"])
        assert used - {"../../base"} == {p.name for p in here.glob("*.yaml")} - {
            "kustomization.yaml"
        }


def test_an_overlay_without_its_secret_files_does_not_render(tmp_path: Path) -> None:
    shutil.copytree(K8S, tmp_path / "kubernetes")
    with pytest.raises(FileNotFoundError, match=r"secrets\.env"):
        render(tmp_path / "kubernetes" / "overlays" / "trial")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_manifest_is_valid_in_strict_mode(tree: Path, overlay: str) -> None:
    docs = rendered(tree, overlay)
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {
        "sandbank"
    }
    for doc in docs:
        if doc["apiVersion"] in BUILT_IN:
            # Strict: unknown fields are errors, not silently dropped as the API server would.
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        else:
            assert doc["kind"] == "ServiceMonitor", doc["kind"]


def test_a_misspelled_field_is_caught(tree: Path) -> None:
    doc = one(rendered(tree, "trial"), "Service", "sandbank-node")
    bad = {**doc, "spec": {**doc["spec"], "publishNotReadyAdresses": True}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\ncommonLabels: {a: b}\n")
    with pytest.raises(KustomizeError, match="commonLabels"):
        render(tmp_path)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_variable_the_manifests_set_is_a_setting(tree: Path, overlay: str) -> None:
    docs = rendered(tree, overlay)
    for kind in ("Deployment", "StatefulSet"):
        env = environment(docs, kind)
        assert env and unknown_variables(env) == []  # a typo would stop the pod at start


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_fronts_are_replicated_only_over_postgresql_and_s3(tree: Path, overlay: str) -> None:
    """README, "Running a fleet": several fronts share one PostgreSQL and one S3; on SQLite and
    local files there is one front, on a volume, replaced rather than rolled."""
    docs = rendered(tree, overlay)
    front = one(docs, "Deployment", "sandbank-front")
    env = environment(docs, "Deployment")
    shared = env.get("SANDBANK_DATABASE_URL", "").startswith("postgresql") and env.get(
        "SANDBANK_STORAGE_URL", ""
    ).startswith("s3://")
    assert env.get("SANDBANK_INTERPRETER_API", "on") == "on"
    if front["spec"]["replicas"] > 1:
        assert shared
    else:
        assert front["spec"]["strategy"] == {"type": "Recreate"}
        volume = front["spec"]["template"]["spec"]["volumes"][0]
        claim = volume["persistentVolumeClaim"]["claimName"]
        assert one(docs, "PersistentVolumeClaim", claim)
    assert {"production": 2, "trial": 1}[overlay] == front["spec"]["replicas"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_what_the_containers_read_passes_the_start_up_checks(tree: Path, overlay: str) -> None:
    docs = rendered(tree, overlay)
    for kind in ("Deployment", "StatefulSet"):
        env = environment(docs, kind)
        fields = {k.removeprefix("SANDBANK_").lower(): v for k, v in env.items()}
        # As deploy/Dockerfile sets: every address of the pod.
        settings = Settings(host="0.0.0.0", **fields)  # type: ignore[arg-type]
        assert check_exposure(settings, settings.exec_tokens.get_secret_value().split(",")) == []
        assert settings.role == {"Deployment": "front", "StatefulSet": "node"}[kind]
        assert settings.fleet_token.get_secret_value()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nodes_get_no_database_storage_or_model_credential(tree: Path, overlay: str) -> None:
    docs = rendered(tree, overlay)
    node = container(docs, "StatefulSet")
    assert [s for s in node["envFrom"] if "secretRef" in s] == []
    keys = {e["valueFrom"]["secretKeyRef"]["key"] for e in node["env"] if "valueFrom" in e and
            "secretKeyRef" in e["valueFrom"]}  # fmt: skip
    assert keys == {"SANDBANK_FLEET_TOKEN", "SANDBANK_METRICS_TOKEN"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_wiring_nodes_headless_and_reachable_from_fronts_only(tree: Path, overlay: str) -> None:
    docs = rendered(tree, overlay)
    nodes = one(docs, "StatefulSet")
    services = {s["metadata"]["name"]: s for s in of(docs, "Service")}
    headless = services[nodes["spec"]["serviceName"]]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    node_labels = nodes["spec"]["template"]["metadata"]["labels"]
    assert headless["selector"] == node_labels
    policy = one(docs, "NetworkPolicy", "sandbank-node")
    assert policy["spec"]["podSelector"]["matchLabels"] == node_labels
    front = one(docs, "Deployment")
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert allowed == front["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["egress"] == []
    for other in of(docs, "NetworkPolicy"):
        if other is not policy:  # Prometheus, on the one port: nothing else reaches a node
            assert other["spec"]["policyTypes"] == ["Ingress"]
            (rule,) = other["spec"]["ingress"]
            assert "podSelector" not in rule["from"][0] and rule["ports"] == [
                {"protocol": "TCP", "port": 8080}
            ]
    config = one(docs, "ConfigMap")["data"]
    assert config["SANDBANK_FLEET_DNS"].startswith(f"{nodes['spec']['serviceName']}.")
    assert {
        p["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        for p in of(docs, "PodDisruptionBudget")
    } == {"node", "front"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_nodes_are_privileged_and_no_pod_gets_a_cluster_credential(
    tree: Path, overlay: str
) -> None:
    docs = rendered(tree, overlay)
    for d in of(docs, "StatefulSet") + of(docs, "Deployment"):
        spec = d["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
        # A Service named `sandbank` would otherwise put SANDBANK_PORT=tcp://... in every pod.
        assert spec["enableServiceLinks"] is False
        privileged = any(c["securityContext"].get("privileged") for c in spec["containers"])
        assert privileged == (d["kind"] == "StatefulSet")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_disruption_budget_blocks_a_drain(tree: Path, overlay: str) -> None:
    docs = rendered(tree, overlay)
    for budget in of(docs, "PodDisruptionBudget"):
        component = budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        kind = "Deployment" if component == "front" else "StatefulSet"
        replicas = one(docs, kind)["spec"]["replicas"]
        spec = budget["spec"]
        assert spec.get("maxUnavailable", 0) >= 1 or spec["minAvailable"] < replicas


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_ingress_serves_the_public_name_over_tls(tree: Path, overlay: str) -> None:
    docs = rendered(tree, overlay)
    ingress = one(docs, "Ingress")["spec"]
    (tls,) = ingress["tls"]
    (rule,) = ingress["rules"]
    host = rule["host"]
    assert tls["hosts"] == [host] and tls["secretName"]
    (path,) = rule["http"]["paths"]
    backend = path["backend"]["service"]
    service = one(docs, "Service", backend["name"])
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "front"
    env = environment(docs, "Deployment")
    assert host in env["SANDBANK_ALLOWED_HOSTS"].split(",")
    assert env["SANDBANK_PUBLIC_BASE_URL"] == f"https://{host}"


def test_prometheus_scrapes_fronts_and_nodes_with_its_own_token(tree: Path) -> None:
    docs = rendered(tree, "production")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [
        s for s in of(docs, "Service") if selector.items() <= s["metadata"]["labels"].items()
    ]
    assert {s["metadata"]["name"] for s in selected} == {"sandbank", "sandbank-node"}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert all(endpoint["port"] in {p["name"] for p in s["spec"]["ports"]} for s in selected)
    credentials = endpoint["authorization"]["credentials"]
    assert credentials["key"] in secret(docs, credentials["name"])
    assert credentials["key"] == "SANDBANK_METRICS_TOKEN"


def test_the_model_settings_are_a_secret_of_their_own(tree: Path) -> None:
    for overlay in OVERLAYS:
        docs = rendered(tree, overlay)
        model = secret(docs, "sandbank-model")
        assert set(model) == {"SANDBANK_LLM_MODEL", "SANDBANK_LLM_API_KEY"}
        assert "SANDBANK_LLM_MODEL" not in one(docs, "ConfigMap")["data"]


def test_the_image_is_debian_12_with_what_sandboxes_need_and_sandbank_on_the_path() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "FROM debian:12" in dockerfile
    for package in ("bubblewrap", "util-linux", "e2fsprogs", "mount", "python3-venv"):
        assert package in dockerfile
    assert "runtime/requirements.txt" in dockerfile
    # The README's first-user step: kubectl exec deploy/sandbank-front -- sandbank users create
    assert "PATH=/opt/sandbank/.venv/bin:" in dockerfile


def test_the_secret_files_are_never_committed() -> None:
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "deploy/kubernetes/overlays/*/secrets.env" in ignored
    assert "deploy/kubernetes/overlays/*/model.env" in ignored


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_credential_of_the_examples_is_a_value_of_its_own(overlay: str) -> None:
    """One shared placeholder would hide a token used for two purposes (the scraper's opening
    a node's API, say)."""
    lines = (K8S / "overlays" / overlay / "secrets.env.example").read_text().splitlines()
    values = [v for line in lines if not line.startswith("#") and "=" in line
              for v in line.partition("=")[2].split(",")]  # fmt: skip
    assert len(values) == len(set(values))


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
