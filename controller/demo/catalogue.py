"""The faults the demo may inject: the agent's own list (`python -m agent --sim --list-faults -o json`,
read through a subprocess, as the demo reaches the agent only through processes), narrowed to those
the controller's detectors find (controller.detect.DETECTED), so that precision and recall measure
detection, not faults nobody looks for yet."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from controller.detect import DETECTED

LIST_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class AgentFault:
    name: str
    level: str  # gpu, host, network, bmc
    cause: str
    shows_in: tuple[str, ...]


def agent_faults() -> list[AgentFault]:
    """Every fault the agent's simulator can inject, in its order; RuntimeError if it cannot say."""
    command = [sys.executable, "-m", "agent", "--sim", "--list-faults", "-o", "json"]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=LIST_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"could not ask the agent for its faults: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(
            f"the agent's --list-faults failed ({done.returncode}): {done.stderr.strip()[-500:]}"
        )
    try:
        return parse(done.stdout)
    except (ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"the agent's --list-faults said something unexpected: {exc}") from exc


def parse(text: str) -> list[AgentFault]:
    return [
        AgentFault(str(f["name"]), str(f["level"]), str(f["cause"]), tuple(str(s) for s in f["shows_in"]))
        for f in json.loads(text)["faults"]
    ]


def detectable(faults: Sequence[AgentFault]) -> list[AgentFault]:
    """The faults whose cause the controller reports from a field the fault shows in."""
    return [f for f in faults if set(f.shows_in) & DETECTED.get(f.cause, frozenset())]
