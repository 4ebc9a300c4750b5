"""Probe facts are declared once, in the kernel's file: the registry finds every kernel module, the
Hello advertises each offered probe as a ProbeInfo, the simulator models the declared variants,
and a new probe kind (the test-only `latency`) needs nothing else."""

from __future__ import annotations

from pathlib import Path

from agent.config import load as load_config
from agent.daemon import Agent
from agent.probes.base import ProbeOutcome
from agent.probes.datasheet import DATASHEET
from agent.probes.datasheet import load as load_datasheet
from agent.probes.kernel import ProbeInfo, mode_of
from agent.probes.kernels import info, infos, is_node_level, names
from agent.probes.runner import TorchProbes
from agent.probes.suite import SHARES, share_of
from agent.sources.sim import SimNode
from agent.sources.sim.host import SimHost
from agent.sources.sim.node import MODELLED_PROBES, PROBE_VARIANTS
from agent.sources.sim.probes import NODE_LEVEL, ModelledProbes
from tests.probe_kind import NAME, UNIT, VARIANT, LatencyProbes, latency_registered

H100 = "NVIDIA H100 80GB HBM3"


def agent(probes: ModelledProbes) -> Agent:
    config = load_config(None, {"node": "n1", "source": "sim", "sim": {"gpus": 2}})
    return Agent(config, probes.node, SimHost(probes.node), probes)


def test_every_registered_probe_declares_its_facts() -> None:
    assert names() == ["gemm", "membw", "pcie", "nccl"]  # found by module, in the suite's order
    for name in names():
        facts = info(name)
        assert facts.name == name and facts.unit and facts.variants and facts.description, facts
        assert facts.node_level == is_node_level(name)
    assert info("gemm") == ProbeInfo(
        "gemm", "TFLOP/s", True, False, ("bf16", "fp16", "tf32", "fp8"), info("gemm").description
    )
    assert [i.name for i in infos() if i.node_level] == ["nccl"]
    assert all(i.higher_is_better for i in infos())
    assert SHARES == {"gemm": 0.15, "membw": 0.10, "pcie": 0.075, "nccl": 0.15}  # as each kernel declares
    assert [mode_of(n, is_node_level(n)) for n in names()] == [
        "concurrent",
        "isolated",
        "isolated",
        "concurrent",
    ]


def test_the_hello_carries_a_probe_info_per_offered_probe_with_its_declared_facts() -> None:
    hello = agent(ModelledProbes(SimNode("n1", gpus=2))).hello()
    assert [i.name for i in hello.probe_infos] == list(hello.probes) == ["gemm", "membw", "pcie", "nccl"]
    for sent in hello.probe_infos:
        declared = info(sent.name)
        assert (
            sent.unit,
            sent.higher_is_better,
            sent.node_level,
            tuple(sent.variants),
            sent.description,
        ) == (
            declared.unit,
            declared.higher_is_better,
            declared.node_level,
            declared.variants,
            declared.description,
        )
    nccl = next(i for i in hello.probe_infos if i.name == "nccl")
    assert nccl.node_level and nccl.unit == "GB/s" and nccl.higher_is_better


def test_the_simulator_models_what_the_kernels_declare() -> None:
    assert {n: info(n).variants for n in MODELLED_PROBES} == PROBE_VARIANTS
    assert frozenset({"nccl"}) == NODE_LEVEL
    assert ModelledProbes(SimNode("n1", gpus=2)).available() == list(MODELLED_PROBES)


def test_a_new_probe_kind_is_one_registration_and_the_hello_advertises_it() -> None:
    with latency_registered():
        assert names()[-1] == NAME  # after the suite's known order
        assert mode_of(NAME, False) == "isolated" and share_of(NAME) == 0.05
        hello = agent(LatencyProbes(SimNode("n1", gpus=2))).hello()
        latency = hello.probe_infos[-1]
        assert NAME in hello.probes
        assert (latency.name, latency.unit, latency.higher_is_better, latency.node_level) == (
            NAME,
            UNIT,
            False,
            False,
        )
        assert list(latency.variants) == [VARIANT]
    assert NAME not in names()


def test_an_unregistered_name_gets_a_bare_probe_info() -> None:
    assert info("warp") == ProbeInfo("warp")


def test_datasheet_entries_of_a_new_probe_kind_give_its_peak_ratio(tmp_path: Path) -> None:
    path = tmp_path / "datasheet.yaml"
    source = DATASHEET.read_text()  # the shipped datasheet, with one entry added as a new probe would
    marker = "  h100_sxm:\n"
    assert marker in source
    path.write_text(source.replace(marker, marker + f"    probes: {{{NAME}: {{{VARIANT}: 4.0}}}}\n", 1))
    sheet = load_datasheet(path)
    assert sheet.peak(H100, NAME, VARIANT) == 4.0
    assert sheet.peak(H100, NAME, "other") is None and sheet.peak(H100, "gemm", "bf16") == 989.4
    with latency_registered():
        runner = TorchProbes("cpu", datasheet=sheet)
        outcome = ProbeOutcome(NAME, VARIANT, 0, 8.0, UNIT, 0.1, 0.0)
        runner._compare(outcome, H100)
        assert outcome.peak_ratio == 0.5  # lower is better: best / measured
        gemm = ProbeOutcome("gemm", "bf16", 0, 494.7, "TFLOP/s", 0.1, 0.0)
        runner._compare(gemm, H100)
        assert gemm.peak_ratio == 0.5  # higher is better: measured / peak
