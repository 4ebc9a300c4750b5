"""The demo reads its faults from the agent (a subprocess: `agent --sim --list-faults -o json`) and
injects only those the controller's detectors find."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from agent.sources.sim import FAULTS
from controller.demo.catalogue import AgentFault, agent_faults, detectable, parse
from controller.demo.probe_rounds import ProbeRounds
from controller.demo.runner import Watched, _report
from controller.detect import DETECTED


def test_the_demo_reads_the_agents_list() -> None:
    faults = agent_faults()
    assert [f.name for f in faults] == list(FAULTS)
    assert {f.level for f in faults} == {"gpu", "host", "network", "bmc"}
    assert all(f.cause == FAULTS[f.name].cause and f.shows_in == FAULTS[f.name].shows_in for f in faults)


def test_only_what_the_detectors_find_is_injected() -> None:
    kinds = detectable(agent_faults())
    assert kinds and all(set(k.shows_in) & DETECTED[k.cause] for k in kinds)
    names = {k.name for k in kinds}
    # Every fault of the simulator's registry has a detector reading one of the fields it shows in:
    # XIDs, NVLink errors on links that stay up, host, network and BMC faults included.
    assert names == set(FAULTS)


def test_a_detected_cause_is_not_enough_without_a_field_it_reads() -> None:
    up_but_erroring = AgentFault("nvlink_crc_errors", "gpu", "nvlink_down", ("nvlinks.crc_errors_total",))
    down = AgentFault("nvlink_down", "gpu", "nvlink_down", ("nvlinks.active",))
    assert detectable([up_but_erroring, down]) == [down]


def test_a_failing_agent_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with pytest.raises(RuntimeError, match="could not ask the agent for its faults"):
        agent_faults()


def test_parse_reads_the_json_shape() -> None:
    text = json.dumps({"faults": [{"name": "a", "level": "bmc", "cause": "fan_failure", "shows_in": ["x"]}]})
    assert parse(text) == [AgentFault("a", "bmc", "fan_failure", ("x",))]


def test_the_text_summary_starts_with_the_seed(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(json=False, nodes=2, gpus_per_node=1, seed=4242, tuning="off", kubernetes="off")
    assert _report(args, [], Watched(), ProbeRounds(), 1.0) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "gpufleet demo: seed 4242 (repeat this run with --seed 4242)"


def test_the_json_summary_carries_the_seed(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(json=True, nodes=2, gpus_per_node=1, seed=77, tuning="off", kubernetes="off")
    assert _report(args, [], Watched(), ProbeRounds(), 1.0) == 0
    assert json.loads(capsys.readouterr().out)["seed"] == 77
