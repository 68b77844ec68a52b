"""The Kubernetes objects in deploy/, read and checked field by field against the client's models.

The ``kubernetes`` client's deserializer fills a model from a dict and, with client-side
validation (its default), refuses a missing required field; it silently drops fields it does
not know, so :func:`unknown_fields` walks each document beside its model (``openapi_types``,
``attribute_map``) and reports every key the model does not have, and every value whose JSON
type is not the field's, by its path in the document.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml
from kubernetes import client

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"

_PRIMITIVES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
                                            "date": (str,), "datetime": (str,), "object": (object,)}


@dataclass(frozen=True)
class Document:
    """One YAML document of a file under deploy/kubernetes."""

    path: Path
    index: int
    body: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}#{self.index} {self.body.get('kind')}/{self.body.get('metadata', {}).get('name')}"


def documents() -> list[Document]:
    """Every Kubernetes object under deploy/kubernetes (kustomization.yaml files are kustomize's, not objects)."""
    found = []
    for path in sorted(KUBERNETES.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        try:
            bodies = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError as exc:
            raise AssertionError(f"{path.relative_to(REPO)}: not valid YAML: {exc}") from None
        found.extend(Document(path, index, body) for index, body in enumerate(bodies) if body is not None)
    return found


def model_of(body: dict[str, Any]) -> type:
    """The client's model class for a document: apiVersion `v1`, `apps/v1`, `batch/v1` and kind `Pod` -> V1Pod."""
    version = body["apiVersion"].split("/")[-1]
    return getattr(client, version[0].upper() + version[1:] + body["kind"])


class _Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body)


def deserialize(body: dict[str, Any]) -> Any:
    """The model object for a document; raises ValueError for a missing required field or a bad value."""
    api = client.ApiClient()
    return api.deserialize(_Response(body), model_of(body).__name__)


def _model(type_name: str) -> type | None:
    return getattr(client, type_name, None) if type_name[:1].isupper() else None


def unknown_fields(value: Any, type_name: str, path: str = "") -> Iterator[str]:
    """Every key not in the model and every value of the wrong JSON type, as `path: problem`."""
    inner = re.fullmatch(r"list\[(.+)\]", type_name)
    if inner:
        if not isinstance(value, list):
            yield f"{path}: expected a list, got {type(value).__name__}"
            return
        for i, item in enumerate(value):
            yield from unknown_fields(item, inner.group(1), f"{path}[{i}]")
        return
    inner = re.fullmatch(r"dict[\[(]str, (.+)[\])]", type_name)
    if inner:
        if not isinstance(value, dict):
            yield f"{path}: expected a mapping, got {type(value).__name__}"
            return
        for key, item in value.items():
            yield from unknown_fields(item, inner.group(1), f"{path}.{key}")
        return
    if type_name in _PRIMITIVES:
        allowed = _PRIMITIVES[type_name]
        if not isinstance(value, allowed) or (type_name == "int" and isinstance(value, bool)):
            yield f"{path}: expected {type_name}, got {type(value).__name__} {value!r}"
        return
    model = _model(type_name)
    if model is None:
        yield f"{path}: the client has no model {type_name}"
        return
    if not isinstance(value, dict):
        yield f"{path}: expected an object ({type_name}), got {type(value).__name__}"
        return
    by_json = {json_key: attr for attr, json_key in model.attribute_map.items()}
    for key, item in value.items():
        attr = by_json.get(key)
        if attr is None:
            yield f"{path}.{key}: not a field of {type_name}"
            continue
        yield from unknown_fields(item, model.openapi_types[attr], f"{path}.{key}")


def pod_spec(body: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec of a Pod, DaemonSet, Deployment or Job document, else None."""
    if body["kind"] == "Pod":
        return body["spec"]
    template = body.get("spec", {}).get("template")
    return template["spec"] if template else None


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
