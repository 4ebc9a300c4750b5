"""ApplyProfile over all three levels at once, through the handler: NVML (the fake library), the
host tree (the recording kernel tree) and the BMC (the fake Redfish server). A dry run writes
nothing anywhere; a real apply that fails at the BIOS puts the GPUs and the host back too."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.commands.executor import CommandExecutor
from agent.commands.registry import CommandContext
from agent.sources.nvml import control as nvml_control
from agent.sources.nvml.control import NvmlControl
from agent.sources.redfish.bios_control import RedfishBiosControl
from agent.sources.redfish.session import BmcEndpoint, Credentials
from agent.tuning.base import Actuator, TuningError
from agent.tuning.bios import BiosActuator
from agent.tuning.fake import KernelTree
from agent.tuning.gpu_settings import gpu_actuators
from agent.tuning.os_settings import os_actuators
from agent.tuning.tuner import Tuner
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.agent.commands.test_apply_profile import TreeProbes
from tests.agent.sources.test_nvml_control import setter_calls, settings
from tests.agent.sources.test_nvml_fake import FakeNvml
from tests.agent.tuning.host_tree import contents, make_host, stamps
from tests.agent.tuning.test_bios_redfish import bios_tree, patches
from tests.redfish_servers import FakeBmcServer

TARGETS = {
    "gpu": {"power_limit": 300, "persistence_mode": "off"},
    "os": {"sysctls": {"vm.swappiness": 10}, "cpu_governor": "performance"},
    "bmc": {"bios": {"SriovGlobalEnable": "Disabled"}},
}


@pytest.fixture(autouse=True)
def new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_control, "_locked", {})


@pytest.fixture
def parts(
    fake_bmc: Any, tmp_path: Path
) -> Iterator[tuple[FakeNvml, KernelTree, FakeBmcServer, CommandExecutor]]:
    nvml = FakeNvml(root=True)
    control = NvmlControl(nvml=nvml.module)
    tree = KernelTree(make_host(tmp_path / "host"))
    bmc: FakeBmcServer = fake_bmc(bios_tree(tmp_path))
    bios = RedfishBiosControl(BmcEndpoint(bmc.url, Credentials("admin", "secret")))

    def actuators(gpus: Any) -> list[Actuator]:
        return [*os_actuators(), *gpu_actuators(control, gpus), BiosActuator(bios)]

    tuner = Tuner(enabled=True, tree=tree, actuators=actuators, state_dir=tmp_path / "tuning")
    ctx = CommandContext(probes=TreeProbes(tree, lambda t: 1.0), deliver_probes=lambda _: None, tuner=tuner)
    yield nvml, tree, bmc, CommandExecutor(ctx, state_dir=tmp_path / "commands")
    control.close()


def execute(ex: CommandExecutor, dry_run: bool) -> pb.CommandResult:
    request = pb.ApplyProfile(profile="all-levels", targets_json=json.dumps(TARGETS), dry_run=dry_run)
    return asyncio.run(ex.execute(pb.Command(id="c1", apply_profile=request)))


def test_a_dry_run_writes_nothing_to_nvml_the_host_or_the_bmc(
    parts: tuple[FakeNvml, KernelTree, FakeBmcServer, CommandExecutor], tmp_path: Path
) -> None:
    nvml, tree, bmc, ex = parts
    host_before, gpus_before = stamps(tree.root), settings(nvml)
    result = execute(ex, dry_run=True)
    answer = result.apply_profile
    assert (result.ok, answer.state) == (True, "planned"), answer
    planned = {c.setting.split(".")[0].split("[")[0] for c in answer.changes}
    assert planned == {"gpu", "os", "bmc"}
    assert [c.pending_reboot for c in answer.changes if c.setting.startswith("bmc.")] == [True]
    assert setter_calls(nvml) == 0 and settings(nvml) == gpus_before
    assert tree.writes == [] and stamps(tree.root) == host_before
    assert bmc.paths("PATCH") == [] and patches(bmc) == []
    assert not (tmp_path / "tuning" / "journal").exists()


def test_a_failure_at_the_bios_puts_the_gpus_and_the_host_back(
    parts: tuple[FakeNvml, KernelTree, FakeBmcServer, CommandExecutor], monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml, tree, bmc, ex = parts
    host_before, gpus_before = contents(tree.root), settings(nvml)

    def bmc_gone(self: RedfishBiosControl, attributes: object) -> None:
        raise TuningError("BMC unreachable: connection refused")

    monkeypatch.setattr(RedfishBiosControl, "set_pending", bmc_gone)  # the last level to be written
    result = execute(ex, dry_run=False)
    answer = result.apply_profile
    assert (result.ok, answer.state) == (False, "rolled_back"), answer
    assert "BMC unreachable: connection refused" in answer.problems
    assert setter_calls(nvml) > 0 and tree.writes  # the GPUs and the host had been written...
    assert contents(tree.root) == host_before and settings(nvml) == gpus_before  # ...and are back
    assert patches(bmc) == []
