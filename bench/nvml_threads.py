"""NVML from two threads at once, as the agent reads it during a probe round: does the process survive?

The agent's sampling loop keeps one NvmlSource and reads it every cycle; a probe round opens the
probe runner's own (complete reads: every slow query), reads it a few times and closes it, in
another thread. This runs both, much faster than deployed (`--period`, default 10 ms), for
`--seconds`, and prints the reads made and any reading that came back NaN or infinite. A crash in
libnvidia-ml ends the process (rc -11 / 139: SIGSEGV; PYTHONFAULTHANDLER=1 prints where).

    python bench/nvml_threads.py [--seconds 15] [--period 0.01] [--runner-gpm] [--no-gpm]

`--runner-gpm` gives the runner's source GPM too (as before 2026-12-04, when two threads in
nvmlGpmMetricsGet crashed an H200's driver 580.159.04 every time: see
bench/results/2026-12-04_h200_gpm_threads.txt); `--no-gpm` turns GPM off in both. Read-only: it
changes no setting of any GPU. Asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from dataclasses import fields
from typing import Any

from agent.compose.probes import open_nvml
from agent.sources.errors import SourceError
from agent.sources.gpu import GpuReading
from agent.sources.nvml.source import NvmlSource

NVML_UNAVAILABLE = 3


class Tally:
    def __init__(self) -> None:
        self.reads = {"loop": 0, "runner": 0, "runner_opens": 0}
        self.non_finite: dict[str, int] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def readings(self, who: str, readings: list[GpuReading]) -> None:
        bad = [
            f.name
            for r in readings
            for f in fields(r)
            if isinstance(v := getattr(r, f.name), float) and not math.isfinite(v)
        ]
        with self._lock:
            self.reads[who] += 1
            for name in bad:
                self.non_finite[name] = self.non_finite.get(name, 0) + 1


def run(seconds: float, period: float, runner_gpm: bool, gpm: bool) -> Tally:
    tally = Tally()
    stop = time.monotonic() + seconds
    started = threading.Barrier(2)

    def loop() -> None:
        with NvmlSource(xid_events=False, gpm=gpm) as source:
            started.wait()
            while time.monotonic() < stop:
                tally.readings("loop", source.read())
                time.sleep(period)

    def runner() -> None:
        started.wait()
        while time.monotonic() < stop:
            if runner_gpm and gpm:
                source: Any = NvmlSource(slow_every=1, xid_events=False, gpm=True)
            else:
                source = open_nvml(complete=True)  # as the agent's probe runner opens it
            tally.reads["runner_opens"] += 1
            try:
                for _ in range(3):
                    tally.readings("runner", source.read())
                    time.sleep(period / 3)
            finally:
                source.close()

    def guarded(target: Any) -> Any:
        def body() -> None:
            try:
                target()
            except Exception as exc:  # noqa: BLE001 - reported, and the other thread ends by the clock
                tally.errors.append(f"{target.__name__}: {exc}")
                started.abort()

        return body

    threads = [threading.Thread(target=guarded(t), name=t.__name__) for t in (loop, runner)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--period", type=float, default=0.01, help="seconds between the loop's reads")
    parser.add_argument("--runner-gpm", action="store_true", help="the runner's source reads GPM too")
    parser.add_argument("--no-gpm", action="store_true", help="no GPM in either source")
    args = parser.parse_args(argv)
    try:
        NvmlSource(xid_events=False, gpm=False).close()
    except SourceError as exc:
        print(f"nvml_threads: {exc}", file=sys.stderr)
        return NVML_UNAVAILABLE
    gpm = not args.no_gpm
    tally = run(args.seconds, args.period, args.runner_gpm, gpm)
    mode = "no GPM" if not gpm else "GPM in both sources" if args.runner_gpm else "GPM in the loop's source"
    print(f"nvml_threads: {args.seconds:g} s, a loop read every {args.period:g} s, {mode}")
    print(f"  reads: {tally.reads}")
    print(f"  non-finite readings: {tally.non_finite or 'none'}")
    print(f"  errors: {tally.errors or 'none'}")
    return 1 if tally.errors else 0


if __name__ == "__main__":
    sys.exit(main())
