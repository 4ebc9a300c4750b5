"""Controller configuration: defaults, YAML, flag overrides, and clear errors for bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.app import ControllerApp
from controller.cli.run_controller import _overrides
from controller.config import ConfigError, ControllerConfig, DetectConfig, DetectorConfig, load
from controller.detect.base import discover
from controller.main import build_parser


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(text)
    return path


def test_defaults_without_a_file() -> None:
    config = load(None)
    assert config == ControllerConfig()
    assert (config.listen, config.db, config.db_synchronous) == ("127.0.0.1:50051", "gpufleet.db", "full")
    assert config.max_message_bytes == 4 * 1024 * 1024 and config.stale_after_seconds == 60.0
    assert config.detect.margin == 0.05 and config.detect.min_peers == 4
    assert config.probes.on_connect is True
    p = config.probes
    assert (p.periodic, p.interval_seconds, p.jitter_ratio, p.idle_utilization) == (True, 1800.0, 0.1, 0.1)
    assert (p.max_fleet_share, p.timeout_seconds, p.check_every_seconds) == (0.1, 600.0, 10.0)
    assert (p.probes, p.suite) == ([], "short")
    assert config.metrics_address == "0.0.0.0:9401"


def test_empty_file_is_defaults(tmp_path: Path) -> None:
    assert load(write(tmp_path, "# nothing set\n")) == ControllerConfig()


def test_yaml_file_and_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
listen: 0.0.0.0:6000
db: /var/lib/gpufleet/state.db
db_synchronous: normal
log_level: debug
detect:
  interval_seconds: 2.5
  margin: 0.1
  detectors:
    throttle: {enabled: false}
probes:
  on_connect: false
  interval_seconds: 900
  max_fleet_share: 0.25
  probes: [gemm, membw]
""",
    )
    config = load(str(path), {"listen": "127.0.0.1:7000"})
    assert config.listen == "127.0.0.1:7000"  # a flag beats the file
    assert (config.db, config.db_synchronous, config.log_level) == (
        "/var/lib/gpufleet/state.db",
        "normal",
        "debug",
    )
    assert (config.detect.interval_seconds, config.detect.margin) == (2.5, 0.1)
    assert config.detect.detectors == {"throttle": DetectorConfig(enabled=False)}
    assert config.probes.on_connect is False
    assert (config.probes.interval_seconds, config.probes.max_fleet_share) == (900.0, 0.25)
    assert config.probes.probes == ["gemm", "membw"]
    registered = sorted(discover())
    assert "throttle" in registered
    assert config.detect.enabled(registered) == [n for n in registered if n != "throttle"]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("listen: localhost\n", "listen must be HOST:PORT"),
        ("listen: ':50051'\n", "listen must be HOST:PORT"),
        ("listen: 'host:port'\n", "listen must be HOST:PORT"),
        ("max_message_bytes: 1024\n", "at least 64 KiB"),
        ("db_synchronous: off\n", "db_synchronous"),
        ("db_commit_interval_seconds: 2\n", "db_commit_interval_seconds must be between 0 and 1"),
        ("db_commit_interval_seconds: -0.1\n", "db_commit_interval_seconds must be between 0 and 1"),
        ("listeners: 0\n", "listeners must be between 1 and 64"),
        ("listeners: 65\n", "listeners must be between 1 and 64"),
        ("record_workers: -1\n", "record_workers must be between 0 and 32"),
        ("record_workers: 33\n", "record_workers must be between 0 and 32"),
        ("record_min_free_bytes: -1\n", "record_min_free_bytes must be >= 0"),
        ("log_level: loud\n", "log_level"),
        ("event_loop: uv\n", "event_loop"),
        ("stale_after_seconds: soon\n", "stale_after_seconds"),
        ("detect: {margin: 5}\n", "detect.margin must be within 0..1"),
        ("detect: {min_peers: 1}\n", "min_peers must be >= 2"),
        ("detect: {interval_seconds: 0}\n", "interval_seconds must be > 0"),
        # before: NaN passed `<= 0`, and a controller with it did not stop on SIGTERM
        ("detect: {interval_seconds: .nan}\n", "detect.interval_seconds must be a finite number, not nan"),
        (
            "limits: {page_size: 10, stale_after_seconds: 1}\nstale_after_seconds: .inf\n",
            "stale_after_seconds must be a finite number, not inf",
        ),
        ("detect: {detectors: {throttle: {enabled: maybe}}}\n", "enabled"),
        ("listne: 127.0.0.1:1\n", "listne"),
        ("metrics_address: nonsense\n", "metrics_address must be HOST:PORT, not 'nonsense'"),
        ("metrics_address: ':9401'\n", "metrics_address must be HOST:PORT"),
        ("metrics_address: 'host:99999'\n", "metrics_address must be HOST:PORT"),
        ("metrics_address: 9401\n", "metrics_address"),
        ("detect: {marginn: 0.1}\n", "marginn"),
        ("probes: {interval_seconds: 0}\n", "probes.interval_seconds, timeout_seconds and check_every"),
        ("probes: {jitter_ratio: 0.5}\n", "probes.jitter_ratio must be within 0..0.5"),
        ("probes: {idle_utilization: 1.5}\n", "probes.idle_utilization must be within 0..1"),
        ("probes: {max_fleet_share: 0}\n", "probes.max_fleet_share must be within 0..1"),
        ("probes: {probes: [gemm, gemm]}\n", "probes.probes must name each probe once"),
        ("probes: {suite: long}\n", "suite"),
    ],
)
def test_bad_values_name_what_is_wrong(tmp_path: Path, text: str, where: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load(path)
    message = str(caught.value)
    assert where in message and str(path) in message, message


@pytest.mark.parametrize(
    ("text", "override", "expected"),
    [
        ("metrics_address: 127.0.0.1:9500\n", None, "127.0.0.1:9500"),
        ("metrics_address: '[::1]:0'\n", None, "[::1]:0"),
        ("metrics_address: null\n", None, None),
        ("metrics_address: none\n", None, None),
        ("metrics_address: 127.0.0.1:9500\n", "none", None),  # the flag turns it off
        ("metrics_address: null\n", "127.0.0.1:9600", "127.0.0.1:9600"),
        ("", "NONE", None),
    ],
)
def test_metrics_address_from_file_and_flag(
    tmp_path: Path, text: str, override: str | None, expected: str | None
) -> None:
    overrides = {} if override is None else {"metrics_address": override}
    assert load(write(tmp_path, text), overrides).metrics_address == expected


def test_a_bad_override_is_reported_too() -> None:
    with pytest.raises(ConfigError, match="listen must be HOST:PORT"):
        load(None, {"listen": "nowhere"})


@pytest.mark.parametrize(
    ("text", "why"),
    [("listen: [1, 2\n", "not valid YAML"), ("- a\n- b\n", "must be a mapping at the top level")],
)
def test_unreadable_files_are_config_errors(tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load(write(tmp_path, text))


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config .*missing\.yaml: No such file"):
        load(tmp_path / "missing.yaml")


def test_unknown_detector_is_refused_at_start_with_the_registered_names() -> None:
    config = ControllerConfig(db=":memory:", detect=DetectConfig(detectors={"nope": DetectorConfig()}))
    with pytest.raises(ConfigError, match=r"unknown detector\(s\) nope; registered: .*throttle"):
        ControllerApp(config)


@pytest.mark.parametrize(
    ("db", "shown", "why"),
    [
        ("sqlite:///var/lib/gpufleet.db", "sqlite:///var/lib/gpufleet.db", "give an SQLite file path"),
        ("mysql://gf:s3cret@db.example/gpufleet", "mysql://gf:***@db.example/gpufleet", "give an SQLite"),
        ("postgresql:gf:s3cret@db.example", "postgresql:gf:s3cret@db.example", "give an SQLite"),
        (
            "postgresql://gf:s3cret@db.example:54x/gpufleet",
            "postgresql://gf:***@db.example:54x/gpufleet",
            "not a number",
        ),
        ("postgres://gf:s3cret@db.example:5432/", "postgres://gf:***@db.example:5432/", "name the database"),
        ("postgres://gf@db.example?password=s3cret", "postgres://gf@db.example?***", "name the database"),
    ],
)
def test_a_db_url_the_controller_cannot_use_is_refused_and_its_password_never_shown(
    db: str, shown: str, why: str
) -> None:
    """A URL used to be taken as an SQLite file name (a file called 'postgresql:' made in the working
    directory); now one the store cannot use is a config error that names it without credentials."""
    with pytest.raises(ConfigError) as caught:
        load(None, {"db": db})
    message = str(caught.value)
    assert f"db {shown}" in message
    assert why in message
    if "://" in db:
        assert "s3cret" not in message


@pytest.mark.parametrize(
    "db",
    [
        "postgresql://gf:s3cret@db.example:5432/gpufleet",
        "postgres://gf@db.example/gpufleet",
        "postgresql:///gf",
    ],
)
def test_a_postgresql_url_is_taken(db: str) -> None:
    assert load(None, {"db": db}).db == db


def test_a_db_path_or_memory_is_taken(tmp_path: Path) -> None:
    assert load(None, {"db": str(tmp_path / "fleet.db")}).db == str(tmp_path / "fleet.db")
    assert load(None, {"db": ":memory:"}).db == ":memory:"
    with pytest.raises(ConfigError, match=r"db must name an SQLite file .* or a postgresql:// URL"):
        load(None, {"db": ""})


def test_the_db_comes_from_the_environment_before_the_file_and_after_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$GPUFLEET_DB (a Kubernetes Secret) keeps a PostgreSQL password out of the process list."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("db: from-file.db\n")
    parser = build_parser()
    args = parser.parse_args(["controller", "--config", str(cfg)])
    assert load(str(cfg), _overrides(args)).db == "from-file.db"
    monkeypatch.setenv("GPUFLEET_DB", "postgresql://gf:pw@db:5432/fleet")
    assert load(str(cfg), _overrides(args)).db == "postgresql://gf:pw@db:5432/fleet"
    flagged = parser.parse_args(["controller", "--config", str(cfg), "--db", "flag.db"])
    assert load(str(cfg), _overrides(flagged)).db == "flag.db"
