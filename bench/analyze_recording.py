"""What `gpufleet analyze` costs over recordings of growing length: wall time, messages a second, CPU
(its process and its parsing workers) and the peak RSS of its process, reading through its reorder
window (the default) and, with --whole, holding the whole recording sorted in memory (as when lines
are out of order beyond the window, and as analyze did before it streamed).

Recordings are written here as `controller --record` writes them: each node's Hello, then a frame
from every node each round (10 s of receive time apart), the scale bench's 8-GPU frames
(controller_scale_load), one GPU throttled (THROTTLED), in the protobuf JSON mapping. Each analyze
runs in a child process (`controller.cli.analyze.analyze`, -o json); its RSS high-water mark (VmHWM)
is read while it runs.

Prints a table; asserts nothing (tests/bench/test_analyze_recording.py runs a small step of it).

    .venv/bin/python bench/analyze_recording.py [--nodes 100] [--rounds 10,40] [--whole] [--window N] [--gzip]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from controller_scale_load.templates import build_archetype, frame_message

from controller.cli.recording_file import REORDER_WINDOW
from controller.record_lines import Converter
from protos.gpufleet.v1 import operator_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb

ARCHETYPES = 16
# A fault for the findings to compare: from its third round on, this node's GPU 2 holds a thermal
# slowdown (the rest of the fleet is healthy).
THROTTLED, THROTTLED_GPU, THROTTLED_FROM = 3, 2, 3
START = 1_796_000_000.0
CHUNK = 256  # messages converted at once
ANALYZE = (
    "import sys; from controller.cli.analyze import analyze; "
    "window = None if sys.argv[2] == 'whole' else int(sys.argv[2]); "
    "sys.exit(analyze(sys.argv[1], 'json', window=window))"
)


def write_recording(path: Path, nodes: int, rounds: int) -> int:
    """A recording of `nodes` Hellos and `rounds` frames of each; the messages written."""
    archetypes = [build_archetype(i, ARCHETYPES, START, 10.0) for i in range(min(ARCHETYPES, nodes))]
    converter = Converter(2)
    written = 0
    try:
        with path.open("wb") as out:
            pending: list[operator_pb2.RecordedMessage] = []

            def emit(msg: operator_pb2.RecordedMessage, *, last: bool = False) -> None:
                pending.append(msg)
                if len(pending) >= CHUNK or last:
                    for chunk in converter.lines(pending, compressed=path.name.endswith(".gz")):
                        out.write(chunk)
                    pending.clear()

            for i in range(nodes):
                name, archetype = f"node-{i:05d}", archetypes[i % len(archetypes)]
                msg = operator_pb2.RecordedMessage(node=name)
                msg.received.FromNanoseconds(int((START + i * 1e-3) * 1e9))
                msg.message.hello.CopyFrom(archetype.hello)
                msg.message.hello.node, msg.message.hello.boot_id = name, "boot"
                emit(msg)
            for k in range(1, rounds + 1):
                for i in range(nodes):
                    name, archetype = f"node-{i:05d}", archetypes[i % len(archetypes)]
                    now = START + k * 10.0 + i * 1e-3
                    frame = pb.AgentMessage.FromString(
                        frame_message(archetype, name, "boot", seq=k, floor=0, now=now)
                    ).frame
                    if i == THROTTLED and k >= THROTTLED_FROM:
                        for gpu in frame.gpus:
                            if gpu.index == THROTTLED_GPU:
                                gpu.clock_event_reasons |= pb.CLOCK_EVENT_REASON_SW_THERMAL_SLOWDOWN
                    msg = operator_pb2.RecordedMessage(node=name)
                    msg.received.FromNanoseconds(int(now * 1e9))
                    msg.message.frame.CopyFrom(frame)
                    emit(msg, last=k == rounds and i == nodes - 1)
            written = nodes * (rounds + 1)
    finally:
        converter.close()
    return written


def _high_water_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def run_analyze(path: Path, window: int | None) -> dict[str, Any]:
    """One analyze of `path` in a child process: its figures and what it printed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", ANALYZE, str(path), "whole" if window is None else str(window)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    peak = 0
    while child.poll() is None:
        peak = max(peak, _high_water_kb(child.pid) or 0)
        time.sleep(0.05)
    out, err = child.communicate()
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if child.returncode != 0:
        raise SystemExit(f"analyze exited {child.returncode}: {err.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = [line for line in err.decode().splitlines() if " messages (" in line]
    return {
        "window": "whole" if window is None else window,
        "wall_s": wall,
        "cpu_s": cpu,  # its process and its workers (children it waited for)
        "peak_rss_mb": peak / 1024,
        "summary": summary[-1] if summary else "",
        "findings": json.loads(out)["findings"],
    }


def measure(
    nodes: int, rounds: list[int], windows: list[int | None], directory: Path, *, compressed: bool = False
) -> list[dict[str, Any]]:
    results = []
    for count in rounds:
        path = directory / f"rec-{nodes}x{count}.jsonl{'.gz' if compressed else ''}"
        messages = write_recording(path, nodes, count)
        size = path.stat().st_size
        runs = [run_analyze(path, window) for window in windows]
        for run in runs:
            run.update(
                nodes=nodes,
                rounds=count,
                compressed=compressed,
                messages=messages,
                file_mb=size / 1e6,
                messages_per_s=messages / run["wall_s"],
                rss_kb_per_message=run["peak_rss_mb"] * 1024 / messages,
                same_findings=run["findings"] == runs[0]["findings"],
            )
        path.unlink()
        results += runs
    return results


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{'messages':>9} {'file MB':>8} {'window':>7} {'wall s':>7} {'msgs/s':>7} {'CPU s':>7} "
        f"{'peak RSS MB':>11} {'KB/msg':>7}  same findings"
    ]
    for r in results:
        lines.append(
            f"{r['messages']:>9} {r['file_mb']:>8.0f} {r['window']!s:>7} {r['wall_s']:>7.1f} "
            f"{r['messages_per_s']:>7.0f} {r['cpu_s']:>7.1f} {r['peak_rss_mb']:>11.0f} "
            f"{r['rss_kb_per_message']:>7.1f}  {'yes' if r['same_findings'] else 'NO'}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument(
        "--rounds", default="10,40", help="recording lengths, in frames a node, comma separated"
    )
    parser.add_argument("--window", type=int, default=REORDER_WINDOW, help="analyze's reorder window")
    parser.add_argument("--whole", action="store_true", help="also analyze each holding it whole")
    parser.add_argument("--gzip", action="store_true", help="write the recordings gzip-compressed (.gz)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    windows: list[int | None] = [args.window, None] if args.whole else [args.window]
    with tempfile.TemporaryDirectory(prefix="gpufleet-analyze-") as tmp:
        rounds = [int(r) for r in args.rounds.split(",")]
        results = measure(args.nodes, rounds, windows, Path(tmp), compressed=args.gzip)
    for r in results:
        del r["findings"]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"analyze_recording: {os.cpu_count()} cores; {args.nodes} nodes, 8-GPU frames")
    print(table(results))
    for r in results:
        print(f"  {r['summary']}")


if __name__ == "__main__":
    main()
