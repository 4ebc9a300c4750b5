"""ApplyProfile on the agent: refused unless tuning is on, re-probed against the controller's bars,
committed (and kept as desired state) or rolled back to the snapshot, answered with the changes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from agent.commands.apply_profile import check_bars
from agent.commands.executor import CommandExecutor
from agent.commands.registry import CommandContext, discover
from agent.probes.base import ProbeOutcome
from agent.tuning.fake import KernelTree
from agent.tuning.os_settings import os_actuators
from agent.tuning.targets import Targets
from agent.tuning.tuner import Tuner
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.agent.tuning.host_tree import SWAPPINESS, contents, make_host, stamps

TARGETS = {"os": {"sysctls": {"vm.swappiness": {"target": 10, "reason": "r", "source": "s"}}}}


def outcome(gpu: int, value: float, error: str = "") -> ProbeOutcome:
    return ProbeOutcome(
        probe="gemm",
        variant="bf16",
        gpu=gpu,
        value=value,
        unit="TFLOP/s",
        duration_seconds=1.0,
        time=0.0,
        error=error,
    )


class TreeProbes:
    """gemm on each GPU asked for: `value(tree)`, read from the host as it is when the probe runs."""

    def __init__(self, tree: KernelTree, value: Callable[[KernelTree], float]) -> None:
        self.tree, self.value = tree, value
        self.asked: list[tuple[list[str], list[int]]] = []

    def available(self) -> list[str]:
        return ["gemm"]

    def close(self) -> None:
        pass

    def run(
        self,
        probes: Sequence[str],
        *,
        force: bool = False,
        gpus: Sequence[int] | None = None,
        suite: str = "short",
        command_id: str = "",
    ) -> list[ProbeOutcome]:
        self.asked.append((list(probes), list(gpus or [])))
        return [outcome(g, self.value(self.tree)) for g in gpus or [0]]


def fast_when_tuned(tree: KernelTree) -> float:
    return 100.0 if tree.read(SWAPPINESS).strip() == "10" else 60.0


def bar(gpu: int, normal: float = 95.0, before: float = 60.0, better_by: float = 0.0) -> pb.ProbeBar:
    return pb.ProbeBar(
        probe="gemm",
        variant="bf16",
        gpu=gpu,
        normal=normal,
        before=before,
        higher_is_better=True,
        better_by=better_by,
    )


def setup(
    tmp_path: Path, value: Callable[[KernelTree], float] = fast_when_tuned, *, enabled: bool = True
) -> tuple[CommandExecutor, Tuner, KernelTree, list[ProbeOutcome]]:
    tree = KernelTree(make_host(tmp_path / "host"))
    tuner = Tuner(enabled=enabled, tree=tree, actuators=lambda gpus: os_actuators(), state_dir=tmp_path / "t")
    delivered: list[ProbeOutcome] = []
    ctx = CommandContext(probes=TreeProbes(tree, value), deliver_probes=delivered.extend, tuner=tuner)
    return CommandExecutor(ctx, state_dir=tmp_path / "commands"), tuner, tree, delivered


def apply(ex: CommandExecutor, cid: str, **fields: object) -> pb.CommandResult:
    request = pb.ApplyProfile(profile="site-swap", targets_json=json.dumps(TARGETS), **fields)  # type: ignore[arg-type]
    return asyncio.run(ex.execute(pb.Command(id=cid, apply_profile=request)))


def test_an_apply_that_brings_the_gpus_back_to_normal_is_committed_and_kept(tmp_path: Path) -> None:
    ex, tuner, tree, delivered = setup(tmp_path)
    assert "apply_profile" in ex.capabilities
    result = apply(ex, "c1", verify=[bar(0), bar(3)], gpus=[0, 3])
    answer = result.apply_profile
    assert result.ok and answer.state == "committed", answer
    assert [(c.setting, c.current, c.target) for c in answer.changes] == [
        ("os.sysctls.vm.swappiness", "60", "10")
    ]
    assert [(c.gpu, c.value, c.passed) for c in answer.checks] == [(0, 100.0, True), (3, 100.0, True)]
    assert tree.read(SWAPPINESS).strip() == "10"
    assert [(o.gpu, o.command_id) for o in delivered] == [(0, "c1"), (3, "c1")]  # the re-probe rides along
    [kept] = tuner.desired.load()  # type: ignore[union-attr]
    assert (kept.profile, kept.targets["os"]["sysctls"]["vm.swappiness"]["target"]) == ("site-swap", 10)


def test_an_apply_that_misses_a_bar_is_rolled_back_to_the_snapshot(tmp_path: Path) -> None:
    ex, tuner, tree, _ = setup(tmp_path, value=lambda tree: 70.0)
    before = contents(tree.root)
    result = apply(ex, "c1", verify=[bar(0)])
    answer = result.apply_profile
    assert not result.ok and answer.state == "rolled_back"
    assert "gemm/bf16 on GPU 0: 70 is outside fleet normal (95), before 60" in answer.problems
    assert result.error.startswith("rolled_back: ")
    assert contents(tree.root) == before
    assert tuner.desired.load() == []  # type: ignore[union-attr]


def test_measurably_better_than_before_counts_as_fixed(tmp_path: Path) -> None:
    ex, _, _, _ = setup(tmp_path, value=lambda tree: 80.0 if tree.read(SWAPPINESS).strip() == "10" else 60.0)
    assert (
        apply(ex, "c1", verify=[bar(0, better_by=0.2)]).apply_profile.state == "committed"
    )  # 80 >= 60 x 1.2
    ex2, _, _, _ = setup(
        tmp_path / "b", value=lambda tree: 70.0 if tree.read(SWAPPINESS).strip() == "10" else 60.0
    )
    assert apply(ex2, "c1", verify=[bar(0, better_by=0.2)]).apply_profile.state == "rolled_back"


def test_a_failed_re_probe_never_passes(tmp_path: Path) -> None:
    checks = check_bars([bar(0), bar(1)], [outcome(0, 0.0, error="CUDA error: out of memory")])
    assert [(c.passed, c.error) for c in checks] == [
        (False, "CUDA error: out of memory"),
        (False, "not measured by the re-probe"),
    ]
    lower = pb.ProbeBar(probe="gemm", variant="bf16", gpu=0, normal=5.0, higher_is_better=False)
    assert [c.passed for c in check_bars([lower], [outcome(0, 4.0)])] == [True]
    assert [c.passed for c in check_bars([lower], [outcome(0, 6.0)])] == [False]


def test_tuning_off_refuses_and_writes_nothing_but_a_dry_run_still_plans(tmp_path: Path) -> None:
    ex, _, tree, _ = setup(tmp_path, enabled=False)
    assert "apply_profile" not in ex.capabilities
    before = stamps(tree.root)
    result = apply(ex, "c1")
    assert (result.ok, result.apply_profile.state) == (False, "refused")
    assert "tuning.enabled: false" in result.error
    planned = apply(ex, "c2", dry_run=True)
    assert (planned.ok, planned.apply_profile.state) == (True, "planned")
    assert [c.target for c in planned.apply_profile.changes] == ["10"]
    assert stamps(tree.root) == before and tree.writes == []
    assert not (tmp_path / "t" / "journal").exists()


@pytest.mark.parametrize(
    ("targets_json", "message"),
    [
        ("not json", "targets_json is not valid"),
        ('{"firmware": {}}', "unknown level(s) firmware"),
        ('{"os": {"sysctls": {"kernel.panic": 1}}}', "sysctl 'kernel.panic' is not in the allowlist"),
    ],
)
def test_bad_targets_are_refused_before_any_write(tmp_path: Path, targets_json: str, message: str) -> None:
    ex, _, tree, _ = setup(tmp_path)
    before = stamps(tree.root)
    request = pb.ApplyProfile(profile="p", targets_json=targets_json)
    result = asyncio.run(ex.execute(pb.Command(id="c1", apply_profile=request)))
    assert result.apply_profile.state == "refused"
    assert any(message in p for p in result.apply_profile.problems), result.apply_profile.problems
    assert stamps(tree.root) == before


def test_committed_settings_lost_at_a_reboot_are_put_back_at_start(tmp_path: Path) -> None:
    ex, tuner, tree, _ = setup(tmp_path)
    assert apply(ex, "c1").apply_profile.state == "committed"
    tree.write(SWAPPINESS, "60")  # the reboot: /proc/sys back at the kernel's default
    [(profile, result)] = tuner.reapply()
    assert (profile, result.state) == ("site-swap", "applied")
    assert tree.read(SWAPPINESS).strip() == "10"
    assert tuner.reapply() == []  # at target: nothing to do, nothing reported


def test_an_apply_killed_mid_way_is_rolled_back_at_start(tmp_path: Path) -> None:
    ex, tuner, tree, _ = setup(tmp_path)
    before = contents(tree.root)

    class Killed(BaseException):
        pass

    tree.fail_write_at, tree.fault = 1, Killed()
    with pytest.raises(Killed):
        apply(ex, "c1")
    tree.fail_write_at = None
    tree.write(SWAPPINESS, "10")  # the write that was under way when the process died landed
    [recovered] = tuner.recover()
    assert recovered.state == "rolled_back"
    assert contents(tree.root) == before


def test_the_handler_is_registered_as_mutating() -> None:
    handler = discover()["apply_profile"]
    assert handler.mutating


def test_bare_and_full_settings_read_alike() -> None:
    """A bare clock range is a mapping too: it must not be mistaken for a {target, reason} setting."""
    bare = Targets.from_dict({"gpu": {"locked_gpu_clocks": {"min_mhz": "base", "max_mhz": 1980}}})
    full = Targets.from_dict(
        {
            "gpu": {
                "locked_gpu_clocks": {
                    "target": {"min_mhz": "base", "max_mhz": 1980},
                    "reason": "r",
                    "source": "s",
                }
            }
        }
    )
    assert bare.gpu.locked_gpu_clocks == full.gpu.locked_gpu_clocks == ("base", 1980)
