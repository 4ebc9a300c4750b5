"""What each step of taking one frame in costs the controller's CPU, on the scale bench's frames (an
8-GPU node as the agent sends it, controller_scale_load/templates.py), timed alone on an idle
machine: the best of several repeats, in microseconds a frame. Prints a table; asserts nothing
(tests/bench/test_ingest_steps.py runs a small step of it).

    .venv/bin/python bench/ingest_steps.py [--cpus 32,224] [--per-cpu] [--per-link] [--number N] [--repeat N]

--cpus: the logical CPUs each frame's host has (a DGX H100 has 224). Its frames count them per
governor; with --per-cpu they carry one reading each, as agents before HostSample.cpu_governors
did; with --per-link each NVLink carries its traffic and peer bus id, as agents did before frames
left them out. The steps are those of controller/ingest.py on the event loop (or in an ingest
front): parse the message, check its times, screen its readings (fleet/plausible.py), the GPUs'
conditions (fleet/conditions.py), the whole plan (fleet/state.py plan_changes, which screens and
works out the conditions), the FrameWrite and its apply to the fleet, and the message to the
detection process (pickled). controller_scale.py shows them under load, with gRPC and the store
around them.

Those times are of one frame taken again and again, its node's state and the frame's parse warm in
the caches. Under load each frame is new and its node's state was last touched thousands of frames
ago: the second table (--nodes N, default 2,000) takes each node's next frame in turn over a fleet of
N nodes, every message parsed afresh, and times the same path with each step's CPU (thread time),
in microseconds a frame. It reads 2-3x the first; the controller's own steps under the scale bench's
load cost more again (bench/results/2026-12-02_ingest_in_server.txt).
"""

from __future__ import annotations

import argparse
import json
import time
import timeit
from collections.abc import Callable
from typing import Any

from controller_scale_load.templates import SIM_CPUS, add_older_agent_options, build_archetype, frame_message

from controller import ingest_checks
from controller.detection.wire import parts
from controller.fleet.conditions import update_held
from controller.fleet.model import Fleet
from controller.fleet.plausible import screen
from controller.fleet.state import apply_frame, apply_hello, plan_changes, write_of
from protos.gpufleet.v1 import telemetry_pb2 as pb

SKEW_SECONDS = 300.0  # the controller's default limits.max_clock_skew_seconds
ARCHETYPES = 16  # the fleet's nodes borrow frames from this many simulated nodes, as the scale bench's
FLEET_STEPS = ("parse", "checks", "plan", "write and apply", "to the detection process")


def steps(
    cpus: int, number: int, repeat: int, *, per_cpu: bool = False, per_link: bool = False
) -> dict[str, Any]:
    """Each step's best time over `repeat` runs of `number` calls, in microseconds a frame."""
    start = time.time() - 100.0
    archetype = build_archetype(0, 1, start, 10.0, cpus, per_cpu=per_cpu, per_link=per_link)
    now = time.time()
    raw = frame_message(archetype, "bench-0", "boot", seq=3, floor=0, now=now - 1.0)
    frame = pb.AgentMessage.FromString(raw).frame
    fleet = Fleet()
    node = apply_hello(fleet, pb.Hello(node="bench-0", boot_id="boot"), 0, now)
    plan = plan_changes(node, frame, now)  # the node holds its readings from here on, as under load
    apply_frame(fleet, write_of("bench-0", frame, plan), counters=False)
    data = frame.SerializeToString()
    timed: dict[str, Callable[[], object]] = {
        "parse": lambda: pb.AgentMessage.FromString(raw),
        "time checks": lambda: ingest_checks.frame_times(frame, now, SKEW_SECONDS),
        "screen": lambda: screen(frame),
        "conditions": lambda: [update_held({}, sample, now) for sample in frame.gpus],
        "plan (screen, conditions)": lambda: plan_changes(node, frame, now),
        "write and apply": lambda: apply_frame(fleet, write_of("bench-0", frame, plan), counters=False),
        "to the detection process": lambda: parts(("frame", "bench-0", plan, data)),
    }
    micros = {
        name: min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6
        for name, call in timed.items()
    }
    return {"cpus": cpus, "frame_bytes": len(raw), "us": micros}


def over_fleet(
    cpus: int, nodes: int, rounds: int, *, per_cpu: bool = False, per_link: bool = False
) -> dict[str, float]:
    """Each step's CPU (thread time) in microseconds a frame, taking each of `nodes` nodes' next frame
    in turn, `rounds` times over (after one round untimed), every message parsed afresh."""
    start = time.time() - 100.0
    archetypes = [
        build_archetype(i, ARCHETYPES, start, 10.0, cpus, per_cpu=per_cpu, per_link=per_link)
        for i in range(min(ARCHETYPES, nodes))
    ]
    now = time.time()
    fleet = Fleet()
    queue: list[tuple[Any, bytes]] = []
    for number in range(nodes):
        name, archetype = f"bench-{number:05d}", archetypes[number % len(archetypes)]
        node = apply_hello(fleet, pb.Hello(node=name, boot_id="boot"), 0, now)
        queue.append((node, frame_message(archetype, name, "boot", seq=2, floor=0, now=now - 1.0)))
    spent = dict.fromkeys(FLEET_STEPS, 0)
    clock = time.thread_time_ns
    for round_number in range(rounds + 1):
        for node, raw in queue:
            t0 = clock()
            frame = pb.AgentMessage.FromString(raw).frame
            t1 = clock()
            if len({gpu.index for gpu in frame.gpus}) != len(frame.gpus):
                raise AssertionError("a GPU index appears twice in the bench's frame")
            ingest_checks.frame_times(frame, now, SKEW_SECONDS)
            t2 = clock()
            plan = plan_changes(node, frame, now)
            t3 = clock()
            apply_frame(fleet, write_of(node.name, frame, plan), counters=False)
            t4 = clock()
            parts(("frame", node.name, plan, raw))
            t5 = clock()
            if round_number:  # the first round fills every node's state, as its first frames did
                for name, began, ended in zip(
                    FLEET_STEPS, (t0, t1, t2, t3, t4), (t1, t2, t3, t4, t5), strict=True
                ):
                    spent[name] += ended - began
    frames = nodes * rounds
    return {name: total / frames / 1e3 for name, total in spent.items()}


def table(results: list[dict[str, Any]]) -> str:
    names = list(results[0]["us"])
    width = max(map(len, names))
    lines = [f"{'step':<{width}}  " + "  ".join(f"{r['cpus']:>5} CPUs" for r in results)]
    lines.append(f"{'frame bytes':<{width}}  " + "  ".join(f"{r['frame_bytes']:>10}" for r in results))
    for name in names:
        lines.append(f"{name:<{width}}  " + "  ".join(f"{r['us'][name]:>7.1f} us" for r in results))
    fleets = [r["fleet"] for r in results if r.get("fleet")]
    if fleets:
        lines += ["", f"over a fleet of {fleets[0]['nodes']} nodes, each frame new (thread CPU time)"]
        for name in [*FLEET_STEPS, "total"]:
            lines.append(f"{name:<{width}}  " + "  ".join(f"{f['us'][name]:>7.1f} us" for f in fleets))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--cpus",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[SIM_CPUS, 224],
        help="logical CPUs a host has, comma separated (default: 32,224)",
    )
    add_older_agent_options(parser)
    parser.add_argument("--number", type=int, default=2000, help="calls a repeat")
    parser.add_argument(
        "--nodes", type=int, default=2000, help="the fleet the second table's frames rotate over (0: none)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds over that fleet")
    parser.add_argument("--repeat", type=int, default=7, help="repeats; the best is kept")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if not args.cpus or min(args.cpus) < 1 or args.number < 1 or args.repeat < 1:
        parser.error("--cpus must be >= 1 each, --number and --repeat >= 1")
    if args.nodes < 0 or args.rounds < 1:
        parser.error("--nodes must be >= 0 and --rounds >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = [
        steps(cpus, args.number, args.repeat, per_cpu=args.per_cpu, per_link=args.per_link)
        for cpus in args.cpus
    ]
    if args.nodes:
        for result in results:
            us = over_fleet(
                result["cpus"], args.nodes, args.rounds, per_cpu=args.per_cpu, per_link=args.per_link
            )
            result["fleet"] = {
                "nodes": args.nodes,
                "rounds": args.rounds,
                "us": {**us, "total": sum(us.values())},
            }
    print(json.dumps(results, indent=2) if args.json else table(results))


if __name__ == "__main__":
    main()
