"""The bench's report: per scenario, per fault and overall, the controller beside the static rule,
and a verdict against each target of issue 16."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from detection_scenarios import static_rule
from detection_scenarios.drive import Run
from detection_scenarios.score import FaultResult, Score, false_events, score


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    text: str
    key: str
    check: str  # ">=" a number, "<=" a number, "==" a number

    def verdict(self, value: Any, bound: float) -> str:
        if value is None:
            return "n/a"
        if self.check == ">=":
            return "PASS" if value >= bound else "short"
        if self.check == "<=":
            return "PASS" if value <= bound else "short"
        return "PASS" if value == bound else "short"


TARGETS = (
    (Target("precision", "precision >= 0.99", "precision", ">="), 0.99),
    (Target("recall_slow", "recall >= 0.99 for faults slowing a GPU >= 5%", "recall_slow", ">="), 0.99),
    (Target("cause_accuracy", "cause accuracy >= 0.95", "cause_accuracy", ">="), 0.95),
    (Target("healthy", "zero findings on healthy fleets", "healthy_events", "=="), 0),
    (Target("throttle", "throttle time to detect from telemetry <= 30 s", "throttle_worst", "<="), 30.0),
)


def build(runs: list[Run], baseline: static_rule.Baseline, meta: dict[str, Any]) -> dict[str, Any]:
    """Everything the report shows, as plain data (the --json output)."""
    overall, static_overall = Score(), Score()
    scenarios = []
    for run in runs:
        mine = score(run, run.opens)
        static = score(run, static_rule.events(run.probes, baseline))
        overall.add(mine)
        static_overall.add(static)
        s = run.scenario
        scenarios.append(
            {
                "name": s.name,
                "kind": s.kind,
                "nodes": len(s.models),
                "models": sorted(set(s.models)),
                "hours": round(s.seconds / 3600.0, 2),
                "step_seconds": s.step,
                "probe_interval_seconds": s.probe_interval,
                "detect_interval_seconds": s.detect_interval,
                "frames": run.frames,
                "passes": run.passes,
                "wall_seconds": round(run.wall_seconds, 1),
                "findings_opened": len(run.opens),
                "findings_open_at_end": len(run.open_at_end),
                "controller": mine.as_dict(),
                "static": static.as_dict(),
                "false_findings": [
                    {"time": e.time, "node": e.node, "gpu": e.gpu, "cause": e.cause, "severity": e.severity}
                    for e in false_events(run, run.opens)
                ],
            }
        )
    ctl, sta = overall.as_dict(), static_overall.as_dict()
    healthy = [s for s in scenarios if s["kind"] == "healthy"]
    ctl["healthy_hours"] = sum(s["hours"] for s in healthy)
    worst = overall.throttle_seconds()[2]
    ctl["throttle_worst"] = None if worst is None else worst
    targets = []
    for target, bound in TARGETS:
        value = ctl.get(target.key)
        targets.append(
            {
                "name": target.name,
                "target": target.text,
                "value": None if isinstance(value, float) and math.isinf(value) else value,
                "missed_some": isinstance(value, float) and math.isinf(value),
                "verdict": "short"
                if isinstance(value, float) and math.isinf(value)
                else target.verdict(value, bound),
            }
        )
    static_faults = {(f.scenario, f.label, f.node): f for f in static_overall.faults}
    return {
        **meta,
        "scenarios": scenarios,
        "faults": [_fault(f, static_faults.get((f.scenario, f.label, f.node))) for f in overall.faults],
        "overall": {"controller": ctl, "static": sta},
        "targets": targets,
        "baseline": {f"{m}/{p}/{v}": round(x, 2) for (m, p, v), x in sorted(baseline.items())},
    }


def _fault(f: FaultResult, static: FaultResult | None) -> dict[str, Any]:
    return {
        "scenario": f.scenario,
        "fault": f.label,
        "node": f.node,
        "gpu": f.gpu,
        "slowdown": f.slowdown,
        "cause": f.cause,
        "detected": f.detected,
        "causes_found": f.causes,
        "cause_right": f.cause_right,
        "frames_to_detect": f.frames_to_detect,
        "seconds_to_detect": f.seconds_to_detect,
        "opens": f.opens,
        "static_detected": None if static is None else static.detected,
        "static_frames_to_detect": None if static is None else static.frames_to_detect,
    }


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if digits else f"{value:.0f}"
    return str(value)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def text(report: dict[str, Any]) -> str:
    lines = [
        f"detection bench ({report['mode']}, seed {report['seed']}): {len(report['scenarios'])} scenarios, "
        f"{len(report['faults'])} injected faults, {report['wall_seconds']:.0f} s wall, "
        f"{report['cpu_seconds']:.0f} s CPU, {report['jobs']} job(s)",
        f"detection: {report['detector_config']}",
        "",
        "Scenarios (controller | static rule)",
    ]
    rows = [
        [
            "scenario",
            "kind",
            "nodes",
            "hours",
            "step",
            "faults",
            "opened",
            "prec",
            "rec>=5%",
            "rec all",
            "cause",
            "ttd p50/p90",
            "churn",
            "| st prec",
            "st rec>=5%",
            "st rec all",
        ]
    ]
    for s in report["scenarios"]:
        c, st = s["controller"], s["static"]
        rows.append(
            [
                s["name"],
                s["kind"],
                str(s["nodes"]),
                _num(s["hours"], 1),
                f"{s['step_seconds']:g}s",
                str(c["faults"]),
                str(s["findings_opened"]),
                _num(c["precision"]),
                _num(c["recall_slow"]),
                _num(c["recall_all"]),
                _num(c["cause_accuracy"]),
                f"{_num(c['frames_to_detect_p50'])}/{_num(c['frames_to_detect_p90'])}",
                _num(c["churn"], 2),
                "| " + _num(st["precision"]),
                _num(st["recall_slow"]),
                _num(st["recall_all"]),
            ]
        )
    lines += _table(rows)
    lines += ["", "Faults (ttd in frames; causes: what the controller named at the fault)"]
    rows = [
        [
            "fault",
            "scenario",
            "where",
            "slowdown",
            "found",
            "cause",
            "causes found",
            "ttd",
            "opens",
            "| static",
            "st ttd",
        ]
    ]
    for f in report["faults"]:
        where = f["node"] if f["gpu"] is None else f"{f['node']}/gpu{f['gpu']}"
        rows.append(
            [
                f["fault"],
                f["scenario"],
                where,
                f"{f['slowdown']:.1%}",
                _num(f["detected"]),
                f["cause"],
                ",".join(f["causes_found"]) or "-",
                _num(f["frames_to_detect"]),
                str(f["opens"]),
                "| " + _num(f["static_detected"]),
                _num(f["static_frames_to_detect"]),
            ]
        )
    lines += _table(rows)
    false = [(s["name"], e) for s in report["scenarios"] for e in s["false_findings"]]
    if false:
        lines += ["", f"False findings ({len(false)}; first 20)"]
        for name, e in false[:20]:
            where = e["node"] if e["gpu"] is None else f"{e['node']}/gpu{e['gpu']}"
            lines.append(f"  {name}  t={e['time']:.0f}s  {where}  {e['cause']} ({e['severity']})")
    c, st = report["overall"]["controller"], report["overall"]["static"]
    lines += ["", "Overall"]
    rows = [["metric", "controller", "static rule"]]
    for key, label in (
        ("precision", "precision (locations)"),
        ("false_locations", "false locations"),
        ("false_opens", "false opens"),
        ("recall_slow", "recall, faults slowing >= 5%"),
        ("recall_all", "recall, all faults"),
        ("cause_accuracy", "cause accuracy"),
        ("frames_to_detect_p50", "time to detect p50 (frames)"),
        ("frames_to_detect_p90", "time to detect p90 (frames)"),
        ("churn", "churn (opens per detected fault)"),
        ("throttle_seconds_p50", "throttle time to detect p50 (s)"),
        ("throttle_seconds_p90", "throttle time to detect p90 (s)"),
        ("throttle_seconds_max", "throttle time to detect max (s)"),
        ("healthy_events", "events on healthy fleets"),
    ):
        rows.append([label, _num(c.get(key)), "-" if key == "cause_accuracy" else _num(st.get(key))])
    lines += _table(rows)
    lines += [
        f"({c['faults']} faults, {c['slow_faults']} slowing >= 5%, {c['throttle_faults']} throttle faults; "
        f"healthy fleets: {c['healthy_hours']:.1f} fleet-hours)",
        "",
        "Targets",
    ]
    rows = [["target", "value", "verdict"]]
    for t in report["targets"]:
        value = "missed one" if t["missed_some"] else _num(t["value"])
        rows.append([t["target"], value, t["verdict"]])
    lines += _table(rows)
    return "\n".join(lines)
