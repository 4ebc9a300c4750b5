"""The agent's probe runner from its config: real probes where torch sees CUDA, else why not.

torch is never imported into the agent: whether it is installed is asked of the import system,
and whether it sees a GPU of the probe worker (one short `describe` run at start-up).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from typing import TYPE_CHECKING

from agent.config import ProbesConfig
from agent.probes.base import NoProbes, ProbeRunner
from agent.probes.safety import SafetyPolicy
from agent.probes.worker import NO_TORCH
from agent.probes.worker_client import Timeouts, WorkerError, run_worker

if TYPE_CHECKING:
    from agent.sources.gpu import GpuSource

log = logging.getLogger("gpufleet.agent.probes")

SLOW_NEVER = 10**9  # a sampling source's reads stay cheap (its first read is complete anyway)


def policy(cfg: ProbesConfig) -> SafetyPolicy:
    return SafetyPolicy(max_utilization=cfg.max_utilization, drained=cfg.drained)


def timeouts(cfg: ProbesConfig) -> Timeouts:
    return Timeouts(startup_seconds=cfg.startup_timeout_seconds, grace_seconds=cfg.timeout_seconds)


def open_nvml(complete: bool) -> GpuSource:
    """A GPU source of the probe runner's own (the agent's sampling loop keeps its own, with the
    XID events and the GPM metrics: the probe runner uses none, and GPM calls are serialised)."""
    from agent.sources.nvml.source import NvmlSource

    return NvmlSource(slow_every=1 if complete else SLOW_NEVER, xid_events=False, gpm=False)


def real_probes(cfg: ProbesConfig, python: str = sys.executable) -> ProbeRunner:
    """TorchProbes on the node's GPUs, or NoProbes saying why not (disabled, no torch, no CUDA)."""
    if not cfg.enabled:
        return NoProbes("disabled in the agent's config (probes.enabled: false)")
    if importlib.util.find_spec("torch") is None:
        return NoProbes(NO_TORCH)
    budget = timeouts(cfg)
    try:
        hello = run_worker({"device": "cuda", "describe": True}, python=python, timeouts=budget).hello
    except WorkerError as exc:
        return NoProbes(str(exc))
    from agent.probes.runner import TorchProbes

    devices = hello.get("devices", [])
    log.info(
        "probes: torch %s sees %d GPU(s): %s",
        hello.get("torch", "?"),
        len(devices),
        ", ".join(sorted({str(d.get("name", "?")) for d in devices})),
    )
    return TorchProbes(
        "cuda",
        open_source=open_nvml,
        policy=policy(cfg),
        budgets={"short": cfg.short_budget_seconds, "full": cfg.full_budget_seconds},
        timeouts=budget,
        sample_interval=cfg.sample_interval_seconds,
        python=python,
    )
