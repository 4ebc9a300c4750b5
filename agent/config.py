"""Agent configuration: typed, validated at start-up, loaded from YAML and overridden by flags.

Keys are the registered names (collectors by name), so a config key, a Helm value and a metric
label are the same word.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from agent.sources.sim.faults import FaultSpec
from protos.finite import finite_message, non_finite
from protos.names import MAX_NODE_NAME
from protos.transport import is_loopback


class ConfigError(Exception):
    """The configuration file or flags are not usable; the message says where and why."""


class _Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class FaultConfig(_Config):
    """A simulator fault: `gpu` places a GPU fault, `target` names a port, fan, PSU or BIOS attribute
    (`agent --sim --list-faults` says which fault takes what); neither: the simulator picks."""

    fault: str
    gpu: int | None = None
    target: str | None = None

    def __post_init__(self) -> None:
        if self.gpu is not None and self.gpu < 0:
            raise ValueError("gpu must be >= 0")
        if self.gpu is not None and self.target is not None:
            raise ValueError(f"fault {self.fault}: give gpu or target, not both")
        spec = self.spec()  # ValueError for an unknown fault or a target its level does not take
        if self.gpu is not None and spec.level != "gpu":
            raise ValueError(f"fault {self.fault} is a {spec.level} fault: it takes no gpu")

    def spec(self) -> FaultSpec:
        return FaultSpec(self.fault, self.gpu if self.gpu is not None else self.target)


class SimConfig(_Config):
    gpus: int = 8
    seed: int = 0
    load: float = 0.95
    faults: list[FaultConfig] = msgspec.field(default_factory=list)
    # Idle gaps between jobs: load 0 for `idle_seconds` once every `idle_every_seconds` (a per-node
    # phase). None: the job never stops.
    idle_every_seconds: float | None = None
    idle_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.gpus <= 64:
            raise ValueError("sim.gpus must be within 1..64")
        if not 0.0 <= self.load <= 1.0:
            raise ValueError("sim.load must be within 0..1")
        if self.idle_every_seconds is not None and not 0.0 < self.idle_seconds < self.idle_every_seconds:
            raise ValueError("sim.idle_seconds must be > 0 and below sim.idle_every_seconds")
        for fault in self.faults:
            if fault.gpu is not None and fault.gpu >= self.gpus:
                raise ValueError(
                    f"fault {fault.fault}: gpu {fault.gpu} out of range (sim.gpus is {self.gpus})"
                )


class StreamConfig(_Config):
    controller: str | None = None  # HOST:PORT; None: no streaming (local use)
    spool_dir: str | None = None  # None: frames wait in memory only
    spool_max_frames: int = 8640  # a day of frames at the default 10 s interval
    backoff_initial_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    # Mutual TLS to the controller (--tls-ca, --tls-cert, --tls-key): the controller's CA, and this
    # node's certificate (its node name in a DNS SAN) and key. Re-read at each connection; a change
    # of the files makes the agent reconnect with them.
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # Plaintext to a non-loopback controller, explicitly chosen (--insecure). Plaintext to a loopback
    # address is allowed without it, with a warning.
    insecure: bool = False

    def __post_init__(self) -> None:
        if self.controller is not None:
            check_address(self.controller, "stream.controller")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("stream.tls_cert and stream.tls_key go together")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ValueError("stream.tls_cert needs stream.tls_ca (the controller's CA)")
        if self.tls_ca is not None and self.insecure:
            raise ValueError("stream.insecure (plaintext) and stream.tls_ca exclude each other")
        if (
            self.controller is not None
            and self.tls_ca is None
            and not self.insecure
            and not is_loopback(self.controller)
        ):
            raise ValueError(
                f"stream.controller {self.controller} is not a loopback address: give --tls-ca, "
                "--tls-cert and --tls-key (mutual TLS), or choose plaintext explicitly with --insecure"
            )
        if self.spool_max_frames < 1:
            raise ValueError("stream.spool_max_frames must be >= 1")
        if not 0 < self.backoff_initial_seconds <= self.backoff_max_seconds:
            raise ValueError("need 0 < stream.backoff_initial_seconds <= stream.backoff_max_seconds")


class BmcConfig(_Config):
    """Where the node's BMC is and how to reach it. Credentials never come from the command line."""

    url: str | None = None  # e.g. https://10.0.0.12; None: no BMC polling
    username: str | None = None  # else from the credentials file/dir or the environment
    password_file: str | None = None  # a file holding only the password
    credentials_dir: str | None = None  # a mounted Kubernetes secret: files `username` and `password`
    ca_bundle: str | None = None  # PEM bundle to verify the BMC's certificate
    insecure: bool = False  # skip TLS verification (only when asked)
    interval_seconds: float = 60.0
    connect_timeout_seconds: float = 5.0
    read_timeout_seconds: float = 20.0
    poll_timeout_seconds: float = 120.0  # a whole poll (every request of it) ends by then
    backoff_max_seconds: float = 600.0  # a failing BMC is retried at most this far apart
    log_entries: int = 20  # most recent log entries per poll
    # BIOS attributes and firmware inventory change rarely and cost many requests on a big BMC:
    # read them every `inventory_every_polls` polls (10 minutes at the default interval).
    inventory_every_polls: int = 10
    simulated: bool = True  # with source "sim" and no url: a simulated BMC beside the simulated GPUs

    def __post_init__(self) -> None:
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"bmc.url must start with http:// or https://, not {self.url!r}")
        if self.insecure and self.ca_bundle:
            raise ValueError("bmc.insecure and bmc.ca_bundle exclude each other")
        if self.interval_seconds < 1 or self.connect_timeout_seconds <= 0 or self.read_timeout_seconds <= 0:
            raise ValueError("bmc.interval_seconds must be >= 1 and the timeouts > 0")
        if self.backoff_max_seconds < self.interval_seconds:
            raise ValueError("bmc.backoff_max_seconds must be >= bmc.interval_seconds")
        if not 0 <= self.log_entries <= 1000:
            raise ValueError("bmc.log_entries must be within 0..1000")
        if self.inventory_every_polls < 1:
            raise ValueError("bmc.inventory_every_polls must be >= 1")


class CollectorConfig(_Config):
    enabled: bool = True


class NvmlConfig(_Config):
    # Per-link NVLink queries, compute-process lists and fabric state are slow NVML calls: read
    # them every `slow_every_cycles` cycles (1 minute at the default 10 s interval), reuse between.
    slow_every_cycles: int = 6
    xid_events: bool = True  # watch XID errors through an NVML event set, in its own thread

    def __post_init__(self) -> None:
        if self.slow_every_cycles < 1:
            raise ValueError("nvml.slow_every_cycles must be >= 1")


class ProbesConfig(_Config):
    """Real probes (source nvml, with the probes extra): safety, time budget, timeouts.

    The simulator models its probes and ignores this section.
    """

    enabled: bool = True  # False: the agent offers no probes
    max_utilization: float = 0.10  # a GPU busier than this is refused (unless forced or drained)
    drained: bool = False  # the node is drained: probe whatever runs there, no refusals
    short_budget_seconds: float = 10.0  # GPU time per GPU for a short-suite run
    full_budget_seconds: float = 60.0  # and for a full-suite run
    timeout_seconds: float = 60.0  # how far past its budget a probe may run before it is killed
    startup_timeout_seconds: float = 120.0  # the probe process: importing torch, starting CUDA
    sample_interval_seconds: float = 0.1  # GPU readings while a probe runs

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_utilization <= 1.0:
            raise ValueError("probes.max_utilization must be within 0..1 (a ratio, 0.1 = 10%)")
        if not 0 < self.short_budget_seconds <= self.full_budget_seconds <= 3600:
            raise ValueError("need 0 < probes.short_budget_seconds <= probes.full_budget_seconds <= 3600")
        if self.timeout_seconds <= 0 or self.startup_timeout_seconds <= 0:
            raise ValueError("probes.timeout_seconds and probes.startup_timeout_seconds must be > 0")
        if not 0.01 <= self.sample_interval_seconds <= 10:
            raise ValueError("probes.sample_interval_seconds must be within 0.01..10")


class MetricsConfig(_Config):
    """The Prometheus /metrics server."""

    address: str | None = "0.0.0.0:9400"  # HOST:PORT (dcgm-exporter's port); None or "none": no server
    dcgm_compat: bool = False  # also serve dcgm-exporter's DCGM_FI_* names, types and labels
    # Prometheus exporter-toolkit web-config file (TLS, basic auth) for /metrics; None: plain HTTP.
    web_config: str | None = None

    def __post_init__(self) -> None:
        if self.address is not None and self.address.strip().lower() == "none":
            self.address = None
        if self.address is not None:
            check_address(self.address, "metrics.address")


class TuningConfig(_Config):
    """Changing the node's settings (ApplyProfile commands). Off unless the node's own config says so:
    the controller cannot turn it on."""

    enabled: bool = False  # false: every mutating command is refused
    state_dir: str | None = None  # the apply journal and the committed profiles; None: <spool_dir>/.tuning
    reapply_at_start: bool = True  # put committed GPU and OS settings back (lost at a reboot)
    # GPU model name (as NVML names it) -> base SM clock in MHz, for profiles that lock clocks at
    # `base`: NVML does not report the base clock, so `base` is refused for a model not listed.
    base_clocks_mhz: dict[str, int] = msgspec.field(default_factory=dict)

    def journal_dir(self, spool_dir: str | None) -> str | None:
        if self.state_dir is not None:
            return self.state_dir
        return None if spool_dir is None else str(Path(spool_dir) / ".tuning")


class AgentConfig(_Config):
    node: str = ""  # empty: the host name
    source: Literal["nvml", "sim"] = "nvml"
    interval_seconds: float = 10.0
    expected_gpus: int | None = None  # None: what NVML or the PCI bus shows, whichever is more
    host_root: str = "/"  # /host in the DaemonSet, where the host's / is mounted
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    collectors: dict[str, CollectorConfig] = msgspec.field(default_factory=dict)
    sim: SimConfig = msgspec.field(default_factory=SimConfig)
    nvml: NvmlConfig = msgspec.field(default_factory=NvmlConfig)
    bmc: BmcConfig = msgspec.field(default_factory=BmcConfig)
    stream: StreamConfig = msgspec.field(default_factory=StreamConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    probes: ProbesConfig = msgspec.field(default_factory=ProbesConfig)
    tuning: TuningConfig = msgspec.field(default_factory=TuningConfig)

    def __post_init__(self) -> None:
        if self.tuning.enabled and self.stream.spool_dir is None:
            # The command memory (never apply one command twice) and the journal live on disk.
            raise ValueError(
                "tuning.enabled needs stream.spool_dir: a mutating command is recorded on disk "
                "before it runs, and the apply journal lives there too (or in tuning.state_dir)"
            )
        if not 0.05 <= self.interval_seconds <= 3600:
            raise ValueError("interval_seconds must be within 0.05..3600")
        if self.expected_gpus is not None and not 0 <= self.expected_gpus <= 1024:
            raise ValueError("expected_gpus must be within 0..1024")
        if not self.node:
            self.node = socket.gethostname()
        if len(self.node) > MAX_NODE_NAME:  # the controller would refuse every Hello
            raise ValueError(
                f"node must be at most {MAX_NODE_NAME} characters (a DNS name), not {len(self.node)}"
            )

    def enabled_collectors(self, registered: list[str]) -> list[str]:
        unknown = sorted(set(self.collectors) - set(registered))
        if unknown:
            raise ConfigError(
                f"unknown collector(s) {', '.join(unknown)}; registered: {', '.join(registered)}"
            )
        return [name for name in registered if self.collectors.get(name, CollectorConfig()).enabled]


def check_address(text: str, what: str) -> str:
    """HOST:PORT with a numeric port; raises ValueError naming `what`."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} must be HOST:PORT, not {text!r}")
    return text


def load(path: str | Path | None, overrides: dict[str, Any] | None = None) -> AgentConfig:
    """Read YAML at `path` (None: defaults), apply `overrides` (nested dicts), validate."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config {path} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping at the top level")
        data = loaded or {}
    _merge(data, overrides or {})
    where = f" {path}" if path else ""
    found = non_finite(data)
    if found is not None:
        raise ConfigError(f"invalid agent config{where}: {finite_message(found)}")
    try:
        config = msgspec.convert(data, AgentConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid agent config{where}: {exc}") from exc
    from agent.collectors.base import discover  # collector keys are the registered names

    try:
        config.enabled_collectors(sorted(discover()))
    except ConfigError as exc:
        raise ConfigError(f"invalid agent config{where}: {exc}") from exc
    return config


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
