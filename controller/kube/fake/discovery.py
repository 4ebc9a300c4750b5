"""Discovery documents (/api, /api/v1, /apis, /apis/{group}/{version}, /version), the legacy
(unaggregated) form: kubectl asks for the aggregated one first and falls back to these."""

from __future__ import annotations

from typing import Any

from controller.kube.fake.resources import RESOURCES, Resource

VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.4",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_VERBS = ["create", "delete", "get", "list", "patch", "update"]
_SUB_VERBS = {"status": ["get", "patch", "update"], "eviction": ["create"]}


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group_entry(group: str) -> dict[str, Any]:
    version = next(r.version for r in RESOURCES if r.group == group)
    gv = {"groupVersion": f"{group}/{version}", "version": version}
    return {"name": group, "versions": [gv], "preferredVersion": gv}


def groups() -> list[str]:
    return list(dict.fromkeys(r.group for r in RESOURCES if r.group))


def api_group_list() -> dict[str, Any]:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group_entry(g) for g in groups()]}


def api_group(group: str) -> dict[str, Any] | None:
    if group not in groups():
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group)}


def _entries(r: Resource) -> list[dict[str, Any]]:
    main: dict[str, Any] = {
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": _VERBS,
    }
    if r.short_names:
        main["shortNames"] = list(r.short_names)
    if r.categories:
        main["categories"] = list(r.categories)
    out = [main]
    for sub in r.subresources:
        entry: dict[str, Any] = {
            "name": f"{r.plural}/{sub}",
            "singularName": "",
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": _SUB_VERBS[sub],
        }
        if sub == "eviction":  # kubectl drain finds the Eviction API's group and version here
            entry.update(group="policy", version="v1", kind="Eviction")
        out.append(entry)
    return out


def resource_list(api_version: str) -> dict[str, Any] | None:
    members = [r for r in RESOURCES if r.api_version == api_version]
    if not members:
        return None
    resources = [e for r in members for e in _entries(r)]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": api_version,
        "resources": resources,
    }
