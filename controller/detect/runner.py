"""Run every enabled detector, each in a guard, and merge what they say about the same thing."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from controller.detect.base import DetectContext, discover
from controller.fleet.finding import Finding, FindingKey, worse

log = logging.getLogger("gpufleet.controller.detect")


@dataclass(slots=True)
class PassReport:
    findings: list[Finding]
    durations: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def run_detectors(ctx: DetectContext, names: list[str] | None = None) -> PassReport:
    registry = discover()
    selected = names if names is not None else ctx.config.enabled(sorted(registry))
    report = PassReport(findings=[])
    raw: list[Finding] = []
    for name in selected:
        start = time.perf_counter()
        try:
            raw.extend(registry[name](ctx))
        except Exception as exc:  # one broken detector must not hide what the others found
            log.exception("detector %s failed", name)
            report.failed[name] = str(exc)
        report.durations[name] = time.perf_counter() - start
    report.findings = merge(raw)
    return report


def merge(findings: list[Finding]) -> list[Finding]:
    """One finding per (node, gpu, cause): the worst severity, the first detector's evidence as primary
    (probe evidence, which says how slow, comes first), the rest as supporting."""
    merged: dict[FindingKey, Finding] = {}
    for f in sorted(findings, key=lambda f: (f.key[0], -1 if f.gpu is None else f.gpu, f.cause, _rank(f))):
        current = merged.get(f.key)
        if current is None:
            merged[f.key] = Finding(
                f.node,
                f.gpu,
                f.cause,
                f.severity,
                f.summary,
                f.evidence,
                list(f.supporting),
                list(f.detectors),
            )
            continue
        current.severity = worse(current.severity, f.severity)
        for ev in (f.evidence, *f.supporting):
            if ev not in current.supporting and ev != current.evidence:
                current.supporting.append(ev)
        current.detectors.extend(d for d in f.detectors if d not in current.detectors)
    return list(merged.values())


def _rank(f: Finding) -> int:
    return 0 if f.evidence.metric.startswith("probe.") else 1
