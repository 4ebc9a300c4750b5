"""Several detection processes (`detect.processes: K`), each with a copy of the fleet fed every
change, sharing out each pass's detectors: a pass then takes about the longest share's time, not
the sum, and each process has its copy's upkeep and 1/K of the detectors' CPU. At 12,500 nodes one
process spends about as long applying frames as running passes (issue 17).

Each pass's detectors are shared out by how long each took in the last pass (longest first, onto
the least loaded process), so a costly detector gets a process to itself. The processes answer
each detector's findings apart; the controller concatenates them in the detectors' order and
merges them there, so a pass reports exactly what one process running every detector would.

A pass fails (DetectionUnavailable) if any process fails it: a partial report would resolve the
missing detectors' findings. The next pass starts again the processes that are gone, from the
controller's fleet as it is then; the others keep theirs. Each costs about as much memory as the
fleet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from controller.config import DetectConfig
from controller.detect.runner import PassReport, merge
from controller.detection.changes import FleetChanges
from controller.detection.fleet_copy import send_fleet
from controller.detection.process import DetectionProcess, DetectionUnavailable
from controller.detection.wire import parts
from controller.fleet.model import Fleet


def share_out(names: Sequence[str], durations: dict[str, float], count: int) -> list[list[str]]:
    """`names` in `count` parts of about equal total duration (a name not timed yet counts as the
    mean of those timed, 1 s when none is), each part in the order of `names`."""
    timed = [durations[n] for n in names if n in durations]
    default = sum(timed) / len(timed) if timed else 1.0
    loads = [0.0] * count
    part_of: dict[str, int] = {}
    for name in sorted(names, key=lambda n: (-durations.get(n, default), names.index(n))):
        least = loads.index(min(loads))
        part_of[name] = least
        loads[least] += durations.get(name, default)
    return [[n for n in names if part_of[n] == i] for i in range(count)]


class DetectionPool(FleetChanges):
    """DetectionProcess's interface over `count` processes (1: one process, as DetectionProcess)."""

    def __init__(self, config: DetectConfig, names: Sequence[str], count: int = 1) -> None:
        self.names = list(names)
        self.processes = [DetectionProcess(config, self.names) for _ in range(max(1, count))]
        self.durations: dict[str, float] = {}  # each detector's time in the last pass

    @property
    def running(self) -> bool:
        return all(process.running for process in self.processes)

    @property
    def starts(self) -> int:
        return sum(process.starts for process in self.processes)

    def waiting_bytes(self) -> int:
        """What the processes have not read yet of what was sent to them, together."""
        return sum(process.waiting_bytes() for process in self.processes)

    async def start(self, fleet: Fleet, busy: Callable[[], bool] | None = None) -> None:
        """Start the processes that are not running, each with a copy of `fleet` as it is now (its
        slices waiting while `busy()`: fleet_copy.send_fleet)."""
        gone = [process for process in self.processes if not process.running]
        if not gone:
            return
        for process in gone:
            await process.spawn()
        await send_fleet(gone, fleet, gone[0].config, self.names, busy)  # each slice encoded once for all

    # The fleet's changes, to every process

    def _send(self, message: tuple[object, ...]) -> None:
        data = parts(message)
        for process in self.processes:
            process.send(*data)

    async def run_pass(self, now: float) -> PassReport:
        if len(self.processes) == 1:
            report = await self.processes[0].run_pass(now)
            self.durations = dict(report.durations)
            return report
        parts = share_out(self.names, self.durations, len(self.processes))
        asked = zip(self.processes, parts, strict=True)
        answers = await asyncio.gather(
            *(process.run_pass(now, part, merged=False) for process, part in asked), return_exceptions=True
        )
        reports: list[PassReport] = []
        for answer in answers:
            if isinstance(answer, DetectionUnavailable):
                raise answer
            if isinstance(answer, BaseException):
                raise DetectionUnavailable(f"a detection process failed the pass: {answer}")
            reports.append(answer)
        raw = {name: found for report in reports for name, found in report.raw.items()}
        findings = merge([f for name in self.names for f in raw.get(name, [])])
        combined = PassReport(findings)
        for report in reports:
            combined.durations.update(report.durations)
            combined.failed.update(report.failed)
        self.durations = dict(combined.durations)
        return combined

    async def stop(self) -> None:
        await asyncio.gather(*(process.stop() for process in self.processes))
