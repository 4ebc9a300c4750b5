"""Test doubles for the probe runner: a GPU source over the simulator whose GPUs can be made busy,
and a stand-in for the worker process (a script speaking its protocol) for paths that need a GPU."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.sources.gpu import ComputeProcess, GpuReading, Inventory
from agent.sources.sim import SimNode

H100 = "NVIDIA H100 80GB HBM3"  # the simulator's GPU model, as NVML names it


class Gpus:
    """A GpuSource over an idle simulated node; `foreign` and `busy` change what its GPUs show."""

    def __init__(self, gpus: int = 4) -> None:
        self.node = SimNode("probe-node", gpus=gpus, load=0.0)
        self.foreign: dict[int, list[int]] = {}  # GPU -> pids of other processes
        self.busy: dict[int, float] = {}  # GPU -> utilisation ratio
        self.opened: list[bool] = []  # what open() was asked for: True = complete reads
        self.closed = 0
        self.reads = 0

    def open(self, complete: bool) -> Gpus:
        self.opened.append(complete)
        return self

    def inventory(self) -> Inventory:
        return self.node.inventory()

    def read(self) -> list[GpuReading]:
        self.reads += 1
        out = []
        for simulated in self.node.read():
            reading = dataclasses.replace(simulated)
            reading.processes = [ComputeProcess(pid) for pid in self.foreign.get(reading.index, [])]
            if reading.index in self.busy:
                reading.gpu_utilization_ratio = self.busy[reading.index]
            out.append(reading)
        return out

    def last_errors(self) -> list[str]:
        return []

    def close(self) -> None:
        self.closed += 1


def fake_worker(
    tmp_path: Path, events: Sequence[dict[str, Any]], *, hang: bool = False, code: int = 0
) -> str:
    """An executable standing in for `python -m agent.probes.worker`: it prints `events` (JSON lines;
    "$VISIBLE" in a string becomes CUDA_VISIBLE_DEVICES; an outcome timed None ends now; {"sleep": s}
    pauses), then hangs or exits with `code`."""
    script = tmp_path / "fake_worker.py"
    script.write_text(
        "import json, os, sys, time\n"
        "sys.stdin.read()\n"
        f"events = json.loads({json.dumps(json.dumps(list(events)))})\n"
        "visible = os.environ.get('CUDA_VISIBLE_DEVICES', '')\n"
        "for event in events:\n"
        "    if 'sleep' in event:\n"
        "        time.sleep(event['sleep'])\n"
        "        continue\n"
        "    body = event.get('outcome')\n"
        "    if body is not None and body.get('time') is None:\n"
        "        body['time'] = time.time() - body['duration_seconds']\n"
        "    print(json.dumps(event).replace('$VISIBLE', visible), flush=True)\n"
        "print('a line on stderr', file=sys.stderr, flush=True)\n"
        f"if {hang}:\n"
        "    time.sleep(600)\n"
        f"sys.exit({code})\n"
    )
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def outcome(probe: str, variant: str, device: str, value: float, **extra: Any) -> dict[str, Any]:
    """A worker's outcome event body (its time is set when the fake worker prints it)."""
    return {
        "probe": probe,
        "variant": variant,
        "gpu": None,
        "value": value,
        "unit": "TFLOP/s" if probe == "gemm" else "GB/s",
        "duration_seconds": 0.5,
        "time": None,
        "params": {"visible": "$VISIBLE"},
        "device": device,
        **extra,
    }
