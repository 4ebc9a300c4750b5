"""The bmc collector: the latest poll in every snapshot, on the wire once, failures in its status."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from agent.config import load
from agent.daemon import Agent
from agent.probes.base import NoProbes
from agent.sources.bmc import BmcGpu, BmcSample, BmcSectionStatus, BmcTemperature
from agent.sources.gpu import GpuInfo
from agent.sources.sim import SimNode
from agent.stream import frames


class QueuedBmc:
    endpoint = "https://bmc.test"

    def __init__(self, samples: list[BmcSample]) -> None:
        self.samples = samples

    def poll(self, gpus: Sequence[GpuInfo] = ()) -> BmcSample:
        return self.samples.pop(0)

    def close(self) -> None:
        pass


def _sample(error: str = "", failed_section: str = "") -> BmcSample:
    sections = [BmcSectionStatus("thermal", True, 0.01)]
    if failed_section:
        sections.append(BmcSectionStatus(failed_section, False, 0.01, "GET /x: HTTP 500"))
    return BmcSample(
        time=1_800_000_000.5,
        success=not (error or failed_section),
        error=error,
        sections=sections,
        endpoint="https://bmc.test",
        temperatures=[BmcTemperature("Inlet", "intake", 24.5, upper_critical_celsius=42.0, state="enabled")],
        bios_attributes={"Turbo": "Enabled"},
        gpus=[BmcGpu(0, "HGX_GPU_SXM_1", power_watts=301.0, matched_by="serial")],
    )


def _agent(samples: list[BmcSample]) -> Agent:
    config = load(None, {"source": "sim", "node": "n1", "sim": {"gpus": 1}})
    return Agent(config, SimNode("n1", gpus=1), None, NoProbes("none"), bmc=QueuedBmc(samples))


def test_each_poll_rides_in_one_frame_and_stays_in_the_snapshot() -> None:
    agent = _agent([_sample()])
    assert agent.bmc is not None
    agent.bmc.poll_once()
    first, second = agent.sample(), agent.sample()
    agent.close()
    assert first.bmc is second.bmc and first.bmc is not None  # the exporter always has the latest
    assert (first.bmc_new, second.bmc_new) == (True, False)
    assert first.collectors["bmc"].success
    wire = frames.frame(first, "boot", 1)
    assert wire.HasField("bmc") and not frames.frame(second, "boot", 2).HasField("bmc")
    assert wire.bmc.time.ToNanoseconds() == 1_800_000_000_500_000_000
    assert wire.bmc.temperatures[0].context == "intake"
    assert wire.bmc.temperatures[0].upper_critical_celsius == 42.0
    assert not wire.bmc.temperatures[0].HasField("upper_fatal_celsius")  # unreported stays unset
    assert dict(wire.bmc.bios_attributes) == {"Turbo": "Enabled"}
    assert wire.bmc.gpus[0].matched_by == "serial" and wire.bmc.gpus[0].power_watts == 301.0


def test_failed_and_partial_polls_fail_the_collector_and_log_once(caplog: pytest.LogCaptureFixture) -> None:
    dead = "GET https://bmc.test/redfish/v1/: cannot connect: [Errno 111] Connection refused"
    agent = _agent([_sample(error=dead), _sample(failed_section="power"), _sample()])
    assert agent.bmc is not None
    caplog.set_level(logging.INFO, logger="gpufleet.agent")
    agent.bmc.poll_once()
    statuses = [agent.sample().collectors["bmc"] for _ in range(3)]
    assert [s.success for s in statuses] == [False, False, False]
    assert statuses[0].error == f"bmc: {dead}"
    agent.bmc.poll_once()
    partial = agent.sample().collectors["bmc"]
    assert not partial.success and partial.error == "power: GET /x: HTTP 500"
    agent.bmc.poll_once()
    assert agent.sample().collectors["bmc"].success
    agent.close()
    lines = [r.getMessage() for r in caplog.records if "collector bmc" in r.getMessage()]
    assert lines == [
        f"collector bmc failed: bmc: {dead}",  # once, not once per cycle
        "collector bmc failed: power: GET /x: HTTP 500",
        "collector bmc works again",
    ]
