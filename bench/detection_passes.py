"""How long a detection pass takes with K detection processes (detect.processes), on an idle
machine: a fleet of 8-GPU nodes built from the scale bench's frames (controller_scale_load), copied
into each pool's processes, then passes timed. Prints a table; asserts nothing
(tests/bench/test_detection_passes.py runs a small step of it).

    .venv/bin/python bench/detection_passes.py [--nodes 6000] [--processes 1,2] [--passes 3]

"copy s" is how long the processes took to get their copy of the fleet (sent in slices), "loop
stall s" the event loop's longest stall meanwhile (a 10 ms tick's lateness). A pass with K
processes takes about its longest share of the detectors, if K cores are free; the
scale bench shows it under load (--detect-processes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import time
from typing import Any

from controller_scale_load.built_fleet import build

from controller.config import DetectConfig
from controller.detect.base import discover
from controller.detection.pool import DetectionPool, share_out
from controller.fleet.model import Fleet
from controller.gc_policy import CollectorPolicy


async def timed(fleet: Fleet, now: float, processes: int, passes: int) -> dict[str, Any]:
    config = DetectConfig()
    names = config.enabled(sorted(discover()))
    pool = DetectionPool(config, names, processes)
    began = time.perf_counter()
    stop = asyncio.Event()
    collecting = asyncio.create_task(CollectorPolicy().run_forever(stop))  # as the controller does
    ticks = asyncio.create_task(_longest_stall())
    await pool.start(fleet)  # the processes' copies of the fleet, in slices (fleet_copy.py)
    copy_s = time.perf_counter() - began
    ticks.cancel()
    stall_s = await ticks
    stop.set()
    await collecting
    try:
        seconds = []
        for _ in range(passes + 1):  # the first shares the detectors out untimed: not counted
            began = time.perf_counter()
            report = await pool.run_pass(now)
            seconds.append(time.perf_counter() - began)
        parts = share_out(names, pool.durations, processes)
        shares = [sum(pool.durations[n] for n in part) for part in parts]
        return {
            "processes": processes,
            "copy_s": copy_s,
            "loop_stall_s": stall_s,
            "pass_s": min(seconds[1:]),
            "detectors_s": sum(pool.durations.values()),
            "longest_share_s": max(shares),
            "findings": len(report.findings),
        }
    finally:
        await pool.stop()


async def _longest_stall() -> float:
    """The event loop's longest stall (a 10 ms tick's lateness) until cancelled."""
    longest = 0.0
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            longest = max(longest, time.perf_counter() - before - 0.01)
    return longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=6000)
    parser.add_argument("--processes", default="1,2", help="pool sizes to time, comma separated")
    parser.add_argument("--passes", type=int, default=3, help="timed passes per pool (the best is shown)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(k) for k in args.processes.split(",")]
    began = time.perf_counter()
    fleet, now = build(args.nodes)
    built = time.perf_counter() - began
    gc.freeze()  # out of the automatic collections, as a running controller's fleet is (gc_policy.py)
    rows = [asyncio.run(timed(fleet, now, k, args.passes)) for k in sizes]
    if args.json:
        print(json.dumps({"nodes": args.nodes, "cores": os.cpu_count(), "rows": rows}))
        return
    print(f"detection_passes: {args.nodes} nodes (built in {built:.0f} s), {os.cpu_count()} cores")
    print("processes  copy s  loop stall s  pass s  detectors s  longest share s  findings")
    for row in rows:
        print(
            f"{row['processes']:>9}  {row['copy_s']:6.2f}  {row['loop_stall_s']:12.3f}  "
            f"{row['pass_s']:6.2f}  {row['detectors_s']:11.2f}  "
            f"{row['longest_share_s']:15.2f}  {row['findings']:8}"
        )


if __name__ == "__main__":
    main()
