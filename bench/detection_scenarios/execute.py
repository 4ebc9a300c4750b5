"""Run a suite's scenarios, in worker processes when asked, reporting progress on stderr."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from detection_scenarios.drive import Run, run
from detection_scenarios.scenarios import Scenario


def _describe(s: Scenario) -> str:
    hours = s.seconds / 3600.0
    return f"{s.name} ({len(s.models)} nodes, {hours:.1f} h at {s.step:g} s, {len(s.injections)} faults)"


def run_all(scenarios: list[Scenario], jobs: int = 1, *, progress: bool = True) -> list[Run]:
    """Every scenario's Run, in the suite's order. The longest go first, so workers finish together."""
    began = time.perf_counter()
    done: dict[str, Run] = {}

    def report(result: Run) -> None:
        done[result.scenario.name] = result
        if progress:
            print(
                f"[{len(done)}/{len(scenarios)}] {_describe(result.scenario)}: {result.wall_seconds:.1f} s "
                f"({time.perf_counter() - began:.0f} s so far)",
                file=sys.stderr,
                flush=True,
            )

    order = sorted(scenarios, key=lambda s: -len(s.models) * s.seconds / s.step)
    if jobs <= 1:
        for scenario in order:
            report(run(scenario))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run, scenario) for scenario in order]
            for future in as_completed(futures):
                report(future.result())
    return [done[s.name] for s in scenarios]
