"""The Agent's sampling cycle and commands, on the simulator (no controller)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.config import load
from agent.daemon import Agent
from agent.probes.base import NoProbes, ProbeOutcome, ProbeRunner
from agent.sources.errors import SourceError
from agent.sources.gpu import GpuReading, Inventory
from agent.sources.host import HostReader, HostReading
from agent.sources.linux.source import HostSource
from agent.sources.sim import SimNode
from agent.sources.sim.host import SimHost
from agent.sources.sim.node import PROBE_VARIANTS
from agent.sources.sim.probes import ModelledProbes
from protos.gpufleet.v1 import telemetry_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
START = 1_800_000_000.0
GPUS = 3


class Clock:
    """Advances one second per call, so every snapshot has its own time."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class FlakyGpu:
    """A GpuSource over the simulator that can lose GPUs or fail outright; records close()."""

    def __init__(self, inner: SimNode) -> None:
        self.inner = inner
        self.lose: set[int] = set()
        self.fail: Exception | None = None
        self.closed = False
        self._errors: list[str] = []

    def inventory(self) -> Inventory:
        return self.inner.inventory()

    def read(self) -> list[GpuReading]:
        if self.fail is not None:
            raise self.fail
        self._errors = [f"sim (gpu {i}): fell off the bus" for i in sorted(self.lose)]
        return [r for r in self.inner.read() if r.index not in self.lose]

    def last_errors(self) -> list[str]:
        return list(self._errors)

    def close(self) -> None:
        self.closed = True


class BrokenHost(HostSource):
    def read(self) -> HostReading:
        raise SourceError("host", "cannot read /proc/meminfo")


class FailingProbes:
    """One GEMM result that worked and one that did not."""

    closed = 0

    def available(self) -> list[str]:
        return ["gemm"]

    def close(self) -> None:
        self.closed += 1

    def run(
        self,
        probes: Sequence[str],
        *,
        force: bool = False,
        gpus: Sequence[int] | None = None,
        suite: str = "short",
        command_id: str = "",
    ) -> list[ProbeOutcome]:
        ok = ProbeOutcome("gemm", "bf16", 0, 700.0, "TFLOP/s", 1.0, START)
        bad = ProbeOutcome("gemm", "fp8", 1, 0.0, "TFLOP/s", 0.1, START, error="out of memory")
        return [ok, bad]


def make_agent(
    tmp_path: Path,
    *,
    host: HostReader | None = None,
    probes: ProbeRunner | None = None,
    collectors: dict[str, dict[str, bool]] | None = None,
) -> tuple[Agent, FlakyGpu]:
    clock = Clock()
    config = load(
        None, {"node": "n1", "source": "sim", "sim": {"gpus": GPUS}, "collectors": collectors or {}}
    )
    sim = SimNode("n1", gpus=GPUS, clock=clock)
    gpu = FlakyGpu(sim)
    agent = Agent(
        config,
        gpu,
        SimHost(sim, clock=clock) if host is None else host,
        ModelledProbes(sim) if probes is None else probes,
        clock=clock,
    )
    return agent, gpu


def run_probes(agent: Agent, *names: str, command_id: str = "c1") -> pb.CommandResult:
    command = pb.Command(id=command_id, run_probes=pb.RunProbes(probes=list(names)))
    return asyncio.run(agent.handle_command(command))


# -- sampling ---------------------------------------------------------------------------------


def test_each_sample_is_one_snapshot_with_every_gpu(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path)
    uuids = [g.uuid for g in agent.inventory.gpus]
    first = agent.sample()
    second = agent.sample()
    assert first is not second
    assert agent.latest is second
    assert second.time > first.time
    for snapshot in (first, second):
        assert snapshot.node == "n1"
        assert [r.index for r in snapshot.gpus] == list(range(GPUS))
        assert [r.uuid for r in snapshot.gpus] == uuids
        assert all(r.sm_clock_hz and r.power_watts for r in snapshot.gpus)
        assert snapshot.host is not None and snapshot.host.memory_total_bytes
        assert sorted(snapshot.collectors) == ["gpu", "host"]
        assert all(
            s.success and s.error == "" and s.duration_seconds >= 0 for s in snapshot.collectors.values()
        )
        assert snapshot.probes == []
    # Energy is a counter: it grows between cycles.
    assert all(
        (b.energy_joules_total or 0) > (a.energy_joules_total or 0)
        for a, b in zip(first.gpus, second.gpus, strict=True)
    )


def test_a_failing_collector_is_reported_and_the_cycle_completes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent, _ = make_agent(tmp_path, host=BrokenHost(tmp_path))
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent"):
        snapshot = agent.sample()
    host = snapshot.collectors["host"]
    assert not host.success
    assert host.error == "host: cannot read /proc/meminfo"
    assert snapshot.host is None
    assert snapshot.collectors["gpu"].success
    assert len(snapshot.gpus) == GPUS
    assert [r.getMessage() for r in caplog.records] == [
        "collector host failed: host: cannot read /proc/meminfo"
    ]


def test_an_unexpected_exception_is_contained_too(tmp_path: Path) -> None:
    agent, gpu = make_agent(tmp_path)
    gpu.fail = ZeroDivisionError("division by zero")
    snapshot = agent.sample()
    assert snapshot.collectors["gpu"].success is False
    assert snapshot.collectors["gpu"].error == "division by zero"
    assert snapshot.gpus == []
    assert snapshot.collectors["host"].success and snapshot.host is not None
    gpu.fail = None
    assert agent.sample().collectors["gpu"].success  # the next cycle is not affected


def test_partial_gpu_read_keeps_the_gpus_that_answered(tmp_path: Path) -> None:
    agent, gpu = make_agent(tmp_path)
    gpu.lose = {1}
    snapshot = agent.sample()
    assert [r.index for r in snapshot.gpus] == [0, 2]
    status = snapshot.collectors["gpu"]
    assert not status.success and status.error == "sim (gpu 1): fell off the bus"


def test_no_host_source_is_a_failed_host_collector(tmp_path: Path) -> None:
    config = load(None, {"node": "n1", "source": "sim", "sim": {"gpus": 1}})
    sim = SimNode("n1", gpus=1)
    agent = Agent(config, sim, None, ModelledProbes(sim))
    assert agent.host_facts is None
    snapshot = agent.sample()
    assert snapshot.collectors["host"].error == "no host source configured"
    assert len(snapshot.gpus) == 1


def test_a_disabled_collector_does_not_run(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path, host=BrokenHost(tmp_path), collectors={"host": {"enabled": False}})
    snapshot = agent.sample()
    assert list(snapshot.collectors) == ["gpu"]
    assert snapshot.host is None and len(snapshot.gpus) == GPUS


def test_close_closes_the_gpu_source_and_stops_the_probe_runner(tmp_path: Path) -> None:
    probes = FailingProbes()
    agent, gpu = make_agent(tmp_path, probes=probes)
    agent.close()
    assert gpu.closed
    assert probes.closed == 1  # a probe run in progress is killed, not waited for


def test_hello_describes_the_node(tmp_path: Path) -> None:
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("4b1d-boot\n")
    agent, _ = make_agent(tmp_path, host=HostSource(tmp_path, psutil_fallback=True))
    hello = agent.hello()
    assert hello.node == "n1"
    assert hello.boot_id == agent.boot_id and len(agent.boot_id) == 32
    assert hello.inventory.source == "sim"
    assert [g.uuid for g in hello.inventory.gpus] == [g.uuid for g in agent.inventory.gpus]
    assert hello.host.host_boot_id == "4b1d-boot"
    assert list(hello.probes) == list(PROBE_VARIANTS)
    assert list(hello.capabilities) == ["run_probes"]
    cannot = Agent(agent.config, agent.gpu, None, NoProbes("no torch"))
    assert list(cannot.hello().capabilities) == [] and not cannot.hello().HasField("host")
    assert cannot.boot_id != agent.boot_id  # every agent start is a new boot


# -- commands ---------------------------------------------------------------------------------


def test_run_probes_results_ride_in_the_next_snapshot_once(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path)
    result = run_probes(agent, "gemm", "nccl")
    assert (result.command_id, result.ok, result.error) == ("c1", True, "")
    probes = agent.sample().probes
    gemm = [(o.gpu, o.variant) for o in probes if o.probe == "gemm"]
    assert gemm == [(g, v) for v in PROBE_VARIANTS["gemm"] for g in range(GPUS)]
    assert [(o.probe, o.gpu) for o in probes if o.probe != "gemm"] == [("nccl", None)]
    assert all(o.simulated and o.error == "" and o.value > 0 for o in probes)
    assert agent.sample().probes == []  # sent once, not again


def test_run_probes_without_names_runs_the_default_suite(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path)
    assert run_probes(agent).ok
    names = {(o.probe, o.variant) for o in agent.sample().probes}
    assert names == {(p, v) for p, variants in PROBE_VARIANTS.items() for v in variants}


def test_failed_probe_outcomes_make_the_command_fail_and_are_still_sent(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path, probes=FailingProbes())
    result = run_probes(agent, "gemm")
    assert not result.ok
    assert result.error == "gemm/fp8: out of memory"
    assert [(o.variant, o.error) for o in agent.sample().probes] == [("bf16", ""), ("fp8", "out of memory")]


class RecordingProbes(FailingProbes):
    """Records what the daemon asked for; its outcomes carry no command id of their own."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], bool, list[int] | None, str, str]] = []

    def run(
        self,
        probes: Sequence[str],
        *,
        force: bool = False,
        gpus: Sequence[int] | None = None,
        suite: str = "short",
        command_id: str = "",
    ) -> list[ProbeOutcome]:
        self.calls.append((list(probes), force, None if gpus is None else list(gpus), suite, command_id))
        return [ProbeOutcome("membw", "d2d", g, 3000.0, "GB/s", 0.5, START) for g in gpus or [0]]


def test_run_probes_passes_gpus_suite_force_and_stamps_the_command_id(tmp_path: Path) -> None:
    recorder = RecordingProbes()
    agent, _ = make_agent(tmp_path, probes=recorder)
    command = pb.Command(
        id="cmd-42", run_probes=pb.RunProbes(probes=["membw"], force=True, gpus=[2, 0], suite="full")
    )
    assert asyncio.run(agent.handle_command(command)).ok
    assert recorder.calls == [(["membw"], True, [2, 0], "full", "cmd-42")]
    sent = agent.sample().probes
    assert [(o.gpu, o.command_id) for o in sent] == [(2, "cmd-42"), (0, "cmd-42")]
    assert run_probes(agent, "membw", command_id="cmd-43").ok  # the defaults: every GPU, short
    assert recorder.calls[-1] == (["membw"], False, [], "short", "cmd-43")


def test_modelled_probes_answer_for_the_gpus_asked_for(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path)
    command = pb.Command(id="c5", run_probes=pb.RunProbes(probes=["gemm", "nccl"], gpus=[0, 2]))
    assert asyncio.run(agent.handle_command(command)).ok
    sent = agent.sample().probes
    assert {o.gpu for o in sent if o.probe == "gemm"} == {0, 2}
    (nccl,) = [o for o in sent if o.probe == "nccl"]
    assert nccl.params["ranks"] == "2"
    assert all(o.command_id == "c5" for o in sent)


def test_unsupported_command_is_refused(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path)
    result = asyncio.run(agent.handle_command(pb.Command(id="c9")))
    assert result.command_id == "c9"
    assert not result.ok
    assert result.error == "unsupported command None: this agent serves apply_profile, run_probes"
    assert agent.sample().probes == []


def test_a_second_probe_run_is_refused_while_one_is_running(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path)

    async def both() -> list[pb.CommandResult]:
        first = pb.Command(id="a", run_probes=pb.RunProbes(probes=["membw"]))
        second = pb.Command(id="b", run_probes=pb.RunProbes(probes=["membw"]))
        return list(await asyncio.gather(agent.handle_command(first), agent.handle_command(second)))

    first, second = asyncio.run(both())
    assert first.ok
    assert (second.command_id, second.ok, second.error) == ("b", False, "a probe run is already in progress")
    assert len(agent.sample().probes) == GPUS  # only the first run's results
    assert run_probes(agent, "membw").ok  # and the next run is accepted


def test_a_probe_run_that_raises_does_not_block_later_runs(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path)
    failed = run_probes(agent, "warp_drive")  # the handler raised: a failed command, not a dead agent
    assert not failed.ok and failed.error.startswith("ValueError: unknown probe(s) warp_drive")
    assert run_probes(agent, "pcie", command_id="c2").ok
    assert {o.probe for o in agent.sample().probes} == {"pcie"}


def test_an_agent_without_probes_says_why(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path, probes=NoProbes("torch is not installed"))
    result = run_probes(agent, "gemm")
    assert not result.ok and result.error == "RuntimeError: probes unavailable: torch is not installed"


# -- the command line -------------------------------------------------------------------------


def test_once_json_prints_one_object_and_exits_0() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "--sim", "--once", "--json", "--node=cli-node"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)  # the whole of stdout is one JSON object
    assert sorted(body) == ["inventory", "node", "snapshot"]
    assert body["node"] == "cli-node"
    inventory, snapshot = body["inventory"], body["snapshot"]
    assert inventory["source"] == "sim" and len(inventory["gpus"]) == 8
    assert [g["uuid"] for g in snapshot["gpus"]] == [g["uuid"] for g in inventory["gpus"]]
    assert all(g["sm_clock_hz"] > 0 and len(g["nvlinks"]) == 18 for g in snapshot["gpus"])
    assert snapshot["host"]["memory_total_bytes"] > 0
    assert {name: s["success"] for name, s in snapshot["collectors"].items()} == {
        "gpu": True,
        "host": True,
        "bmc": True,
    }
    # The simulated BMC is polled once before the snapshot, so --once shows it too.
    bmc = snapshot["bmc"]
    assert bmc["success"] and bmc["endpoint"] == "sim://cli-node"
    assert [g["serial"] for g in bmc["gpus"]] == [g["serial"] for g in inventory["gpus"]]


def test_close_logs_a_source_that_fails_to_release(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent, _ = make_agent(tmp_path)

    def broken_close() -> None:
        raise SourceError("nvml", "shutdown failed")

    agent.gpu.close = broken_close  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        agent.close()  # never raises on the way out
    assert "GPU source did not close cleanly: nvml: shutdown failed" in caplog.text


def test_expected_gpus_comes_from_config_else_the_largest_view(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path)
    assert agent.inventory.expected_gpu_count == GPUS  # the simulator's own count

    config = load(None, {"node": "n1", "source": "sim", "sim": {"gpus": GPUS}, "expected_gpus": GPUS + 2})
    sim = SimNode("n1", gpus=GPUS)
    configured = Agent(config, sim, SimHost(sim), ModelledProbes(sim))
    assert configured.inventory.expected_gpu_count == GPUS + 2


class NvmlLike(FlakyGpu):
    """What NVML shows when one GPU fell off the bus before the driver enumerated it."""

    def inventory(self) -> Inventory:
        inv = self.inner.inventory()
        inv.source = "nvml"
        inv.gpus = inv.gpus[:-1]
        inv.expected_gpu_count = len(inv.gpus)
        return inv


def test_a_gpu_missing_from_nvml_is_still_expected_from_the_pci_bus(tmp_path: Path) -> None:
    for i in range(GPUS):
        device = tmp_path / f"sys/bus/pci/devices/0000:{0x18 + i:02x}:00.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x10de\n")
        (device / "class").write_text("0x030200\n")
    config = load(None, {"node": "n1", "source": "nvml"})
    sim = SimNode("n1", gpus=GPUS)
    agent = Agent(config, NvmlLike(sim), SimHost(sim), ModelledProbes(sim))
    assert len(agent.inventory.gpus) == GPUS - 1
    assert agent.inventory.expected_gpu_count == GPUS
