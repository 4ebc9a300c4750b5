"""Objects by kind, namespace and name, with the metadata the API server owns: uid, a global
resourceVersion counter, creationTimestamp, generation (bumped when the spec changes) and
deletion (deletionTimestamp, finalizers, pods that vanish once their grace period is over)."""

from __future__ import annotations

import copy
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from controller.kube.fake.errors import already_exists, not_found
from controller.kube.fake.resources import NAMESPACE, Resource

Key = tuple[str, str, str]  # kind, namespace ("" when cluster-scoped), name


def timestamp(offset_seconds: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    def __init__(self) -> None:
        self._objects: dict[Key, dict[str, Any]] = {}
        self._version = 0
        self._vanish_at: dict[Key, float] = {}  # terminating pods: monotonic time they go away

    @property
    def resource_version(self) -> str:
        return str(self._version)

    def _bump(self, obj: dict[str, Any]) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)

    def get(self, r: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects.get((r.kind, namespace if r.namespaced else "", name))

    def require(self, r: Resource, namespace: str, name: str) -> dict[str, Any]:
        obj = self.get(r, namespace, name)
        if obj is None:
            raise not_found(r.plural, r.group, name)
        return obj

    def list(self, r: Resource, namespace: str | None = None) -> list[dict[str, Any]]:
        return [
            obj
            for (kind, ns, _), obj in sorted(self._objects.items())
            if kind == r.kind and (namespace is None or ns == namespace)
        ]

    def create(self, r: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj["apiVersion"], obj["kind"] = r.api_version, r.kind
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise ValueError(f"a {r.kind} needs metadata.name")
        if r.namespaced:
            meta["namespace"] = meta.get("namespace") or "default"
            if self.get(NAMESPACE, "", meta["namespace"]) is None:
                self.create(NAMESPACE, {"metadata": {"name": meta["namespace"]}})
        else:
            meta.pop("namespace", None)
        key = (r.kind, meta.get("namespace", ""), meta["name"])
        if key in self._objects:
            raise already_exists(r.plural, r.group, meta["name"])
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = timestamp()
        meta["generation"] = 1
        for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        self._bump(obj)
        self._objects[key] = obj
        return obj

    def update(self, r: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """Store `obj` over the object of the same name (which must exist), bumping resourceVersion."""
        meta = obj["metadata"]
        old = self.require(r, meta.get("namespace", ""), meta["name"])
        for field in (
            "uid",
            "creationTimestamp",
            "namespace",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            if field in old["metadata"]:
                meta[field] = old["metadata"][field]
        for field in ("labels", "annotations", "finalizers", "ownerReferences"):
            if field in meta and not meta[field]:
                del meta[field]  # omitted when empty, as the real server's JSON does
        meta["generation"] = old["metadata"].get("generation", 1) + (obj.get("spec") != old.get("spec"))
        obj["apiVersion"], obj["kind"] = r.api_version, r.kind
        self._bump(obj)
        key = (r.kind, meta.get("namespace", ""), meta["name"])
        self._objects[key] = obj
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and key not in self._vanish_at:
            self.remove(key)  # the last finalizer is gone
        return obj

    def mark_deleted(
        self, r: Resource, obj: dict[str, Any], grace_seconds: int, vanish_in: float | None
    ) -> None:
        """Set deletionTimestamp; a pod also vanishes `vanish_in` seconds on (see `reap`), any object
        once its finalizers are gone."""
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = timestamp(grace_seconds)
            meta["deletionGracePeriodSeconds"] = grace_seconds
            self._bump(obj)
        key = (r.kind, meta.get("namespace", ""), meta["name"])
        if vanish_in is None:
            return
        self._vanish_at[key] = min(self._vanish_at.get(key, float("inf")), time.monotonic() + vanish_in)

    def remove(self, key: Key) -> dict[str, Any] | None:
        self._vanish_at.pop(key, None)
        obj = self._objects.pop(key, None)
        if obj is not None:
            self._version += 1
        return obj

    def key(self, obj: dict[str, Any]) -> Key:
        meta = obj["metadata"]
        return obj["kind"], meta.get("namespace", ""), meta["name"]

    def reap(self, stuck: set[tuple[str, str]]) -> None:
        """Remove terminating pods whose time has come, unless stuck or held by a finalizer."""
        held = {("Pod", ns, name) for ns, name in stuck}
        now = time.monotonic()
        for key, when in list(self._vanish_at.items()):
            obj = self._objects.get(key)
            if obj is None:
                self._vanish_at.pop(key)
            elif when <= now and key not in held and not obj["metadata"].get("finalizers"):
                self.remove(key)

    def snapshot(self) -> tuple[dict[Key, dict[str, Any]], int, dict[Key, float]]:
        return copy.deepcopy(self._objects), self._version, dict(self._vanish_at)

    def restore(self, state: tuple[dict[Key, dict[str, Any]], int, dict[Key, float]]) -> None:
        self._objects, self._version, self._vanish_at = state
