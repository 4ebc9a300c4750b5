"""The demo's agent processes: one simulated node each, its injected faults in its config, tuning
on when the demo closes the loop; and a node's repair (its agent restarted without the fault, as a
technician would fix the hardware) for `--kubernetes fake`."""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from controller.demo.plan import Injected
from controller.demo.processes import Child, spawn

# Faster than production so a short demo sees everything (production: 10 s samples); jobs stop
# for 4 s every 12 s on each node (its own phase), so the scheduler finds idle GPUs to probe.
AGENT_INTERVAL_SECONDS = 1.0
IDLE_EVERY_SECONDS = 12.0
IDLE_SECONDS = 4.0
STOP_SECONDS = 10.0


@dataclass
class Agents:
    tmp: Path
    address: str
    gpus: int
    seed: int
    tuning: bool
    children: dict[str, Child] = field(default_factory=dict)
    retired: list[Child] = field(default_factory=list)  # stopped for a repair

    def start(self, names: list[str], injected: list[Injected]) -> list[Child]:
        for name in names:
            # A GPU fault on its GPU; a host, network or BMC one where the agent's simulator picks.
            faults = [
                {"fault": i.fault} if i.gpu is None else {"fault": i.fault, "gpu": i.gpu}
                for i in injected
                if i.node == name
            ]
            self.spawn(name, faults)
        return list(self.children.values())

    def spawn(self, name: str, faults: list[dict[str, Any]]) -> Child:
        stream: dict[str, Any] = {
            "controller": self.address,
            "backoff_initial_seconds": 0.2,
            "backoff_max_seconds": 2.0,
        }
        extra: dict[str, Any] = {}
        if self.tuning:  # tuning keeps its journal and the command memory on disk
            stream["spool_dir"] = str(self.tmp / f"{name}.spool")
            extra["tuning"] = {"enabled": True}
        config = self.tmp / f"{name}.yaml"
        document = {
            **extra,
            "node": name,
            "source": "sim",
            "interval_seconds": AGENT_INTERVAL_SECONDS,
            "sim": {
                "gpus": self.gpus,
                "seed": self.seed,
                "faults": faults,
                "idle_every_seconds": IDLE_EVERY_SECONDS,
                "idle_seconds": IDLE_SECONDS,
            },
            "stream": stream,
            "metrics": {"address": None},  # many agents on one machine: no /metrics ports
        }
        config.write_text(yaml.safe_dump(document, sort_keys=False))
        child = spawn(name, ["agent", "--config", str(config)], self.tmp)
        self.children[name] = child
        return child

    def repair(self, name: str) -> Child:
        """Stop the node's agent and start it again without its fault: the hardware was fixed."""
        old = self.children[name]
        if old.process.poll() is None:
            old.process.send_signal(signal.SIGTERM)
            try:
                old.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                old.process.kill()
                old.process.wait()
        old.log_path.rename(old.log_path.with_suffix(".before-repair.log"))
        self.retired.append(old)
        return self.spawn(name, [])
