"""Detection quality on simulated fleets: precision, recall, cause accuracy, time to detect and
churn of the controller's detectors, beside a SuperBench-style static rule on the same data.

Builds scenarios with the simulator (every registered fault at several severities, intermittent
faults, a small peer group, mixed GPU models, healthy fleets over a day), streams them as agents
would (Hello, frames every 10 s with GPU, host and BMC readings, probe rounds on the controller's
schedule) into the controller's offline detection (controller/detect/offline.py), and scores the
findings against what was injected. Prints a report with a verdict against each target of issue 16;
progress goes to stderr. Asserts nothing (tests/bench/test_detection.py runs a small step of it).

    .venv/bin/python bench/detection.py [--quick] [--seed N] [--json] [--jobs N] [--day-step S]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Any

from detection_scenarios import report, static_rule
from detection_scenarios.execute import run_all
from detection_scenarios.scenarios import full_suite, quick_suite

from controller.config import DetectConfig


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few gross faults and a healthy hour (< 30 s)")
    parser.add_argument("--seed", type=int, default=1, help="seeds the fleets, fault placement and draws")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument(
        "--day-step",
        type=float,
        default=30.0,
        help="seconds between frames in the healthy day (default 30 keeps the run within minutes; "
        "10 is the agent's default interval)",
    )
    parser.add_argument("--day-nodes", type=int, default=4, help="nodes of the healthy day fleet")
    args = parser.parse_args(argv)
    if args.day_step <= 0 or args.jobs < 1 or args.day_nodes < 1:
        parser.error("--day-step must be > 0, --jobs and --day-nodes >= 1")
    began, cpu = time.perf_counter(), _cpu_seconds()
    suite = (
        quick_suite(args.seed)
        if args.quick
        else full_suite(args.seed, day_step=args.day_step, day_nodes=args.day_nodes)
    )
    baseline = static_rule.healthy_baseline(args.seed + 7919)
    runs = run_all(suite.scenarios, args.jobs)
    config = DetectConfig()
    meta: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "seed": args.seed,
        "jobs": args.jobs,
        "wall_seconds": round(time.perf_counter() - began, 1),
        "cpu_seconds": round(_cpu_seconds() - cpu, 1),
        "detector_config": (
            f"interval {config.interval_seconds:g} s, margin {config.margin:g}, "
            f"min_peers {config.min_peers}, defaults of controller/config.py"
        ),
    }
    result = report.build(runs, baseline, meta)
    print(json.dumps(result, indent=2) if args.json else report.text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
