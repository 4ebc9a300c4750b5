"""How often each GPM metric comes back empty, by the time between two reads, idle and under load.

GPM metrics are computed between two samples (agent/sources/nvml/gpm.py); on a lent H200 (driver
580.159.04) NVML returned DRAM bandwidth as NaN, which the source leaves empty. This reads the
agent's own NvmlSource (GPM on) at each interval in turn, a fresh source per interval (its first
read only primes the samples), and prints per metric the share of reads left empty and the range of
the values read, with the GPU idle or busy with a load this script starts:

    python bench/gpm_intervals.py [--intervals 0.03,0.5,2,5] [--reads 8] [--load none|gemm|copy]

`gemm` is a bf16 8192^3 torch.matmul loop (compute-bound: tensor activity high, DRAM low); `copy` a
device-to-device copy of 4 GiB buffers (memory-bound: DRAM activity high). The load runs in a child
process on GPU 0 for the whole run. Read-only: it changes no setting of any GPU. Asserts nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.sources.errors import SourceError
from agent.sources.nvml.gpm import METRICS
from agent.sources.nvml.source import NvmlSource

NVML_UNAVAILABLE = 3
LOADS = {
    "gemm": "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); b = torch.randn_like(a)\n"
    "step = lambda: torch.matmul(a, b)",
    "copy": "a = torch.empty(2**30, device='cuda', dtype=torch.float32); b = torch.empty_like(a)\n"
    "step = lambda: b.copy_(a)",
}
LOAD_LOOP = """
import sys, time, torch
{setup}
print("ready", flush=True)
n = 0
while True:
    step(); n += 1
    if n % 20 == 0:
        torch.cuda.synchronize()
"""


@dataclass
class Tally:
    reads: int = 0
    empty: dict[str, int] = field(default_factory=dict)
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, metric: str, value: float | None) -> None:
        if value is None:
            self.empty[metric] = self.empty.get(metric, 0) + 1
        else:
            self.values.setdefault(metric, []).append(value)


def measure(interval: float, reads: int, pause: Callable[[float], None] = time.sleep) -> Tally:
    """`reads` reads of GPU 0's GPM metrics, `interval` seconds apart, after the priming one."""
    tally = Tally()
    # No minimum window: the point is what NVML answers over each interval, the shortest included.
    with NvmlSource(xid_events=False, gpm=True, gpm_min_window_s=0.0) as source:
        source.read()  # primes the GPM samples: its metrics are empty by design
        for _ in range(reads):
            pause(interval)
            reading = next((r for r in source.read() if r.index == 0), None)
            if reading is None:
                continue
            tally.reads += 1
            for name, _ in METRICS:
                tally.add(name, getattr(reading, name))
    return tally


def start_load(kind: str) -> subprocess.Popen[str] | None:
    if kind == "none":
        return None
    child = subprocess.Popen(
        [sys.executable, "-c", LOAD_LOOP.format(setup=LOADS[kind])], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        child.kill()
        raise RuntimeError(f"the {kind} load did not start (rc {child.wait()})")
    time.sleep(1.0)  # past its first calls: clocks up, the loop steady
    return child


def report(interval: float, tally: Tally) -> list[str]:
    lines = []
    for name, _ in METRICS:
        empty = tally.empty.get(name, 0)
        values = tally.values.get(name, [])
        seen = f"{min(values):.3f}..{max(values):.3f}" if values else "-"
        lines.append(f"  {interval:>8g} s  {name:<28} empty {empty:>3} of {tally.reads:<3}  values {seen}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--intervals", default="0.03,0.5,2,5", help="seconds between reads, comma separated")
    parser.add_argument("--reads", type=int, default=8, help="reads per interval, after the priming one")
    parser.add_argument("--load", choices=("none", *LOADS), default="none")
    args = parser.parse_args(argv)
    intervals = [float(x) for x in args.intervals.split(",") if x.strip()]
    if args.reads < 1 or not intervals or min(intervals) <= 0:
        print("gpm_intervals: need --reads >= 1 and intervals > 0", file=sys.stderr)
        return 2
    try:
        NvmlSource(xid_events=False, gpm=False).close()
    except SourceError as exc:
        print(f"gpm_intervals: {exc}", file=sys.stderr)
        return NVML_UNAVAILABLE
    load = start_load(args.load)
    try:
        print(f"gpm_intervals: GPU 0, load {args.load}, {args.reads} reads per interval")
        for interval in intervals:
            print("\n".join(report(interval, measure(interval, args.reads))), flush=True)
    finally:
        if load is not None:
            load.kill()
            load.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
