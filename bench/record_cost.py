"""What recording the fleet (`controller --record FILE`, controller/recording.py FileSink) costs the
controller, with its JSON lines made on its own thread (--workers 0, as before) and in worker
processes (controller/record_lines.py, 2 by default). Frames are the scale bench's 8-GPU frames.

1. Drain: N frames queued, then written: frames a second, and the CPU per frame in the controller's
   process and in the workers.
2. Beside a busy event loop: a stand-in loop (parse a frame, over and over, for 2 ms, then sleep
   2 ms: half a core, as a controller under load) while frames are offered at R a second for S
   seconds: the loop's work done (parses a second), how late its wake-ups were (p50, p99) and the
   frames written and lost. On a machine with fewer free cores than workers + 1 they compete with
   the loop for CPU (not for the interpreter).

Prints a table; asserts nothing (tests/bench/test_record_cost.py runs a small step of it).

    .venv/bin/python bench/record_cost.py [--frames 2000] [--rates 300,600] [--seconds 8] [--workers 0,2]
        [--gzip]  (--gzip: the drain's recording named .gz, its batches gzip members)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import threading
import time
from typing import Any

from controller_scale_load.templates import build_archetype, frame_message

from controller.record_lines import Converter
from controller.recording import Accepted, FileSink
from protos.gpufleet.v1 import telemetry_pb2 as pb

BURST, REST = 0.002, 0.002  # the stand-in loop's duty cycle
RECEIVED = 1_796_000_000.25  # the drain's frames' receive time


def sample_frame() -> pb.TelemetryFrame:
    archetype = build_archetype(0, 1, time.time(), 10.0)
    msg = pb.AgentMessage()
    msg.ParseFromString(frame_message(archetype, "node-0001", "boot", seq=5, floor=0, now=time.time()))
    return msg.frame


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def drain(
    frame: pb.TelemetryFrame, frames: int, workers: int, directory: str, suffix: str = ".jsonl"
) -> dict[str, Any]:
    path = os.path.join(directory, f"drain-{workers}{suffix}")
    sink = FileSink(path, maxsize=frames + 1, converter=Converter(workers))
    received = RECEIVED  # one time for every frame: every run writes the same lines
    for _ in range(frames):
        sink.offer(Accepted(received, frame.node, frame=frame))
    children, cpu, start = _children_cpu(), time.process_time(), time.perf_counter()
    sink.start()
    sink.close(timeout=3600)
    wall = time.perf_counter() - start
    return {
        "workers": workers,
        "frames_per_s": round(sink.written / wall),
        "process_ms_per_frame": round((time.process_time() - cpu) / frames * 1e3, 3),
        "workers_ms_per_frame": round((_children_cpu() - children) / frames * 1e3, 3),
        "bytes_per_frame": os.path.getsize(path) // frames,
        "written": sink.written,
    }


def _busy_loop(frame: pb.TelemetryFrame, seconds: float) -> tuple[int, list[float]]:
    raw, parses, late = frame.SerializeToString(), 0, []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        burst = time.perf_counter() + BURST
        while time.perf_counter() < burst:
            pb.TelemetryFrame.FromString(raw)
            parses += 1
        asleep = time.perf_counter()
        time.sleep(REST)
        late.append(time.perf_counter() - asleep - REST)
    return parses, late


def beside_loop(
    frame: pb.TelemetryFrame, rate: float, seconds: float, workers: int | None, directory: str
) -> dict[str, Any]:
    """The stand-in loop for `seconds`, with frames offered at `rate` to a sink (none: workers None)."""
    sink = None
    if workers is not None:
        sink = FileSink(os.path.join(directory, f"loop-{workers}-{rate}.jsonl"), converter=Converter(workers))
        sink.start()

    def offer() -> None:
        assert sink is not None
        start, k = time.perf_counter(), 0
        while time.perf_counter() < start + seconds:
            sink.offer(Accepted(time.time(), frame.node, frame=frame))
            k += 1
            time.sleep(max(0.0, start + k / rate - time.perf_counter()))

    feeder = threading.Thread(target=offer, daemon=True)
    if sink is not None:
        feeder.start()
    parses, late = _busy_loop(frame, seconds)
    late.sort()
    result: dict[str, Any] = {
        "workers": "no recording" if workers is None else workers,
        "rate": rate if sink is not None else 0,
        "loop_parses_per_s": round(parses / seconds),
        "late_p50_ms": round(statistics.median(late) * 1e3, 2),
        "late_p99_ms": round(late[int(len(late) * 0.99)] * 1e3, 2),
    }
    if sink is not None:
        feeder.join()
        written_in_time = sink.written
        sink.close(timeout=120)
        result.update(
            frames_per_s=round(written_in_time / seconds), written=sink.written, dropped=sink.dropped
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=2000, help="frames the drain writes")
    parser.add_argument("--rates", default="300,600", help="frames a second offered beside the loop")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long each run beside the loop lasts")
    parser.add_argument("--workers", default="0,2", help="converter workers to compare (0: on the thread)")
    parser.add_argument("--gzip", action="store_true", help="the drain's recordings gzip-compressed (.gz)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    suffix = ".jsonl.gz" if args.gzip else ".jsonl"
    frame = sample_frame()
    workers = [int(w) for w in args.workers.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        drains = [drain(frame, args.frames, w, directory, suffix) for w in workers]
        loops = [beside_loop(frame, 0, args.seconds, None, directory)]
        loops += [beside_loop(frame, r, args.seconds, w, directory) for r in rates for w in workers]
    if args.json:
        print(json.dumps({"drain": drains, "beside_loop": loops}))
        return 0
    print(
        f"drain of {args.frames} queued frames ({drains[0]['bytes_per_frame']} bytes each on disk, {suffix}):"
    )
    print(f"  {'workers':>8} {'frames/s':>9} {'ms CPU a frame, here':>21} {'in workers':>11}")
    for d in drains:
        print(
            f"  {d['workers']:>8} {d['frames_per_s']:>9} {d['process_ms_per_frame']:>21.3f} "
            f"{d['workers_ms_per_frame']:>11.3f}"
        )
    print(
        f"beside a loop busy {BURST * 1e3:.0f} ms of every {(BURST + REST) * 1e3:.0f}, "
        f"{args.seconds:.0f} s each:"
    )
    print(
        f"  {'workers':>12} {'offered/s':>9} {'loop parses/s':>14} {'late p50 ms':>12} {'p99 ms':>7} "
        f"{'written/s':>10}"
    )
    for r in loops:
        print(
            f"  {r['workers']:>12} {r['rate']:>9.0f} {r['loop_parses_per_s']:>14} {r['late_p50_ms']:>12.2f} "
            f"{r['late_p99_ms']:>7.2f} {r.get('frames_per_s', '-'):>10}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
