"""A small renderer of deploy/k8s's kustomization, for machines without `kubectl kustomize`: its
resources in order, the namespace on namespaced objects, its labels and its image replacements - the
features the kustomization uses, and nothing else (anything else fails loudly)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

#: Kinds the kustomization holds that live in no namespace.
CLUSTER_SCOPED = {"Namespace"}
KNOWN_FIELDS = {"apiVersion", "kind", "namespace", "labels", "resources", "images"}


def render_with_python(root: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize root` would print, for the features the kustomization uses."""
    spec = yaml.safe_load((root / "kustomization.yaml").read_text())
    unknown = set(spec) - KNOWN_FIELDS
    if unknown:
        raise ValueError(f"the Python renderer does not know {sorted(unknown)}: render with kubectl kustomize")
    docs: list[dict[str, Any]] = []
    for name in spec["resources"]:
        docs += [d for d in yaml.safe_load_all((root / name).read_text()) if d]
    images = {i["name"]: f"{i['newName']}:{i['newTag']}" for i in spec.get("images", [])}
    labels: dict[str, str] = {}
    for entry in spec.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise ValueError("the Python renderer only puts labels on the objects' own metadata")
        labels.update(entry["pairs"])
    for doc in docs:
        meta = doc.setdefault("metadata", {})
        if doc["kind"] not in CLUSTER_SCOPED and "namespace" in spec:
            meta["namespace"] = spec["namespace"]
        if labels:
            meta["labels"] = {**meta.get("labels", {}), **labels}
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            name = container["image"].partition(":")[0]
            if name in images:
                container["image"] = images[name]
    return docs


def render_with_kubectl(root: Path) -> list[dict[str, Any]] | None:
    """`kubectl kustomize root`'s objects; None where kubectl is not installed."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    out = subprocess.run([kubectl, "kustomize", str(root)], capture_output=True, text=True, check=True, timeout=60)
    return [d for d in yaml.safe_load_all(out.stdout) if d]
