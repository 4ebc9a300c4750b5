"""The run's plan: variants per device, modes, and shares of the per-GPU budget."""

from __future__ import annotations

import pytest

from agent.probes.suite import PLANNED, SHARES, Ledger, Step, plan

H100_VARIANTS = {"gemm": ["bf16", "fp16", "tf32", "fp8"], "membw": ["d2d"], "pcie": ["h2d", "d2h"]}
NODE_LEVEL = {"gemm": False, "membw": False, "pcie": False, "nccl": True}


def variants(probe: str, device: str) -> list[str]:
    if probe == "nccl":
        return ["all_reduce"]
    if device == "cpu":
        return {"gemm": ["fp32", "bf16"], "membw": ["d2d"], "pcie": ["h2h"]}[probe]
    if probe == "gemm" and device == "cuda:1":
        return ["bf16", "fp16", "tf32"]  # an older GPU beside: no fp8
    return H100_VARIANTS[probe]


def test_the_short_suite_on_a_node_fits_its_budget_per_gpu() -> None:
    devices = ["cuda:0", "cuda:1"]
    steps = plan(["gemm", "membw", "pcie", "nccl"], devices, variants, NODE_LEVEL, 10.0)
    per_device = {d: sum(s.budget_seconds for s in steps if d in s.devices) for d in devices}
    assert per_device["cuda:0"] == pytest.approx(10.0 * PLANNED)  # the busiest GPU: 90% planned
    assert per_device["cuda:1"] < per_device["cuda:0"]
    gemm = [s for s in steps if s.probe == "gemm"]
    assert [(s.variant, s.devices, s.mode) for s in gemm] == [
        ("bf16", ("cuda:0", "cuda:1"), "concurrent"),
        ("fp16", ("cuda:0", "cuda:1"), "concurrent"),
        ("tf32", ("cuda:0", "cuda:1"), "concurrent"),
        ("fp8", ("cuda:0",), "concurrent"),
    ]
    copies = [(s.probe, s.variant, s.mode) for s in steps if s.probe in ("membw", "pcie")]
    assert copies == [("membw", "d2d", "isolated"), ("pcie", "h2d", "isolated"), ("pcie", "d2h", "isolated")]
    (nccl,) = [s for s in steps if s.probe == "nccl"]
    assert (nccl.node_level, nccl.devices, nccl.mode) == (True, ("cuda:0", "cuda:1"), "concurrent")


def test_a_few_probes_keep_their_share_rather_than_take_the_whole_budget() -> None:
    (step,) = plan(["membw"], ["cuda:0"], variants, NODE_LEVEL, 10.0)
    assert step.budget_seconds == pytest.approx(10.0 * SHARES["membw"])


def test_cpu_plan() -> None:
    steps = plan(["gemm", "pcie", "nccl"], ["cpu"], variants, NODE_LEVEL, 10.0)
    assert [(s.probe, s.variant, s.devices) for s in steps] == [
        ("gemm", "fp32", ("cpu",)),
        ("gemm", "bf16", ("cpu",)),
        ("pcie", "h2h", ("cpu",)),
        ("nccl", "all_reduce", ("cpu",)),
    ]


def test_the_ledger_cuts_a_step_to_what_is_left() -> None:
    ledger = Ledger(10.0)
    step = Step("gemm", "bf16", ("cuda:0", "cuda:1"), False, "concurrent", 1.5)
    assert ledger.allowance(step) == 1.5
    ledger.charge(["cuda:1"], 9.0)
    assert ledger.allowance(step) == pytest.approx(1.0)
    ledger.charge(["cuda:1"], 2.0)
    assert ledger.allowance(step) == 0.0


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="budget"):
        plan(["gemm"], ["cpu"], variants, NODE_LEVEL, 0.0)
