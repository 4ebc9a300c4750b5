"""What one agent collection cycle costs: wall and CPU time, RSS, NVML calls, frame size.

Builds the agent as `gpufleet agent` does (agent.config.load, agent.compose.sources.build_sources, the host
source, agent.daemon.Agent) and runs N cycles of Agent.sample() plus the frame the stream would
send (agent.stream.frames.frame, serialised). Probes are not run and nothing is spooled or sent,
so the figures are the collection path alone. Prints figures and a verdict against each budget;
asserts nothing.

    .venv/bin/python bench/agent_collect.py [--source auto|sim|nvml|both] [--cycles 60]
        [--interval SECONDS] [--config FILE] [--json] [--save [DIR]]

Budget for an 8-GPU node at a 10 s interval: under 1% of one core on average, flat RSS over an
hour, under 150 MB RSS without probes. Back to back (--interval 0, the default) gives the cost per
cycle and RSS growth per 1000 cycles; `--cycles 360 --interval 10` is an hour as deployed.
With more than one source, each runs in its own process so that each RSS is the agent's alone.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import statistics
import subprocess
import sys
import time
from array import array
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from agent.compose.sources import build_sources
from agent.config import ConfigError, load
from agent.daemon import Agent
from agent.sources.errors import SourceError
from agent.stream import frames

REFERENCE_INTERVAL_S = 10.0  # the default sampling interval the budgets are stated for
CYCLES_PER_HOUR = int(3600 / REFERENCE_INTERVAL_S)
BUDGET_CPU_SHARE = 0.01  # of one core
BUDGET_RSS_BYTES = 150_000_000
# "Flat" RSS: an hour at 10 s may add at most this. A slow leak of 2 MB/h is ~50 MB a day, which
# would break the RSS budget within days; a single allocator arena (1 MiB) stays under it.
BUDGET_RSS_GROWTH_PER_HOUR_BYTES = 2_000_000
MB = 1_000_000
RESULTS = Path(__file__).resolve().parent / "results"
NVML_UNAVAILABLE = 3  # exit status of a --source nvml run where NVML does not initialise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--source",
        choices=["auto", "sim", "nvml", "both"],
        default="auto",
        help="auto (default): the simulated 8-GPU node, plus NVML where it initialises",
    )
    parser.add_argument("--cycles", type=int, default=60, help="measured cycles (after 1 warm-up)")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.0,
        help="seconds from one cycle start to the next (0: back to back)",
    )
    parser.add_argument("--config", metavar="FILE", help="agent YAML config (default: built-in defaults)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    parser.add_argument(
        "--save",
        nargs="?",
        const=str(RESULTS),
        metavar="DIR",
        help=f"also write the JSON to DIR/<date>_<gpu>_agent_collect.json (default DIR: {RESULTS})",
    )
    return parser


def summary(values: list[float]) -> dict[str, float]:
    """Mean, nearest-rank p50 and p99, and max of `values` (all 0.0 when empty)."""
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return {"mean": statistics.fmean(ordered), "p50": rank(0.50), "p99": rank(0.99), "max": ordered[-1]}


def nvml_calls(source: object) -> int | None:
    """The source's running count of NVML library calls; None where it keeps none (the simulator)."""
    calls = getattr(source, "calls", None)
    return calls if isinstance(calls, int) else None


class _Series:
    """Per-cycle figures, preallocated: recording them must not grow the RSS being measured."""

    def __init__(self, cycles: int) -> None:
        self.wall_ms = array("d", [0.0]) * cycles
        self.sample_ms = array("d", [0.0]) * cycles
        self.encode_ms = array("d", [0.0]) * cycles
        self.cpu_ms = array("d", [0.0]) * cycles
        self.calls = array("q", [-1]) * cycles  # -1: the source counts no NVML calls
        self.frame_bytes = array("q", [0]) * cycles
        self.rss = array("q", [0]) * cycles
        self.failed = 0
        self.errors: set[str] = set()


def _cycle(agent: Agent, seq: int) -> tuple[float, float, float, int, int | None, list[str]]:
    """One cycle as the streaming agent runs it: (sample s, frame s, cpu s, bytes, nvml calls, errors)."""
    calls_before = nvml_calls(agent.gpu)
    cpu0, t0 = time.process_time(), time.perf_counter()
    snapshot = agent.sample()
    t1 = time.perf_counter()
    size = len(frames.frame(snapshot, agent.boot_id, seq).SerializeToString())
    t2, cpu1 = time.perf_counter(), time.process_time()
    calls_after = nvml_calls(agent.gpu)
    calls = calls_after - calls_before if calls_before is not None and calls_after is not None else None
    errors = [f"{s.name}: {s.error}" for s in snapshot.collectors.values() if not s.success]
    return t1 - t0, t2 - t1, cpu1 - cpu0, size, calls, errors


def measure(source: str, config_path: str | None, cycles: int, interval: float) -> dict[str, Any]:
    """Build the agent on `source` and time `cycles` collection cycles after one warm-up cycle.

    Raises SourceError (or ValueError) where the source cannot start, ConfigError for a bad config.
    """
    process = psutil.Process()
    series = _Series(cycles)
    rss_start = process.memory_info().rss
    config = load(config_path, {"source": source})
    gpu, host, probes = build_sources(config)
    agent = Agent(config, gpu, host, probes)
    try:
        calls_at_start = nvml_calls(gpu)
        _cycle(agent, 0)  # warm-up: first-use costs (lazy imports, caches) are not the steady state
        rss_warm = process.memory_info().rss
        cpu_run0, wall_run0 = time.process_time(), time.monotonic()
        for i in range(cycles):
            if interval > 0 and i > 0:
                time.sleep(max(0.0, wall_run0 + i * interval - time.monotonic()))
            sample_s, encode_s, cpu_s, size, calls, errors = _cycle(agent, i + 1)
            series.sample_ms[i], series.encode_ms[i] = sample_s * 1e3, encode_s * 1e3
            series.wall_ms[i], series.cpu_ms[i] = (sample_s + encode_s) * 1e3, cpu_s * 1e3
            series.frame_bytes[i], series.calls[i] = size, -1 if calls is None else calls
            if errors:
                series.failed += 1
                series.errors.update(errors)
            series.rss[i] = process.memory_info().rss
        cpu_run, wall_run = time.process_time() - cpu_run0, time.monotonic() - wall_run0
    finally:
        agent.close()
    result = _result(agent, series, interval, wall_run, cpu_run, rss_warm=rss_warm)
    result["rss_bytes"]["start"] = rss_start
    result["nvml_calls_at_start"] = calls_at_start
    return result


def _result(
    agent: Agent, series: _Series, interval: float, wall_run: float, cpu_run: float, *, rss_warm: int
) -> dict[str, Any]:
    cycles = len(series.rss)
    # The RSS trend is fitted over the second half: the allocator settles over the first few
    # thousand cycles (about 1 MB on the simulator), then stays flat; a leak keeps the slope up.
    half = series.rss[cycles // 2 :]
    slope = statistics.linear_regression(range(len(half)), half).slope if len(half) >= 2 else 0.0
    rss_end = series.rss[-1]
    growth_run = rss_end - rss_warm
    cpu = summary(list(series.cpu_ms))
    share_implied = cpu["mean"] / (REFERENCE_INTERVAL_S * 1e3)
    # Everything the process burnt over the run (threads and between-cycle work included) per second
    # of wall time: the real share when cycles are spaced as deployed.
    share_measured = cpu_run / wall_run if interval > 0 and wall_run > 0 else None
    growth_hour = slope * CYCLES_PER_HOUR
    calls = [float(c) for c in series.calls if c >= 0]
    verdicts = {
        "cpu": _verdict(share_implied < BUDGET_CPU_SHARE),
        "rss": _verdict(rss_end < BUDGET_RSS_BYTES),
        "rss_flat": _verdict(max(growth_hour, growth_run) < BUDGET_RSS_GROWTH_PER_HOUR_BYTES),
    }
    if share_measured is not None:
        verdicts["cpu_measured"] = _verdict(share_measured < BUDGET_CPU_SHARE)
    return {
        "source": agent.inventory.source,
        "gpus": len(agent.inventory.gpus),
        "gpu_name": ", ".join(sorted({info.name for info in agent.inventory.gpus})),
        "driver_version": agent.inventory.driver_version,
        "collectors": [c.name for c in agent.collectors],
        "cycles": cycles,
        "interval_s": interval,
        "run_wall_s": wall_run,
        "wall_ms": summary(list(series.wall_ms)),
        "sample_ms": summary(list(series.sample_ms)),
        "encode_ms": summary(list(series.encode_ms)),
        "cpu_ms": cpu,
        "cpu_share_of_core_at_10s": share_implied,
        "cpu_share_measured": share_measured,
        "rss_bytes": {"after_warmup": rss_warm, "end": rss_end},
        "rss_growth_bytes": growth_run,
        "rss_growth_per_1000_cycles_bytes": slope * 1000,
        "rss_growth_per_hour_at_10s_bytes": growth_hour,
        "nvml_calls_per_cycle": summary(calls) if calls else None,
        "frame_bytes": summary([float(b) for b in series.frame_bytes]),
        "failed_cycles": series.failed,
        "errors": sorted(series.errors)[:10],
        "verdicts": verdicts,
    }


def _verdict(ok: bool) -> str:
    return "within" if ok else "over"


def run_isolated(source: str, args: argparse.Namespace) -> tuple[dict[str, Any] | None, int, str]:
    """Measure `source` in a fresh process: (its run, 0, "") or (None, exit status, why it failed)."""
    command = [sys.executable, __file__, "--source", source, "--json"]
    command += ["--cycles", str(args.cycles), "--interval", str(args.interval)]
    if args.config:
        command += ["--config", args.config]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        why = lines[-1].removeprefix("agent_collect: ") if lines else f"exit status {done.returncode}"
        return None, done.returncode, why
    runs: list[dict[str, Any]] = json.loads(done.stdout)["runs"]
    return runs[0], 0, ""


def _ms(s: dict[str, float]) -> str:
    return f"mean {s['mean']:.3f}  p50 {s['p50']:.3f}  p99 {s['p99']:.3f}  max {s['max']:.3f} ms"


def _mb(value: float) -> str:
    return f"{value / MB:+.3f} MB" if value < 0 or value > 0 else "+0 MB"


def report(run: dict[str, Any]) -> str:
    """The human-readable figures of one run."""
    pace = "back to back" if run["interval_s"] == 0 else f"every {run['interval_s']:g} s"
    v = run["verdicts"]
    rss = run["rss_bytes"]
    calls = run["nvml_calls_per_cycle"]
    frame = run["frame_bytes"]
    lines = [
        f"{run['source']}: {run['gpus']} x {run['gpu_name'] or '?'}, {run['cycles']} cycles {pace} "
        f"(after 1 warm-up), {run['run_wall_s']:.1f} s, collectors {', '.join(run['collectors'])}",
        f"  wall per cycle    {_ms(run['wall_ms'])}",
        f"    of which sample {_ms(run['sample_ms'])}",
        f"    and frame       {_ms(run['encode_ms'])}",
        f"  cpu per cycle     {_ms(run['cpu_ms'])}",
        f"  cpu share of one core at a 10 s interval: {run['cpu_share_of_core_at_10s']:.4%} "
        f"(budget < {BUDGET_CPU_SHARE:.0%}: {v['cpu']})",
    ]
    if run["cpu_share_measured"] is not None:
        lines.append(
            f"  cpu share measured over the run at {run['interval_s']:g} s: "
            f"{run['cpu_share_measured']:.4%} (budget < {BUDGET_CPU_SHARE:.0%}: {v['cpu_measured']})"
        )
    lines += [
        f"  rss               start {rss['start'] / MB:.1f} MB, "
        f"after warm-up {rss['after_warmup'] / MB:.1f} MB, end {rss['end'] / MB:.1f} MB "
        f"(budget < {BUDGET_RSS_BYTES / MB:.0f} MB: {v['rss']})",
        f"  rss growth        {_mb(run['rss_growth_bytes'])} over the run, "
        f"{_mb(run['rss_growth_per_1000_cycles_bytes'])} per 1000 cycles (fitted over the 2nd half), "
        f"{_mb(run['rss_growth_per_hour_at_10s_bytes'])} per hour at 10 s "
        f"(flat: budget < {BUDGET_RSS_GROWTH_PER_HOUR_BYTES / MB:.0f} MB per hour and over the run: "
        f"{v['rss_flat']}{'; under 1000 cycles the fit is rough' if run['cycles'] < 1000 else ''})",
        "  nvml calls/cycle  "
        + (
            f"mean {calls['mean']:.1f}  p50 {calls['p50']:.0f}  max {calls['max']:.0f} "
            f"({run['nvml_calls_at_start']} to start)"
            if calls
            else "n/a"
        ),
        f"  frame bytes       mean {frame['mean']:.0f}  max {frame['max']:.0f} (serialised TelemetryFrame)",
        f"  failed cycles     {run['failed_cycles']} of {run['cycles']}",
    ]
    lines += [f"    {error}" for error in run["errors"]]
    return "\n".join(lines)


def _sources(choice: str) -> list[str]:
    return {"auto": ["sim", "nvml"], "both": ["sim", "nvml"]}.get(choice, [choice])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cycles < 1 or args.interval < 0:
        print("agent_collect: need --cycles >= 1 and --interval >= 0", file=sys.stderr)
        return 2
    runs: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    sources = _sources(args.source)
    if len(sources) == 1:
        try:
            runs.append(measure(sources[0], args.config, args.cycles, args.interval))
        except ConfigError as exc:
            print(f"agent_collect: {exc}", file=sys.stderr)
            return 2
        except (SourceError, ValueError) as exc:
            print(f"agent_collect: {sources[0]} cannot start: {exc}", file=sys.stderr)
            return NVML_UNAVAILABLE if sources[0] == "nvml" else 1
    else:
        for source in sources:
            run, status, why = run_isolated(source, args)
            if run is None:
                if args.source == "both" or status != NVML_UNAVAILABLE:
                    print(f"agent_collect: {source}: {why}", file=sys.stderr)
                    return 1
                skipped[source] = why
            else:
                runs.append(run)
    date = datetime.now(UTC).isoformat(timespec="seconds")
    document: dict[str, Any] = {
        "bench": "agent_collect",
        "date": date,
        "host": platform.node(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "budgets": {
            "cpu_share_of_core": BUDGET_CPU_SHARE,
            "rss_bytes": BUDGET_RSS_BYTES,
            "rss_growth_per_hour_bytes": BUDGET_RSS_GROWTH_PER_HOUR_BYTES,
            "reference_interval_s": REFERENCE_INTERVAL_S,
        },
        "runs": runs,
        "skipped": skipped,
    }
    text = json.dumps(document, indent=2, sort_keys=True, allow_nan=False)
    if args.json:
        print(text)
    else:
        print(f"agent_collect on {document['host']} ({document['cpu_model'] or 'cpu ?'}), {date}")
        for run in runs:
            print(report(run))
        for source, why in skipped.items():
            print(f"{source}: skipped ({why})")
    if args.save:
        path = Path(args.save) / f"{date[:10]}_{_slug(runs)}_agent_collect.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
        print(f"saved {path}", file=sys.stderr)
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _slug(runs: list[dict[str, Any]]) -> str:
    """The real GPU's name for a file name ("nvidia-h100-80gb-hbm3"), else "sim"."""
    real = [r["gpu_name"] for r in runs if r["source"] != "sim" and r["gpu_name"]]
    return re.sub(r"[^a-z0-9]+", "-", real[0].lower()).strip("-") if real else "sim"


if __name__ == "__main__":
    sys.exit(main())
