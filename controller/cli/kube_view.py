"""The Kubernetes side of `gpufleet node NAME`: schedulable or cordoned (by whom), taints, the
health label, a maintenance mark, and the newest drain with its pods."""

from __future__ import annotations

from typing import Any

from controller.cli.kube import pods_table
from controller.cli.layout import plain
from protos.gpufleet.v1 import operator_pb2

CORDONED = {"gpufleet": "cordoned by gpufleet", "other": "cordoned by someone else"}


def kube_section(k: operator_pb2.KubernetesNode, *, wide: bool = False) -> list[Any]:
    if not k.found:
        return [plain(f"Kubernetes: {k.error or 'not found'}", style="yellow")]
    state = "schedulable" if k.schedulable else CORDONED.get(k.cordoned_by, "cordoned")
    bits = [state, f"health label {k.health_label or '-'}"]
    taints = [f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}" for t in k.taints]
    bits.append(f"taints {', '.join(taints) or '-'}")
    parts: list[Any] = [plain(f"Kubernetes: {'; '.join(bits)}")]
    if k.maintenance:
        parts.append(plain(f"under someone else's maintenance ({k.maintenance}): gpufleet leaves it alone"))
    if k.HasField("drain"):
        d = k.drain
        style = "green" if d.outcome == "drained" else "yellow" if d.outcome == "running" else "red"
        parts.append(plain(f"drain {d.id}: {d.outcome}: {d.progress}", style=style))
        if d.outcome == "running" or wide:
            parts.append(pods_table(d, wide=wide))
    return parts
