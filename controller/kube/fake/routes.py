"""URL paths to what they name: a discovery document, or a resource with its namespace, name and
subresource; and the REST verb each method and path pair calls."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from controller.kube.fake import discovery
from controller.kube.fake.errors import ApiError
from controller.kube.fake.patch import MERGE
from controller.kube.fake.resources import Resource, by_path
from controller.kube.fake.rest import Api


@dataclass(frozen=True, slots=True)
class Target:
    resource: Resource
    namespace: str | None  # None: cluster-scoped, or every namespace when listing
    name: str | None
    sub: str  # "", "status" or "eviction"


def parse(path: str) -> Target | None:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group_version, rest = "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    r = by_path(group_version, rest[0])
    if r is None or (namespace is not None and not r.namespaced):
        return None
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else ""
    if (sub and sub not in r.subresources) or (r.namespaced and name and namespace is None):
        return None
    return Target(r, namespace, name, sub)


def discover(path: str, host: str) -> dict[str, Any] | None:
    parts = [p for p in path.split("/") if p]
    if parts == ["version"]:
        return discovery.VERSION
    if parts == ["api"]:
        return discovery.api_versions(host)
    if parts == ["api", "v1"]:
        return discovery.resource_list("v1")
    if parts == ["apis"]:
        return discovery.api_group_list()
    if len(parts) == 2 and parts[0] == "apis":
        return discovery.api_group(parts[1])
    if len(parts) == 3 and parts[0] == "apis":
        return discovery.resource_list(f"{parts[1]}/{parts[2]}")
    return None


def query(text: str) -> dict[str, str]:
    return dict(parse_qsl(text, keep_blank_values=True))


def decode(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError as e:
        raise ApiError(400, f"the body of the request is not JSON: {e}") from e


def call(
    api: Api, method: str, target: Target, params: dict[str, str], *, content_type: str, body: Any
) -> tuple[int, dict[str, Any]]:
    """Run the REST verb; returns (HTTP status, body)."""
    r, namespace, name, sub = target.resource, target.namespace, target.name, target.sub
    ns = namespace or ""
    if method == "GET" and sub != "eviction":
        if name is None:
            return 200, api.list(r, namespace, params)
        return 200, api.get(r, ns, name)
    if name is None and method == "POST" and (namespace is not None or not r.namespaced):
        with api.dry_run(params.get("dryRun") == "All"):
            return 201, api.create(r, ns, body)
    if name is None:
        raise ApiError(405, f"the fake API server does not allow {method} on the {r.plural} collection")
    with api.dry_run(params.get("dryRun") == "All"):
        if method == "POST" and sub == "eviction":
            return 201, api.evict(ns, name, body)
        if method == "PUT" and sub != "eviction":
            return 200, api.replace(r, ns, name, sub, body)
        if method == "PATCH" and sub != "eviction":
            return 200, api.patch(r, ns, name, sub, content_type=content_type or MERGE, body=body)
        if method == "DELETE" and not sub:
            options = body if isinstance(body, dict) else {}
            if "gracePeriodSeconds" in params:
                options = {**options, "gracePeriodSeconds": _integer(params["gracePeriodSeconds"])}
            return 200, api.delete(r, ns, name, options)
    raise ApiError(405, f"the fake API server does not allow {method} on {r.plural}/{sub or name}")


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError as e:
        raise ApiError(400, f"invalid gracePeriodSeconds: {text!r}") from e
