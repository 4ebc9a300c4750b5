"""Agent config: YAML plus flag overrides, defaults, and a clear ConfigError for every bad value."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from agent import cli
from agent.config import AgentConfig, ConfigError, load
from agent.sources.sim.faults import FAULTS

FULL_YAML = """\
node: gpu-node-07
source: sim
interval_seconds: 2.5
host_root: /host
log_level: debug
collectors:
  host:
    enabled: false
sim:
  gpus: 4
  seed: 11
  load: 0.5
  faults:
    - fault: thermal_throttle
      gpu: 2
    - fault: power_cap
stream:
  controller: controller.example:50051
  tls_ca: /etc/gpufleet/tls/ca.crt
  tls_cert: /etc/gpufleet/tls/node.crt
  tls_key: /etc/gpufleet/tls/node.key
  spool_dir: /var/lib/gpufleet/spool
  spool_max_frames: 100
  backoff_initial_seconds: 0.25
  backoff_max_seconds: 5
"""


def write(tmp_path: Path, text: str, name: str = "agent.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_error(path: Path | None, overrides: dict[str, Any] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load(path, overrides)
    return str(info.value)


# -- loading ----------------------------------------------------------------------------------


def test_defaults_without_a_file() -> None:
    config = load(None)
    assert config.node == socket.gethostname()
    assert config.source == "nvml"
    assert config.interval_seconds == 10.0
    assert config.host_root == "/"
    assert config.log_level == "info"
    assert (config.sim.gpus, config.sim.seed, config.sim.load, config.sim.faults) == (8, 0, 0.95, [])
    assert config.stream.controller is None and config.stream.spool_dir is None
    assert config.stream.spool_max_frames == 8640
    assert config.enabled_collectors(["gpu", "host"]) == ["gpu", "host"]


def test_an_empty_file_means_defaults(tmp_path: Path) -> None:
    assert load(write(tmp_path, "")) == load(None)
    assert load(write(tmp_path, "# only a comment\n", "c.yaml")) == load(None)


def test_every_key_is_read_from_yaml(tmp_path: Path) -> None:
    config = load(write(tmp_path, FULL_YAML))
    assert config.node == "gpu-node-07"
    assert config.source == "sim"
    assert config.interval_seconds == 2.5
    assert config.host_root == "/host"
    assert config.log_level == "debug"
    assert config.enabled_collectors(["gpu", "host"]) == ["gpu"]
    assert (config.sim.gpus, config.sim.seed, config.sim.load) == (4, 11, 0.5)
    assert [(f.fault, f.gpu) for f in config.sim.faults] == [("thermal_throttle", 2), ("power_cap", None)]
    stream = config.stream
    assert stream.controller == "controller.example:50051"
    assert (stream.tls_ca, stream.tls_cert, stream.tls_key, stream.insecure) == (
        "/etc/gpufleet/tls/ca.crt",
        "/etc/gpufleet/tls/node.crt",
        "/etc/gpufleet/tls/node.key",
        False,
    )
    assert stream.spool_dir == "/var/lib/gpufleet/spool"
    assert stream.spool_max_frames == 100
    assert (stream.backoff_initial_seconds, stream.backoff_max_seconds) == (0.25, 5.0)


def test_overrides_merge_into_nested_sections_and_win(tmp_path: Path) -> None:
    path = write(tmp_path, FULL_YAML)
    config = load(path, {"node": "other", "sim": {"gpus": 8}, "stream": {"controller": "10.0.0.1:9"}})
    assert config.node == "other"
    assert config.sim.gpus == 8
    assert config.sim.seed == 11  # the rest of the file's sim section stays
    assert len(config.sim.faults) == 2
    assert config.stream.controller == "10.0.0.1:9"
    assert config.stream.tls_ca == "/etc/gpufleet/tls/ca.crt"  # the file's TLS keys stay too
    assert config.stream.spool_dir == "/var/lib/gpufleet/spool"
    assert config.interval_seconds == 2.5


def test_an_integer_is_accepted_where_seconds_are_expected(tmp_path: Path) -> None:
    config = load(write(tmp_path, "interval_seconds: 3\n"))
    assert config.interval_seconds == 3.0 and isinstance(config.interval_seconds, float)


# -- file problems ----------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    message = config_error(tmp_path / "nope.yaml")
    assert "cannot read config" in message and "nope.yaml" in message


def test_invalid_yaml(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, "node: [unclosed\n"))
    assert "not valid YAML" in message and "agent.yaml" in message


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    assert "must be a mapping at the top level" in config_error(write(tmp_path, text))


# -- invalid values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("intervl: 3\n", "unknown field `intervl`"),
        ("stream:\n  controler: a:1\n", "unknown field `controler`"),
        ("sim:\n  gpu: 2\n", "unknown field `gpu`"),
        ("collectors:\n  host:\n    enable: false\n", "unknown field `enable`"),
    ],
)
def test_unknown_keys_are_named(tmp_path: Path, text: str, expected: str) -> None:
    message = config_error(write(tmp_path, text))
    assert expected in message
    assert "agent.yaml" in message  # the message says which file


def test_an_unknown_collector_is_refused_at_load(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, "collectors:\n  gpuz:\n    enabled: false\n"))
    assert "gpuz" in message
    assert "gpu, host" in message  # and what the registered names are


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("interval_seconds: fast\n", "$.interval_seconds"),
        ("source: cuda\n", "$.source"),
        ("log_level: verbose\n", "$.log_level"),
        ("sim:\n  gpus: 2.5\n", "$.sim.gpus"),
        ("sim:\n  gpus: true\n", "$.sim.gpus"),
        ("sim:\n  faults: thermal_throttle\n", "$.sim.faults"),
        ("stream:\n  spool_max_frames: many\n", "$.stream.spool_max_frames"),
        ("collectors:\n  host:\n    enabled: sometimes\n", "$.collectors"),
        ("collectors: [gpu, host]\n", "$.collectors"),
    ],
)
def test_bad_types_name_the_field(tmp_path: Path, text: str, where: str) -> None:
    message = config_error(write(tmp_path, text))
    assert message.startswith("invalid agent config")
    assert where in message


@pytest.mark.parametrize("interval", [0, -1, 0.01, 3601])
def test_interval_out_of_range(interval: float) -> None:
    assert "interval_seconds must be within" in config_error(None, {"interval_seconds": interval})


@pytest.mark.parametrize("interval", [float("nan"), float("inf")])
def test_interval_not_a_finite_number(interval: float) -> None:
    assert "interval_seconds must be a finite number" in config_error(None, {"interval_seconds": interval})


def test_bad_fault_name_lists_the_known_faults(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, "sim:\n  faults:\n    - fault: overheating\n"))
    assert "unknown fault 'overheating'" in message
    assert all(name in message for name in FAULTS)
    assert "$.sim.faults[0]" in message


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"sim": {"gpus": 0}}, "sim.gpus must be within 1..64"),
        ({"sim": {"gpus": 65}}, "sim.gpus must be within 1..64"),
        ({"sim": {"load": 1.5}}, "sim.load must be within 0..1"),
        ({"sim": {"gpus": 2, "faults": [{"fault": "power_cap", "gpu": 2}]}}, "gpu 2 out of range"),
        ({"sim": {"faults": [{"fault": "power_cap", "gpu": -1}]}}, "gpu must be >= 0"),
        ({"stream": {"controller": "nohost"}}, "stream.controller must be HOST:PORT"),
        ({"stream": {"controller": ":50051"}}, "stream.controller must be HOST:PORT"),
        ({"stream": {"controller": "host:http"}}, "stream.controller must be HOST:PORT"),
        ({"stream": {"controller": "host:70000"}}, "stream.controller must be HOST:PORT"),
        ({"stream": {"spool_max_frames": 0}}, "spool_max_frames must be >= 1"),
        ({"stream": {"backoff_initial_seconds": 0}}, "backoff_initial_seconds"),
        ({"stream": {"backoff_initial_seconds": 5, "backoff_max_seconds": 1}}, "backoff_initial_seconds"),
    ],
)
def test_out_of_range_values(overrides: dict[str, Any], expected: str) -> None:
    assert expected in config_error(None, overrides)


def test_ipv6_controller_address_is_accepted() -> None:
    assert load(None, {"stream": {"controller": "[::1]:50051"}}).stream.controller == "[::1]:50051"


# -- plaintext only to loopback, or chosen with --insecure ---------------------------------------


@pytest.mark.parametrize(
    "stream",
    [
        {"controller": "127.0.0.1:50051"},
        {"controller": "localhost:50051"},
        {"controller": "[::1]:50051"},
        {"controller": "10.0.0.1:9", "insecure": True},
        {"controller": "ctl.example:50051", "tls_ca": "ca.pem"},
        {"controller": "ctl.example:50051", "tls_ca": "ca.pem", "tls_cert": "n.pem", "tls_key": "n.key"},
        {"tls_ca": "ca.pem"},  # not streaming: nothing to check against
    ],
)
def test_plaintext_to_loopback_or_insecure_tls_elsewhere(stream: dict[str, Any]) -> None:
    assert load(None, {"stream": stream}).stream.controller == stream.get("controller")


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        ({"controller": "10.0.0.1:9"}, "stream.controller 10.0.0.1:9 is not a loopback address"),
        ({"controller": "ctl.example:50051"}, "or choose plaintext explicitly with --insecure"),
        ({"controller": "ctl.example:1", "tls_ca": "c", "insecure": True}, "exclude each other"),
        ({"controller": "ctl.example:1", "tls_ca": "c", "tls_cert": "n.pem"}, "go together"),
        ({"controller": "ctl.example:1", "tls_cert": "n.pem", "tls_key": "n.key"}, "needs stream.tls_ca"),
    ],
)
def test_plaintext_elsewhere_needs_insecure(stream: dict[str, Any], expected: str) -> None:
    assert expected in config_error(None, {"stream": stream})


def test_insecure_flag_allows_plaintext_to_another_host(capsys: pytest.CaptureFixture[str]) -> None:
    assert flags_config(["--controller=10.0.0.1:9", "--insecure"]).stream.insecure
    code, _, err = run_main(["--sim", "--once", "--controller=10.0.0.1:9"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--insecure" in err


# -- command-line flags -----------------------------------------------------------------------


def flags_config(argv: list[str], path: Path | None = None) -> AgentConfig:
    """The config `gpufleet agent ARGV` would run with (before --fault, which main applies)."""
    args = cli.build_parser().parse_args(argv)
    return load(path, cli._overrides(args))


def test_flags_map_to_config_keys(tmp_path: Path) -> None:
    config = flags_config(
        [
            "--sim",
            "--node=n9",
            "--controller=ctl:7000",
            "--tls-ca=ca.pem",
            "--tls-cert=n9.pem",
            "--tls-key=n9.key",
            "--interval=0.5",
            f"--spool-dir={tmp_path}",
            "--gpus=3",
            "--seed=5",
            "--log-level=warning",
        ]
    )
    assert config.source == "sim"
    assert config.node == "n9"
    assert config.stream.controller == "ctl:7000"
    stream = config.stream
    assert (stream.tls_ca, stream.tls_cert, stream.tls_key) == ("ca.pem", "n9.pem", "n9.key")
    assert config.interval_seconds == 0.5
    assert config.stream.spool_dir == str(tmp_path)
    assert (config.sim.gpus, config.sim.seed) == (3, 5)
    assert config.log_level == "warning"


def test_flags_override_the_file_and_absent_flags_leave_it_alone(tmp_path: Path) -> None:
    path = write(tmp_path, FULL_YAML)
    assert flags_config([], path) == load(path)
    config = flags_config(["--interval=1", "--gpus=3"], path)
    assert config.interval_seconds == 1.0
    assert config.sim.gpus == 3
    assert config.sim.seed == 11
    assert config.node == "gpu-node-07"


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--sim", "--once", "--interval=0"], "interval_seconds must be within"),
        (["--sim", "--once", "--interval=-2"], "interval_seconds must be within"),
        (["--sim", "--once", "--interval=nan"], "interval_seconds must be a finite number, not nan"),
        (["--sim", "--once", "--controller=nohost"], "stream.controller must be HOST:PORT"),
        (["--sim", "--once", "--gpus=0"], "sim.gpus must be within"),
        # before: accepted, then every Hello refused by the controller (INVALID_ARGUMENT), retried forever
        (
            ["--sim", "--once", "--node=" + "n" * 254],
            "node must be at most 253 characters (a DNS name), not 254",
        ),
        (["--sim", "--once", "--fault=overheating"], "unknown fault 'overheating'"),
        (["--sim", "--once", "--fault=power_cap:x"], "must be an index"),
        (["--sim", "--once", "--gpus=2", "--fault=power_cap:2"], "gpu out of range"),
        (["--once", "--fault=power_cap"], "--fault needs --sim"),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(argv, capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("gpufleet agent: ") and expected in err
    assert err.count("\n") == 1


def test_bad_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "collectors:\n  gpuz: {}\n")
    code, _, err = run_main(["--sim", "--once", f"--config={path}"], capsys)
    assert code == 2
    assert "gpuz" in err and "Traceback" not in err


def test_once_json_applies_flags_and_faults(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(
        ["--sim", "--once", "--json", "--node=n-test", "--gpus=2", "--fault=thermal_throttle:1"], capsys
    )
    assert code == 0
    body = json.loads(out)
    assert body["node"] == "n-test"
    assert body["inventory"]["source"] == "sim"
    gpus = body["snapshot"]["gpus"]
    assert [g["index"] for g in gpus] == [0, 1]
    # The injected fault lands on GPU 1 only: hot, with the HW thermal slowdown bit (64).
    assert gpus[1]["temperature_celsius"] > gpus[0]["temperature_celsius"] + 10
    assert gpus[1]["clock_event_reasons"] & 64 and not gpus[0]["clock_event_reasons"] & 64


def test_once_without_json_prints_one_line_per_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["--sim", "--once", "--gpus=3"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[:2] for line in lines] == [["gpu", "0"], ["gpu", "1"], ["gpu", "2"]]
    assert all(" MHz " in line and line.endswith(" C") for line in lines)


# -- metrics ----------------------------------------------------------------------------------


def test_metrics_defaults_to_dcgm_exporters_port_without_compat() -> None:
    config = load(None)
    assert config.metrics.address == "0.0.0.0:9400"
    assert config.metrics.dcgm_compat is False


@pytest.mark.parametrize(
    ("text", "address", "compat"),
    [
        ("metrics:\n  address: 127.0.0.1:9500\n  dcgm_compat: true\n", "127.0.0.1:9500", True),
        ("metrics:\n  address: null\n", None, False),
        ("metrics:\n  address: none\n", None, False),
        ("metrics:\n  address: '[::]:9400'\n", "[::]:9400", False),
    ],
)
def test_metrics_from_yaml(tmp_path: Path, text: str, address: str | None, compat: bool) -> None:
    config = load(write(tmp_path, text))
    assert (config.metrics.address, config.metrics.dcgm_compat) == (address, compat)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"metrics": {"address": "nonsense"}}, "metrics.address must be HOST:PORT"),
        ({"metrics": {"address": "host:99999"}}, "metrics.address must be HOST:PORT"),
        ({"metrics": {"address": ":9400"}}, "metrics.address must be HOST:PORT"),
        ({"metrics": {"dcgm_compat": "yes"}}, "$.metrics.dcgm_compat"),
        ({"metrics": {"adress": "a:1"}}, "unknown field `adress`"),
    ],
)
def test_bad_metrics_config(overrides: dict[str, Any], expected: str) -> None:
    assert expected in config_error(None, overrides)


@pytest.mark.parametrize(
    ("argv", "address", "compat"),
    [
        ([], "0.0.0.0:9400", False),
        (["--metrics-address=127.0.0.1:9555"], "127.0.0.1:9555", False),
        (["--metrics-address", "none", "--dcgm-compat"], None, True),
        (["--metrics-address=NONE"], None, False),
    ],
)
def test_metrics_flags(argv: list[str], address: str | None, compat: bool) -> None:
    config = flags_config(["--sim", *argv])
    assert (config.metrics.address, config.metrics.dcgm_compat) == (address, compat)


def test_metrics_flags_override_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "metrics:\n  address: 127.0.0.1:9500\n  dcgm_compat: true\n")
    config = flags_config(["--metrics-address=none"], path)
    assert config.metrics.address is None and config.metrics.dcgm_compat is True  # no flag: the file's


def test_bad_metrics_address_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["--sim", "--metrics-address=nonsense"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("gpufleet agent: ") and "metrics.address must be HOST:PORT" in err


# -- probes -----------------------------------------------------------------------------------


def test_probe_defaults_and_yaml(tmp_path: Path) -> None:
    probes = load(None).probes
    assert (probes.enabled, probes.max_utilization, probes.drained) == (True, 0.10, False)
    assert (probes.short_budget_seconds, probes.full_budget_seconds) == (10.0, 60.0)
    text = "probes:\n  drained: true\n  max_utilization: 0.25\n  short_budget_seconds: 5\n"
    probes = load(write(tmp_path, text)).probes
    assert (probes.drained, probes.max_utilization, probes.short_budget_seconds) == (True, 0.25, 5.0)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"max_utilization": 10}, "probes.max_utilization"),
        ({"short_budget_seconds": 0}, "short_budget_seconds"),
        ({"short_budget_seconds": 90}, "full_budget_seconds"),
        ({"timeout_seconds": 0}, "probes.timeout_seconds"),
        ({"sample_interval_seconds": 0}, "sample_interval_seconds"),
    ],
)
def test_bad_probe_config(overrides: dict[str, Any], expected: str) -> None:
    assert expected in config_error(None, {"probes": overrides})


def test_disabled_probes_say_so() -> None:
    from agent.compose.probes import real_probes
    from agent.config import ProbesConfig

    runner = real_probes(ProbesConfig(enabled=False))
    assert runner.available() == []
    with pytest.raises(RuntimeError, match=r"probes\.enabled: false"):
        runner.run([])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bmc:\n  read_timeout_seconds: .nan\n", "bmc.read_timeout_seconds must be a finite number, not nan"),
        ("probes:\n  timeout_seconds: .inf\n", "probes.timeout_seconds must be a finite number, not inf"),
        (
            "stream:\n  backoff_max_seconds: -.inf\n",
            "stream.backoff_max_seconds must be a finite number, not -inf",
        ),
    ],
)
def test_nan_or_infinity_anywhere_in_the_file_is_refused_naming_the_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    """Before, NaN passed every `x <= 0` range check: a BMC read 'within nan s'."""
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load(write(tmp_path, text))
