"""One registry of simulator faults at every level: what each is, the cause the controller should
report, the --fault syntax with its targets, and `gpufleet agent --sim --list-faults`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent import cli
from agent.compose.bmc import build_bmc
from agent.compose.sources import build_sources
from agent.config import ConfigError, load
from agent.sources.sim import FAULTS, FaultSpec
from agent.sources.sim.bmc import SimBmc
from agent.sources.sim.faults import LEVELS
from agent.sources.sim.host import SimHost
from protos.names import CAUSES

# The faults the issue asks for, by level (and the GPU faults the contract named from the start).
REQUIRED = {
    "gpu": {
        "thermal_throttle",
        "power_brake",
        "power_cap",
        "clocks_locked_low",
        "pcie_downtrained",
        "nvlink_down",
        "ecc_row_remap_pending",
        "hbm_degraded",
        "xid_79",
        "xid_48",
        "nvlink_crc_errors",
        "vbios_drift",
    },
    "host": {"cpu_governor_powersave", "numa_balancing_on", "thp_disabled"},
    "network": {"ib_port_down", "ib_port_degraded"},
    "bmc": {"fan_failure", "psu_failure", "inlet_temperature_high", "bios_drift", "bmc_firmware_drift"},
}


def test_every_level_has_its_faults_and_each_fault_a_cause() -> None:
    for level, names in REQUIRED.items():
        assert names <= {n for n, f in FAULTS.items() if f.level == level}, level
    for fault in FAULTS.values():
        assert fault.level in LEVELS and fault.description and fault.shows_in
        assert fault.cause in CAUSES, fault.name
    # GPU faults keep their contract names: the name is the cause.
    for name in REQUIRED["gpu"] - {"xid_79", "xid_48", "nvlink_crc_errors", "vbios_drift"}:
        assert FAULTS[name].cause == name


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("power_cap", FaultSpec("power_cap")),
        ("nvlink_down:5", FaultSpec("nvlink_down", 5)),
        ("ib_port_down:mlx5_1", FaultSpec("ib_port_down", "mlx5_1")),
        ("fan_failure:3", FaultSpec("fan_failure", "3")),
        ("psu_failure", FaultSpec("psu_failure")),
        ("bios_drift:TurboMode", FaultSpec("bios_drift", "TurboMode")),
        ("numa_balancing_on", FaultSpec("numa_balancing_on")),
    ],
)
def test_fault_spec_parses_each_levels_target(text: str, spec: FaultSpec) -> None:
    assert FaultSpec.parse(text) == spec
    assert spec.text() == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus", "unknown fault 'bogus'"),
        ("power_cap:x", "the GPU after ':' must be an index"),
        ("numa_balancing_on:1", "numa_balancing_on (host level) takes no target"),
        ("bmc_firmware_drift:BMC_0", "(bmc level) takes no target"),
        ("ib_port_down:mlx5_9", "unknown PORT 'mlx5_9'; expected one of mlx5_0"),
        ("fan_failure:11", "unknown FAN '11'"),
        ("psu_failure:0", "unknown PSU '0'"),
        ("bios_drift:Overclock", "unknown ATTRIBUTE 'Overclock'"),
    ],
)
def test_fault_spec_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FaultSpec.parse(text)


def test_gpu_index_only_for_gpu_faults() -> None:
    assert FaultSpec("power_cap", 2).gpu == 2 and FaultSpec("ib_port_down", "mlx5_2").gpu is None


def list_faults(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def test_list_faults_json_lists_every_level_with_causes(capsys: pytest.CaptureFixture[str]) -> None:
    body: dict[str, Any] = json.loads(list_faults(["--sim", "--list-faults", "-o", "json"], capsys))
    faults = body["faults"]
    assert [f["name"] for f in faults] == list(FAULTS)
    assert {f["level"] for f in faults} == set(LEVELS)
    assert [f["level"] for f in faults] == sorted((f["level"] for f in faults), key=LEVELS.index)
    for f in faults:
        assert set(f) == {"name", "level", "cause", "description", "target", "choices", "shows_in"}
        assert f["cause"] == FAULTS[f["name"]].cause and f["description"]
    by_name = {f["name"]: f for f in faults}
    assert (by_name["ib_port_down"]["target"], by_name["numa_balancing_on"]["target"]) == ("port", None)
    assert by_name["ib_port_down"]["choices"] == [f"mlx5_{i}" for i in range(8)]
    assert by_name["fan_failure"]["choices"] == [str(i) for i in range(1, 11)]
    assert (by_name["power_cap"]["target"], by_name["power_cap"]["choices"]) == ("gpu", [])


def test_output_format_goes_with_list_faults(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--sim", "--once", "-o", "json"]) == 2
    assert "-o goes with --list-faults" in capsys.readouterr().err


def test_list_faults_table_shows_syntax_level_cause(capsys: pytest.CaptureFixture[str]) -> None:
    lines = list_faults(["--sim", "--list-faults"], capsys).splitlines()
    assert lines[0].split() == ["FAULT", "LEVEL", "CAUSE", "DESCRIPTION"]
    assert len(lines) == 1 + len(FAULTS)
    rows = {line.split()[0]: line.split()[1:3] for line in lines[1:]}
    assert rows["ib_port_down[:PORT]"] == ["network", "ib_link_degraded"]
    assert rows["fan_failure[:FAN]"] == ["bmc", "fan_failure"]
    assert rows["cpu_governor_powersave"] == ["host", "cpu_governor_powersave"]
    assert rows["xid_79[:GPU]"] == ["gpu", "xid_error"]


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--fault=thp_disabled:0", "takes no target"),
        ("--fault=ib_port_down:eth0", "unknown PORT 'eth0'"),
    ],
)
def test_bad_fault_flags_exit_2(flag: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--sim", "--once", flag]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("gpufleet agent: ") and message in err


def test_config_faults_reach_host_and_bmc() -> None:
    faults = [
        {"fault": "cpu_governor_powersave"},
        {"fault": "ib_port_down", "target": "mlx5_4"},
        {"fault": "fan_failure", "target": "7"},
        {"fault": "xid_48", "gpu": 1},
    ]
    config = load(None, {"node": "n3", "source": "sim", "sim": {"gpus": 2, "faults": faults}})
    gpu, host, _ = build_sources(config)
    bmc = build_bmc(config, gpu)
    assert isinstance(host, SimHost) and isinstance(bmc, SimBmc)
    assert host.condition.governor == "powersave" and host.condition.down_ib_ports == {"mlx5_4"}
    assert bmc.condition.failed_fans == {6}
    assert [e.code for e in gpu.read()[1].xid_events] == [48]


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"fault": "fan_failure", "gpu": 1}, "bmc fault: it takes no gpu"),
        ({"fault": "power_cap", "gpu": 1, "target": "1"}, "not both"),
        ({"fault": "ib_port_down", "target": "mlx5_12"}, "unknown PORT"),
    ],
)
def test_config_faults_are_checked(fault: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(None, {"source": "sim", "sim": {"faults": [fault]}})
