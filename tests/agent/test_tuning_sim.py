"""Tuning the simulated node end to end, as `gpufleet agent --sim` with tuning on runs it: the
composition root's actuators over the simulator, an ApplyProfile command through the agent, the
re-probe that decides, the readings that show the fix, and the committed profile put back after a
reboot."""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
from pathlib import Path
from typing import Any

import pytest

from agent.compose.bmc import build_bmc
from agent.compose.sources import build_sources
from agent.compose.tuning import build_tuner
from agent.config import load
from agent.daemon import Agent
from agent.sources.sim import SimNode
from agent.sources.sim.bmc import SimBmc
from protos.gpufleet.v1 import telemetry_pb2 as pb

GPU_DEFAULTS = {"gpu": {"power_limit": "default", "locked_gpu_clocks": "reset"}}


def sim_agent(tmp_path: Path, faults: list[dict[str, Any]], *, enabled: bool = True) -> tuple[Agent, SimNode]:
    config = load(
        None,
        {
            "node": "n1",
            "source": "sim",
            "sim": {"gpus": 4, "seed": 3, "faults": faults},
            "stream": {"spool_dir": str(tmp_path / "spool")},
            "tuning": {"enabled": enabled},
            "metrics": {"address": None},
        },
    )
    gpu, host, probes = build_sources(config)
    bmc = build_bmc(config, gpu)
    agent = Agent(config, gpu, host, probes, bmc=bmc, tuner=build_tuner(config, gpu, host, bmc))
    assert isinstance(gpu, SimNode)
    return agent, gpu


def gemm(agent: Agent, gpus: list[int]) -> dict[int, float]:
    outcomes = agent.probes.run(["gemm"], gpus=gpus)
    return {o.gpu: o.value for o in outcomes if o.variant == "bf16" and o.gpu is not None}


def command(cid: str, targets: dict[str, Any], **fields: Any) -> pb.Command:
    return pb.Command(id=cid, apply_profile=pb.ApplyProfile(targets_json=json.dumps(targets), **fields))


def bars(agent: Agent, gpu: int, healthy: list[int]) -> list[pb.ProbeBar]:
    peers = gemm(agent, healthy)
    before = gemm(agent, [gpu])[gpu]
    normal = statistics.median(peers.values()) * 0.97
    return [
        pb.ProbeBar(
            probe="gemm", variant="bf16", gpu=gpu, normal=normal, before=before, higher_is_better=True
        )
    ]


def test_restoring_the_power_limit_fixes_a_capped_gpu_and_is_kept(tmp_path: Path) -> None:
    agent, node = sim_agent(tmp_path, [{"fault": "power_cap", "gpu": 2}])
    assert "apply_profile" in agent.hello().capabilities
    capped = node.gpus[2].power_limit_watts
    verify = bars(agent, 2, [0, 1, 3])
    assert verify[0].before < verify[0].normal  # the fault shows in the probe before
    result = asyncio.run(
        agent.handle_command(command("c1", GPU_DEFAULTS, profile="gpu-defaults", gpus=[2], verify=verify))
    )
    answer = result.apply_profile
    assert (result.ok, answer.state) == (True, "committed"), answer
    assert ("gpu[2].power_limit", str(round(capped)), "700") in [
        (c.setting, c.current, c.target) for c in answer.changes
    ]
    assert answer.checks[0].passed and answer.checks[0].value >= verify[0].normal
    reading = agent.sample().gpus[2]
    assert reading.enforced_power_limit_watts == node.profile.default_power_limit_watts
    assert [o.command_id for o in agent.sample().probes] == []  # delivered with the first sample
    agent.close()


def test_a_fix_that_does_not_help_is_rolled_back(tmp_path: Path) -> None:
    """Thermal throttling is not a setting: resetting clocks changes nothing, so the bar is missed."""
    agent, node = sim_agent(tmp_path, [{"fault": "thermal_throttle", "gpu": 1}])
    verify = bars(agent, 1, [0, 2, 3])
    targets = {"gpu": {"power_limit": 650}}  # a change the actuators can make, and that cannot help
    result = asyncio.run(
        agent.handle_command(command("c1", targets, profile="wrong-fix", gpus=[1], verify=verify))
    )
    assert result.apply_profile.state == "rolled_back", result.apply_profile
    assert node.gpus[1].power_limit_watts == node.profile.default_power_limit_watts  # back at its snapshot
    agent.close()


def test_the_governor_fix_shows_in_the_host_readings(tmp_path: Path) -> None:
    agent, _ = sim_agent(tmp_path, [{"fault": "cpu_governor_powersave"}])
    assert agent.sample().host is not None and agent.sample().host.cpu_governor == "powersave"  # type: ignore[union-attr]
    targets = {"os": {"cpu_governor": "performance"}}
    result = asyncio.run(agent.handle_command(command("c1", targets, profile="os-accelerator-performance")))
    assert result.apply_profile.state == "committed", result.apply_profile
    assert agent.sample().host.cpu_governor == "performance"  # type: ignore[union-attr]
    agent.close()


def test_committed_gpu_settings_come_back_after_a_reboot(tmp_path: Path) -> None:
    agent, node = sim_agent(tmp_path, [])
    targets = {"gpu": {"power_limit": 600, "persistence_mode": "on"}}
    assert asyncio.run(agent.handle_command(command("c1", targets, profile="site-cap"))).ok
    node.reboot()  # NVML settings are lost: the default limit, persistence off
    assert node.gpus[0].power_limit_watts == node.profile.default_power_limit_watts
    agent.close()
    again, _ = sim_agent(tmp_path, [])  # the agent starts again on the rebooted node...
    again.gpu = node  # ...which is this node (a new SimNode would be a fresh one)
    again.tuner = build_tuner(again.config, node, again.host, None)
    asyncio.run(again.settle_tuning())
    assert [g.power_limit_watts for g in node.gpus] == [600.0] * 4
    again.close()


def test_tuning_off_refuses_and_changes_nothing(tmp_path: Path) -> None:
    agent, node = sim_agent(tmp_path, [{"fault": "power_cap", "gpu": 0}], enabled=False)
    capped = node.gpus[0].power_limit_watts
    assert "apply_profile" not in agent.hello().capabilities
    result = asyncio.run(agent.handle_command(command("c1", GPU_DEFAULTS, profile="gpu-defaults")))
    assert (result.ok, result.apply_profile.state) == (False, "refused")
    assert "tuning.enabled: false" in result.error
    assert node.gpus[0].power_limit_watts == capped
    agent.close()


def test_bios_changes_stay_pending_until_the_reboot_and_are_verified_after_it(tmp_path: Path) -> None:
    agent, _ = sim_agent(tmp_path, [])
    bmc = agent.bmc.source if agent.bmc is not None else None
    assert isinstance(bmc, SimBmc)
    targets = {"bmc": {"bios": {"SubNumaClustering": "SNC2", "C1EState": "Enabled"}}}
    result = asyncio.run(agent.handle_command(command("c1", targets, profile="site-bios")))
    answer = result.apply_profile
    assert (result.ok, answer.state) == (True, "committed"), answer
    assert all(c.pending_reboot for c in answer.changes) and len(answer.changes) == 2
    assert bmc.bios.read().current["SubNumaClustering"] == "Disabled"  # not before the reboot
    assert agent.tuner is not None
    [(_, before)] = agent.tuner.check_pending()  # an agent restart without a reboot
    assert (before.verified, len(before.pending), before.lost) == ([], 2, [])
    bmc.reboot()
    [(profile, after)] = agent.tuner.check_pending()
    assert (profile, sorted(after.verified), after.lost) == (
        "site-bios",
        ["bmc.bios.C1EState", "bmc.bios.SubNumaClustering"],
        [],
    )
    assert bmc.bios.read().current["SubNumaClustering"] == "SNC2"
    assert agent.tuner.check_pending() == []  # verified: forgotten
    agent.close()


def test_a_bios_change_dropped_at_the_reboot_is_reported_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent, _ = sim_agent(tmp_path, [])
    bmc = agent.bmc.source if agent.bmc is not None else None
    assert isinstance(bmc, SimBmc) and agent.tuner is not None
    targets = {"bmc": {"bios": {"C1EState": "Enabled"}}}
    assert asyncio.run(agent.handle_command(command("c1", targets, profile="site-bios"))).ok
    bmc.bios.set_pending({"C1EState": "Disabled"})  # someone (a BIOS reset, a person) took it back
    bmc.reboot()
    with caplog.at_level(logging.ERROR, logger="gpufleet.agent.tuning"):
        [(_, state)] = agent.tuner.check_pending()
    assert state.lost == ["bmc.bios.C1EState"]
    assert "BIOS changes lost at the reboot" in caplog.text
    agent.close()


def test_with_nothing_pending_a_start_writes_nothing_and_logs_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, every start rewrote the (empty) list of changes pending a reboot: with a spool
    directory that cannot be made, an ERROR at each start of an agent that had never tuned."""
    (tmp_path / "spool").write_text("a file where the directory should be")
    agent, _ = sim_agent(tmp_path, [])
    assert agent.tuner is not None
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.tuning"):
        assert agent.tuner.check_pending() == []
    assert [r for r in caplog.records if r.name.startswith("gpufleet.agent.tuning")] == []
    agent.close()
