"""How long a detection pass takes with K detection processes (detect.processes), on an idle
machine: a fleet of 8-GPU nodes built from the scale bench's frames (controller_scale_load), copied
into each pool's processes, then passes timed. Prints a table; asserts nothing
(tests/bench/test_detection_passes.py runs a small step of it).

    .venv/bin/python bench/detection_passes.py [--nodes 6000] [--processes 1,2] [--passes 3] [--fresh]
        [--hellos N]

"copy s" is how long the processes took to get their copy of the fleet (sent in slices), "loop
stall s" the event loop's longest stall meanwhile (a 10 ms tick's lateness). A pass with K
processes takes about its longest share of the detectors, if K cores are free; the
scale bench shows it under load (--detect-processes).

--fresh: before each pass every node sends its next frame, as under load at a 10 s cadence, so every
GPU is judged again (without it, passes find nothing new and judge next to nothing). This process
plans and applies each frame and sends it to the processes, as ingest does; "frames s" is how long
that took until the processes had applied them all, "pass s" the pass after.

--hellos N: before each pass N nodes (spread over the fleet) say Hello again, as agents restarted
on unchanged machines do (a new boot, the same inventory and probes): in a large fleet a few do
between nearly every two passes.
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

from controller_scale_load.built_fleet import BuiltFleet, build_fleet

from controller.config import DetectConfig
from controller.detect.base import discover
from controller.detection.pool import DetectionPool, share_out
from controller.fleet.state import apply_frame, apply_hello, plan_changes, write_of
from controller.gc_policy import CollectorPolicy
from protos.gpufleet.v1 import telemetry_pb2 as pb


async def timed(
    built: BuiltFleet, processes: int, passes: int, fresh: bool, hellos: int = 0
) -> dict[str, Any]:
    fleet = built.fleet
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
        seconds, applying = [], []
        for k in range(passes + 1):  # the first shares the detectors out untimed: not counted
            began = applied = time.perf_counter()
            if (fresh or hellos) and k > 0:
                if hellos:
                    _say_hello_again(built, pool, hellos, k)
                if fresh:
                    _send_next_frames(built, pool)
                # A pass of no detector: answered once each process has applied the frames before it.
                await asyncio.gather(*(p.run_pass(built.now, [], merged=False) for p in pool.processes))
                applied = time.perf_counter()
            report = await pool.run_pass(built.now + 1)
            seconds.append(time.perf_counter() - applied)
            applying.append(applied - began)
        parts = share_out(names, pool.durations, processes)
        shares = [sum(pool.durations[n] for n in part) for part in parts]
        return {
            "processes": processes,
            "fresh": fresh,
            "hellos": hellos,
            "copy_s": copy_s,
            "loop_stall_s": stall_s,
            "frames_s": min(applying[1:]),
            "pass_s": min(seconds[1:]),
            "detectors_s": sum(pool.durations.values()),
            "longest_share_s": max(shares),
            "findings": len(report.findings),
        }
    finally:
        await pool.stop()


def _send_next_frames(built: BuiltFleet, pool: DetectionPool) -> None:
    """Every node's next frame, planned and applied here (without the counters' trends, which the
    processes keep) and sent to the processes as ingest sends them (detection/changes.py)."""
    for name, frame in built.next_frames():
        plan = plan_changes(built.fleet.nodes[name], frame, built.now)
        apply_frame(built.fleet, write_of(name, frame, plan), counters=False)
        pool.frame(name, plan, frame.SerializeToString())


def _say_hello_again(built: BuiltFleet, pool: DetectionPool, count: int, round_: int) -> None:
    """`count` nodes, spread over the fleet, say Hello again as a restarted agent does (a new boot,
    its Hello otherwise the same), applied here and sent to the processes as ingest does."""
    names = list(built.fleet.nodes)
    step = max(1, len(names) // max(count, 1))
    for name in names[::step][:count]:
        hello = pb.Hello()
        hello.CopyFrom(built.fleet.nodes[name].hello)
        hello.boot_id = f"boot-{round_}"
        apply_hello(built.fleet, hello, 0, built.now)
        pool.hello(hello, 0, built.now)


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
    parser.add_argument("--fresh", action="store_true", help="every node sends a frame before each pass")
    parser.add_argument(
        "--hellos",
        type=int,
        default=0,
        help="nodes saying Hello again (restarted agents) before each pass",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(k) for k in args.processes.split(",")]
    began = time.perf_counter()
    fleet = build_fleet(args.nodes)
    built = time.perf_counter() - began
    gc.freeze()  # out of the automatic collections, as a running controller's fleet is (gc_policy.py)
    rows = [asyncio.run(timed(fleet, k, args.passes, args.fresh, args.hellos)) for k in sizes]
    if args.json:
        print(json.dumps({"nodes": args.nodes, "cores": os.cpu_count(), "rows": rows}))
        return
    fresh = ", every node a new frame before each pass" if args.fresh else ""
    if args.hellos:
        fresh += f", {args.hellos} nodes a new Hello before each pass"
    print(f"detection_passes: {args.nodes} nodes (built in {built:.0f} s), {os.cpu_count()} cores{fresh}")
    print("processes  copy s  loop stall s  frames s  pass s  detectors s  longest share s  findings")
    for row in rows:
        print(
            f"{row['processes']:>9}  {row['copy_s']:6.2f}  {row['loop_stall_s']:12.3f}  "
            f"{row['frames_s']:8.2f}  {row['pass_s']:6.2f}  {row['detectors_s']:11.2f}  "
            f"{row['longest_share_s']:15.2f}  {row['findings']:8}"
        )


if __name__ == "__main__":
    main()
