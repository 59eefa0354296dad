"""The Kubernetes deployment in deploy/: the kustomization renders (`kubectl kustomize` where it is
installed, else tests/deploy/render.py) and every object validates against the Kubernetes schemas
(`kubernetes-validate`); the nodes' StatefulSet keeps the promises docs/deploy.md makes; the Helm
values for Dagster's chart and the image definition hold what the deployment needs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.deploy.render import render_with_kubectl, render_with_python

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"
#: The Kubernetes version whose schemas the objects must satisfy (the newest kubernetes-validate knows).
K8S_VERSION = kubernetes_validate.utils.latest_version()

# `kubectl kustomize` is a subprocess where kubectl is installed.
pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render_with_kubectl(K8S) or render_with_python(K8S)


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def test_every_object_validates_against_the_kubernetes_schemas(objects: list[dict[str, Any]]) -> None:
    assert {o["kind"] for o in objects} >= {"StatefulSet", "PodDisruptionBudget", "Service", "ConfigMap"}
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_python_renderer_renders_what_kubectl_does() -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the Python renderer is the only one")

    def by_name(objects: list[dict[str, Any]] | None) -> dict[tuple[str, str], dict[str, Any]]:
        # kubectl orders the objects by kind; the renderer keeps the resources' order.
        return {(o["kind"], o["metadata"]["name"]): o for o in objects or []}

    assert by_name(render_with_python(K8S)) == by_name(render_with_kubectl(K8S))


def test_a_broken_object_fails_validation(objects: list[dict[str, Any]]) -> None:
    broken = yaml.safe_load(yaml.safe_dump(_one(objects, "StatefulSet")))
    broken["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_the_nodes_statefulset_takes_ids_from_the_ordinal_readiness_from_healthz_and_outlasts_the_leave(
    objects: list[dict[str, Any]],
) -> None:
    sts = _one(objects, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    (node,) = pod["containers"]
    command = " ".join(node["command"] + node["args"])
    assert "exec laminar node run" in command
    # Pod laminar-node-K is node K+1: the id survives every restart of the pod.
    assert '--node-id "$(( ${HOSTNAME##*-} + 1 ))"' in command
    assert node["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert node["livenessProbe"]["httpGet"]["path"] == "/livez"
    port = node["readinessProbe"]["httpGet"]["port"]
    assert port in {p["name"] for p in node["ports"]} and "--metrics-port 9100" in command
    assert "--metrics-host 0.0.0.0" in command
    deadline = float(re.search(r"--leave-deadline (\d+(?:\.\d+)?)", command).group(1))  # type: ignore[union-attr]
    # The leave, its release and the exit fit in the grace period with room to spare.
    assert deadline + 5 <= pod["terminationGracePeriodSeconds"] <= 30
    assert node["image"] == "registry.example.com/laminar:0.1.0"
    assert sts["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert sts["spec"]["serviceName"] == _one(objects, "Service")["metadata"]["name"]


def test_the_disruption_budget_covers_the_nodes_one_at_a_time(objects: list[dict[str, Any]]) -> None:
    pdb = _one(objects, "PodDisruptionBudget")
    labels = _one(objects, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {"laminar"}


def test_the_dagster_helm_values_run_postgresql_the_k8s_run_launcher_and_the_nodes_image() -> None:
    values = yaml.safe_load((DEPLOY / "helm" / "dagster-values.yaml").read_text())
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["postgresql"]["enabled"] is True
    assert values["dagsterDaemon"]["enabled"] is True
    (location,) = values["dagster-user-deployments"]["deployments"]
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert (location["image"]["repository"], location["image"]["tag"]) == (image["newName"], image["newTag"])
    args = location["dagsterApiGrpcArgs"]
    assert args[args.index("--python-file") + 1] == "/opt/laminar/definitions.py"
    assert {"name": "laminar-store"} in location["envConfigMaps"]


def test_the_image_holds_the_library_java_and_the_code_location() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "openjdk-17-jre-headless" in dockerfile and "pip install ." in dockerfile
    root = DEPLOY.parent
    for part in ("definitions.py", "assets", "jobs", "sensors", "resources", "launcher"):
        assert re.search(rf"^COPY .*\b{re.escape(part)}\b", dockerfile, re.M), part
        assert (root / part).exists(), part
        assert f"!{part}" in (DEPLOY / "Dockerfile.dockerignore").read_text()
