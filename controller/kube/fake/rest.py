"""The REST verbs on stored objects (get, list, create, replace, patch, delete, evict) with the
API server's rules: 409 on a stale resourceVersion, status only through /status, pods that
terminate gracefully (or never, when stuck), dry runs that change nothing."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from controller.kube.fake import defaults, evict, patch
from controller.kube.fake.errors import ApiError, conflict, status_body
from controller.kube.fake.resources import BY_KIND, PDB, POD, Resource, by_kind
from controller.kube.fake.selectors import field_selector, label_selector
from controller.kube.fake.store import Store

Query = dict[str, str]


class Api:
    def __init__(self, store: Store, stuck: set[tuple[str, str]], pod_grace_seconds: float) -> None:
        self.store = store
        self.stuck = stuck
        self.pod_grace_seconds = pod_grace_seconds

    def _lookup(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        r = BY_KIND.get(kind)
        return self.store.get(r, namespace, name) if r else None

    def _view(self, r: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        if r is PDB:
            obj = evict.with_status(obj, self.store.list(POD))
        return copy.deepcopy(obj)

    @contextmanager
    def dry_run(self, dry: bool) -> Iterator[None]:
        state = self.store.snapshot() if dry else None
        try:
            yield
        finally:
            if state is not None:
                self.store.restore(state)

    def get(self, r: Resource, namespace: str, name: str) -> dict[str, Any]:
        return self._view(r, self.store.require(r, namespace, name))

    def list(self, r: Resource, namespace: str | None, query: Query) -> dict[str, Any]:
        if query.get("watch") in ("true", "1"):
            raise ApiError(405, "the fake API server does not serve watches; list and poll instead")
        items = self.store.list(r, namespace)
        if query.get("fieldSelector"):
            items = list(filter(field_selector(query["fieldSelector"], r.fields()), items))
        if query.get("labelSelector"):
            items = list(filter(label_selector(query["labelSelector"]), items))
        return {
            "kind": r.list_kind,
            "apiVersion": r.api_version,
            "metadata": {"resourceVersion": self.store.resource_version},
            "items": [self._view(r, o) for o in items],
        }

    def create(self, r: Resource, namespace: str, body: Any) -> dict[str, Any]:
        obj = _object(body, r)
        meta = obj.setdefault("metadata", {})
        if r.namespaced:
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = namespace
        obj["apiVersion"], obj["kind"] = r.api_version, r.kind
        defaults.fill(obj, self._lookup)
        return self._view(r, self.store.create(r, obj))

    def replace(self, r: Resource, namespace: str, name: str, sub: str, body: Any) -> dict[str, Any]:
        current = self.store.require(r, namespace, name)
        return self._write(r, current, _object(body, r), sub)

    def patch(
        self, r: Resource, namespace: str, name: str, sub: str, *, content_type: str, body: Any
    ) -> dict[str, Any]:
        current = self.store.require(r, namespace, name)
        if content_type not in patch.TYPES:
            raise ApiError(
                415,
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{', '.join(patch.TYPES)}",
            )
        try:
            patched = patch.apply(content_type, copy.deepcopy(current), body, r.merge_keys)
        except patch.PatchError as e:
            raise ApiError(422, str(e)) from e
        return self._write(r, current, _object(patched, r), sub)

    def _write(self, r: Resource, current: dict[str, Any], new: dict[str, Any], sub: str) -> dict[str, Any]:
        meta, cur_meta = new.setdefault("metadata", {}), current["metadata"]
        name = cur_meta["name"]
        if meta.get("name", name) != name:
            raise ApiError(
                400, f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        version = meta.get("resourceVersion")
        if version not in (None, "") and str(version) != cur_meta["resourceVersion"]:
            raise conflict(r.plural, r.group, name)
        if sub == "status":
            new = {**copy.deepcopy(current), "status": new.get("status") or {}}
        else:
            meta["name"] = name
            if r.has_status:
                new["status"] = copy.deepcopy(current.get("status"))
        return self._view(r, self.store.update(r, new))

    def delete(self, r: Resource, namespace: str, name: str, options: dict[str, Any]) -> dict[str, Any]:
        obj = self.store.require(r, namespace, name)
        _preconditions(r, obj, options.get("preconditions") or {})
        meta = obj["metadata"]
        if r is POD:
            grace = options.get("gracePeriodSeconds")
            if grace is None:
                grace = obj.get("spec", {}).get("terminationGracePeriodSeconds", 30)
            self.store.mark_deleted(r, obj, int(grace), 0.0 if int(grace) == 0 else self.pod_grace_seconds)
            self.store.reap(self.stuck)
            return copy.deepcopy(obj)
        if meta.get("finalizers"):
            self.store.mark_deleted(r, obj, 0, None)
            return copy.deepcopy(obj)
        self.store.remove(self.store.key(obj))
        details = {"name": name, "group": r.group, "kind": r.plural, "uid": meta["uid"]}
        return status_body(200, "Success", details=details)

    def evict(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        eviction = body if isinstance(body, dict) else {}
        if eviction.get("kind", "Eviction") != "Eviction":
            raise ApiError(400, f"expected an Eviction, got {eviction.get('kind')!r}")
        named = (eviction.get("metadata") or {}).get("name")
        if named and named != name:
            raise ApiError(400, "name in URL does not match name in Eviction object")
        pod = self.store.require(POD, namespace, name)
        evict.check(pod, self.store.list(PDB, namespace), self.store.list(POD, namespace))
        options = eviction.get("deleteOptions") or {}
        with self.dry_run(bool(options.get("dryRun"))):
            evict.mark_disruption_target(pod)
            self.delete(POD, namespace, name, options)
        return status_body(201, "Success")

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if not isinstance(kind, str):
            raise ValueError("an object needs a kind")
        r = by_kind(kind, api_version if isinstance(api_version, str) else None)
        namespace = obj.get("metadata", {}).get("namespace") or "default"
        return self.create(r, namespace, copy.deepcopy(obj))


def _object(body: Any, r: Resource) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, f"the body of the request must be a {r.kind} object")
    if body.get("kind") not in (None, r.kind):
        raise ApiError(400, f"the body of the request is a {body['kind']}, not a {r.kind}")
    return body


def _preconditions(r: Resource, obj: dict[str, Any], pre: dict[str, Any]) -> None:
    meta = obj["metadata"]
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        if pre.get(field) and pre[field] != meta.get(field):
            raise ApiError(
                409,
                f"Precondition failed: {label} in precondition: {pre[field]}, "
                f"{label} in object meta: {meta.get(field)}",
                reason="Conflict",
                details={"name": meta["name"], "group": r.group, "kind": r.plural},
            )
