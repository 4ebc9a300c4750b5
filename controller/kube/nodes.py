"""Cordon and uncordon through the Node object, respecting other actors, and the patch helper every
Node change goes through (node health: controller/kube/health.py).

- gpufleet's cordon records itself in the annotation `gpufleet.io/cordoned-by: gpufleet`. A node
  cordoned by someone else (unschedulable, without that annotation) is left cordoned and never
  uncordoned by gpufleet, unless an operator forces it explicitly.
- A node carrying one of the config's maintenance annotations or labels is under someone else's
  maintenance: `maintenance_mark` names the mark, and the callers leave the node alone.
- Every change is a strategic merge patch carrying the resourceVersion it was computed from: a 409
  (the node changed meanwhile) re-reads the node and computes the patch again.

Synchronous (the API client is); the controller calls these in a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.config import MaintenanceConfig
from controller.errors import FailedPrecondition
from controller.kube.api import ApiError, KubeApi, Obj

log = logging.getLogger("gpufleet.controller.kube")
CORDONED_BY = "gpufleet.io/cordoned-by"
GPUFLEET = "gpufleet"
CONFLICT_RETRIES = 5
Build = Callable[[Obj], Obj | None]


@dataclass(frozen=True, slots=True)
class Changed:
    changed: bool
    detail: str  # one line: what happened


def meta(obj: Obj, field: str) -> dict[str, str]:
    """metadata.labels or metadata.annotations, {} when absent."""
    return dict((obj.get("metadata") or {}).get(field) or {})


def unschedulable(node: Obj) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def cordoned_by(node: Obj) -> str:
    """ "" (schedulable), "gpufleet" (our cordon) or "other" (someone else's)."""
    if not unschedulable(node):
        return ""
    return GPUFLEET if meta(node, "annotations").get(CORDONED_BY) == GPUFLEET else "other"


def maintenance_mark(node: Obj, config: MaintenanceConfig) -> str:
    """The first maintenance mark (`annotation KEY=VALUE`) the node carries; "" for none."""
    for kind, marks, got in (
        ("annotation", config.annotations, meta(node, "annotations")),
        ("label", config.labels, meta(node, "labels")),
    ):
        for mark in marks:
            key, eq, value = mark.partition("=")
            key = key.strip()
            if key in got and (not eq or got[key] == value.strip()):
                return f"{kind} {key}={got[key]}"
    return ""


def patch_node(api: KubeApi, name: str, build: Build, *, status: bool = False) -> tuple[Obj, bool]:
    """Read the node, patch what `build` returns (None: nothing to change) with the node's
    resourceVersion; on 409 read again and rebuild. Returns the node as it now is, and whether it
    was patched. `status`: the nodes/status subresource (conditions)."""
    for attempt in range(CONFLICT_RETRIES):
        node = api.get_node(name)
        patch = build(node)
        if patch is None:
            return node, False
        version = (node.get("metadata") or {}).get("resourceVersion")
        if version:
            patch.setdefault("metadata", {})["resourceVersion"] = version
        try:
            return (api.patch_node_status if status else api.patch_node)(name, patch), True
        except ApiError as exc:
            if exc.status != 409:
                raise
            log.info("node %s changed meanwhile (409, try %d): reading it again", name, attempt + 1)
    raise ApiError(409, "Conflict", f"node {name} kept changing: {CONFLICT_RETRIES} conflicting updates")


def cordon(api: KubeApi, name: str) -> Changed:
    """Mark the node unschedulable, recording gpufleet in the annotation; a node already cordoned
    (by anyone) is left as it is."""

    def build(node: Obj) -> Obj | None:
        if unschedulable(node):
            return None
        return {"metadata": {"annotations": {CORDONED_BY: GPUFLEET}}, "spec": {"unschedulable": True}}

    node, changed = patch_node(api, name, build)
    if changed:
        return Changed(True, f"node {name} cordoned by gpufleet")
    if cordoned_by(node) == GPUFLEET:
        return Changed(False, f"node {name} was already cordoned by gpufleet")
    return Changed(
        False,
        f"node {name} was already cordoned by someone else (no {CORDONED_BY} annotation); "
        "gpufleet will not uncordon it",
    )


def uncordon(api: KubeApi, name: str, *, force: bool = False) -> Changed:
    """Make the node schedulable again, if gpufleet cordoned it (or `force`); FailedPrecondition
    for someone else's cordon without `force`."""

    seen: list[str] = []  # who had cordoned the node, as the patch that went through saw it

    def build(node: Obj) -> Obj | None:
        seen.append(cordoned_by(node))
        annotated = CORDONED_BY in meta(node, "annotations")
        clear: dict[str, Any] = {"annotations": {CORDONED_BY: None}}
        if not unschedulable(node):
            return {"metadata": clear} if annotated else None  # a stale record of an old cordon
        if cordoned_by(node) != GPUFLEET and not force:
            raise FailedPrecondition(
                f"node {name} was cordoned by someone else (no {CORDONED_BY}: {GPUFLEET} annotation); "
                "gpufleet uncordons only its own cordons (force it explicitly: gpufleet uncordon --force)"
            )
        return {"metadata": clear, "spec": {"unschedulable": False}}

    node, _ = patch_node(api, name, build)
    before = seen[-1]
    if unschedulable(node):  # the patch did not take (an API server that ignored it)
        raise ApiError(0, "", f"node {name} is still unschedulable after the uncordon patch")
    if not before:
        return Changed(False, f"node {name} was not cordoned")
    who = "gpufleet's" if before == GPUFLEET else "someone else's (forced)"
    return Changed(True, f"node {name} uncordoned ({who} cordon)")
