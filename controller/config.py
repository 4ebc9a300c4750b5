"""Controller configuration: typed, validated at start-up, from YAML overridden by flags."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from controller.db_url import is_postgres_url, redact_url
from controller.profiles import ProfileError, load_catalogue
from protos.finite import finite_message, non_finite
from protos.names import CAUSES
from protos.transport import is_loopback


class ConfigError(Exception):
    """The configuration is not usable; the message says where and why."""


class _Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


MAX_DETECTION_PROCESSES = 16


class DetectorConfig(_Config):
    enabled: bool = True


class DetectConfig(_Config):
    interval_seconds: float = 10.0  # how often the detectors run over the fleet
    # The detectors in a process of their own (`gpufleet controller`), fed every change the controller
    # applies: their CPU then no longer delays acks. false: on the controller's event loop.
    process: bool = True
    # With process: that many processes, each with a copy of the fleet, sharing out each pass's
    # detectors (controller/detection/pool.py): shorter passes at the cost of a fleet's memory each.
    processes: int = 1
    margin: float = 0.05  # a probe this far below its baseline (peer-group median) is slow...
    min_robust_z: float = 3.0  # ...and this many robust sigmas below: noisy groups widen the margin
    min_peers: int = 4  # no baseline from fewer results than this
    # A condition must hold this long to be a finding: 8 s is two consecutive readings at the agent's
    # 10 s interval (a frame a little early still counts), so a throttle is found within 30 s of its
    # onset (10 s to the first reading, 10 s to the second, up to 10 s to the next pass).
    throttle_window_seconds: float = 8.0
    detectors: dict[str, DetectorConfig] = msgspec.field(default_factory=dict)
    # Own history (a GPU's earlier results of the same probe): the baseline where peers are too
    # few, and a change-point test beside the peers' (controller/detect/own_history.py).
    own_history_min_points: int = 4  # earlier results needed for an own-history baseline
    change_floor: float = 0.03  # the newest results this far below the GPU's own median...
    change_robust_z: float = 3.0  # ...and this many of its own robust sigmas below...
    change_peer_margin: float = 0.02  # ...and this far below the peers' median: slow
    # Hysteresis: a finding opens once raised in open_after_passes of the last open_window_passes
    # passes (at once where its evidence held over a window), closes after close_after_passes clean.
    open_after_passes: int = 2
    open_window_passes: int = 3
    close_after_passes: int = 3
    # XIDs (controller/detect/xid.py): an XID finding stays open while the XID was seen within this
    # window (reset-needing XIDs: until the agent restarts); unknown codes need xid_unknown_repeat.
    xid_window_seconds: float = 3600.0
    xid_unknown_repeat: int = 3
    # NVLinks up but erroring (controller/detect/nvlink_errors.py): a CRC, replay or recovery counter
    # rising this fast on an active link (over the trends window), in at least nvlink_min_rises
    # readings (a one-off jump is not a rising counter) spanning throttle_window_seconds or more.
    nvlink_error_rate_per_minute: float = 6.0  # warning at or above
    nvlink_critical_rate_per_minute: float = 600.0  # critical at or above
    nvlink_min_rises: int = 3
    # InfiniBand ports (controller/detect/infiniband.py): symbol errors, receive errors or link error
    # recoveries rising faster than this (per minute, over the counter window), or this many
    # link-downs within the window on a port that is up again (a flapping link).
    ib_errors_per_minute: float = 1.0
    ib_link_downs_per_window: int = 2
    # BMC (controller/detect/bmc_health.py): a BMC sample whose poll started this long before the
    # node's newest frame is not used (the BMC stopped answering); an intake sensor without
    # thresholds is hot this far above its peer group's median intake.
    bmc_max_age_seconds: float = 300.0
    inlet_margin_celsius: float = 8.0
    # Clocks from telemetry (controller/detect/clock_lock.py): a GPU at or above clock_busy_utilization
    # whose SM clock a setting holds >5% below max is clocks_locked_low; with no lock and no reason
    # bit shown, a GPU and its peers at or above clock_peer_utilization, its clock clock_peer_margin
    # below theirs (median, at least min_peers of them), is slow_unknown.
    clock_busy_utilization: float = 0.5
    clock_peer_utilization: float = 0.9
    clock_peer_margin: float = 0.10

    def __post_init__(self) -> None:
        if not 0.0 < self.margin < 1.0:
            raise ValueError("detect.margin must be within 0..1 (a fraction, 0.05 = 5%)")
        if not (0.0 < self.change_floor < 1.0 and 0.0 <= self.change_peer_margin < 1.0):
            raise ValueError("detect.change_floor and change_peer_margin must be within 0..1 (fractions)")
        if self.own_history_min_points < 2 or self.change_robust_z < 0 or self.min_robust_z < 0:
            raise ValueError("detect.own_history_min_points must be >= 2, change_robust_z, min_robust_z >= 0")
        if not 1 <= self.open_after_passes <= self.open_window_passes or self.close_after_passes < 1:
            raise ValueError(
                "detect.open_after_passes must be within 1..open_window_passes and close_after_passes >= 1"
            )
        if self.interval_seconds <= 0 or self.throttle_window_seconds < 0:
            raise ValueError("detect.interval_seconds must be > 0 and throttle_window_seconds >= 0")
        if self.min_peers < 2:
            raise ValueError("detect.min_peers must be >= 2")
        if not 1 <= self.processes <= MAX_DETECTION_PROCESSES:
            raise ValueError(f"detect.processes must be within 1..{MAX_DETECTION_PROCESSES}")
        if not (
            0.0 < self.clock_busy_utilization <= 1.0
            and 0.0 < self.clock_peer_utilization <= 1.0
            and 0.0 < self.clock_peer_margin < 1.0
        ):
            raise ValueError(
                "detect.clock_busy_utilization and clock_peer_utilization must be within 0..1 (ratios), "
                "clock_peer_margin within 0..1 (a fraction)"
            )
        if self.xid_window_seconds <= 0 or self.xid_unknown_repeat < 1 or self.nvlink_min_rises < 1:
            raise ValueError(
                "detect.xid_window_seconds must be > 0, xid_unknown_repeat and nvlink_min_rises >= 1"
            )
        if not 0.0 < self.nvlink_error_rate_per_minute <= self.nvlink_critical_rate_per_minute:
            raise ValueError(
                "detect.nvlink_error_rate_per_minute must be > 0 and <= nvlink_critical_rate_per_minute"
            )
        if self.ib_errors_per_minute <= 0 or self.ib_link_downs_per_window < 1:
            raise ValueError("detect.ib_errors_per_minute must be > 0 and ib_link_downs_per_window >= 1")
        if self.bmc_max_age_seconds <= 0 or self.inlet_margin_celsius <= 0:
            raise ValueError("detect.bmc_max_age_seconds and inlet_margin_celsius must be > 0")

    def enabled(self, registered: list[str]) -> list[str]:
        unknown = sorted(set(self.detectors) - set(registered))
        if unknown:
            raise ConfigError(
                f"unknown detector(s) {', '.join(unknown)}; registered: {', '.join(registered)}"
            )
        return [n for n in registered if self.detectors.get(n, DetectorConfig()).enabled]


class ProbeConfig(_Config):
    """When the controller asks agents to probe (see controller/fleet/probe_schedule.py)."""

    on_connect: bool = True  # ask each new agent boot for a probe run right away
    periodic: bool = True  # probe every node's idle GPUs every `interval_seconds`
    interval_seconds: float = 1800.0  # how often each GPU is probed
    jitter_ratio: float = 0.1  # a fixed per-node shift of up to +-this share of the interval
    idle_utilization: float = 0.1  # a GPU at or below this utilisation, with no compute process, is idle
    max_fleet_share: float = 0.1  # this share of connected nodes may probe at once (>= 1), on connect too
    timeout_seconds: float = 600.0  # a command unanswered this long is given up
    check_every_seconds: float = 10.0  # how often the scheduler looks for due, idle GPUs
    # Periodic runs ask for these probes; empty: the agent's default suite.
    probes: list[str] = msgspec.field(default_factory=list)
    suite: Literal["short", "full"] = "short"  # the suite periodic runs ask for

    def __post_init__(self) -> None:
        if self.interval_seconds <= 0 or self.timeout_seconds <= 0 or self.check_every_seconds <= 0:
            raise ValueError("probes.interval_seconds, timeout_seconds and check_every_seconds must be > 0")
        if not 0.0 <= self.jitter_ratio < 0.5:
            raise ValueError("probes.jitter_ratio must be within 0..0.5 (a share of the interval)")
        if not 0.0 <= self.idle_utilization < 1.0:
            raise ValueError("probes.idle_utilization must be within 0..1 (a ratio, 0.1 = 10%)")
        if not 0.0 < self.max_fleet_share <= 1.0:
            raise ValueError("probes.max_fleet_share must be within 0..1 (a share of connected nodes)")
        if len(set(self.probes)) != len(self.probes) or any(not name for name in self.probes):
            raise ValueError("probes.probes must name each probe once")


class BreakerConfig(_Config):
    """The blast-radius breaker (controller/remediate/breaker.py)."""

    window_seconds: float = 3600.0  # the sliding window actions count in
    share: float = 0.05  # at most max(1, ceil(share x N)) nodes in action per window, per group and fleet

    def __post_init__(self) -> None:
        if self.window_seconds <= 0:
            raise ValueError("breaker.window_seconds must be > 0")
        if not 0.0 < self.share <= 1.0:
            raise ValueError("breaker.share must be within 0..1 (a share of nodes, 0.05 = 5%)")


POLICY_MODES = ("off", "recommend", "auto")


class TuningConfig(_Config):
    """Closed-loop tuning (controller/remediate/retune.py): what the controller does with a finding
    whose cause a profile fixes. Per cause: `off` (no recommendation), `recommend` (proposed; an
    operator approves it) or `auto` (applied within the breaker's budget). A fix that needs a
    reboot (BIOS, ECC) always waits for an approval, whatever the policy says."""

    default_policy: str = "recommend"  # for every cause `policy` does not name
    policy: dict[str, str] = msgspec.field(default_factory=dict)  # cause -> off | recommend | auto
    profiles_dir: str | None = None  # a site's own profiles, beside the shipped ones

    def __post_init__(self) -> None:
        if self.default_policy not in POLICY_MODES:
            raise ValueError(
                f"tuning.default_policy: {self.default_policy!r} is not one of {', '.join(POLICY_MODES)}"
            )
        for cause, mode in self.policy.items():
            if cause not in CAUSES:
                raise ValueError(f"tuning.policy: {cause!r} is not a finding cause ({', '.join(CAUSES)})")
            if mode not in POLICY_MODES:
                raise ValueError(f"tuning.policy.{cause}: {mode!r} is not one of {', '.join(POLICY_MODES)}")
        if self.profiles_dir is not None:
            try:  # a site profile that does not validate stops the controller here, in one line
                load_catalogue(self.profiles_dir)
            except ProfileError as exc:
                raise ValueError(f"tuning.profiles_dir: {exc}") from exc

    def mode(self, cause: str) -> str:
        """off, recommend or auto for `cause`."""
        return self.policy.get(cause, self.default_policy)


class DrainConfig(_Config):
    """How a drain treats pods (controller/kube/drain.py), as `kubectl drain`'s flags would."""

    delete_emptydir_data: bool = False  # evict pods with emptyDir volumes (their data is lost)
    force: bool = False  # evict pods that declare no controller (nothing recreates them)
    timeout_seconds: float = 600.0  # a drain not done by then ends blocked (a PDB) or timed_out
    grace_seconds: int | None = None  # the evicted pods' grace period; None: each pod's own

    def __post_init__(self) -> None:
        if self.timeout_seconds <= 0:
            raise ValueError("kubernetes.drain.timeout_seconds must be > 0")
        if self.grace_seconds is not None and self.grace_seconds < 0:
            raise ValueError("kubernetes.drain.grace_seconds must be >= 0 (or unset: each pod's own)")


class MaintenanceConfig(_Config):
    """A node carrying one of these (KEY, or KEY=VALUE) is under someone else's maintenance:
    gpufleet leaves it alone (no cordon, drain, uncordon or health taint)."""

    annotations: list[str] = msgspec.field(default_factory=list)
    labels: list[str] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        for where, marks in (("annotations", self.annotations), ("labels", self.labels)):
            for mark in marks:
                if not mark.partition("=")[0].strip():
                    raise ValueError(f"kubernetes.maintenance.{where}: {mark!r} is not KEY or KEY=VALUE")


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class KubernetesConfig(_Config):
    """Node actions through the Kubernetes API (controller/kube/). The cluster: `kubeconfig`
    (--kubeconfig), else the in-cluster service account in a pod, else $KUBECONFIG; none: node
    actions are refused, everything else works."""

    enabled: bool = True
    kubeconfig: str | None = None
    drain: DrainConfig = msgspec.field(default_factory=DrainConfig)
    maintenance: MaintenanceConfig = msgspec.field(default_factory=MaintenanceConfig)
    taint_unhealthy: bool = False  # taint gpufleet.io/unhealthy:NoSchedule on unhealthy nodes
    # The drain policy per cause the cause map drains (controller/kube/policy.py): `off` recommends
    # no drain, `recommend` proposes one (`gpufleet approve` starts it), `auto` drains by itself
    # within the breaker's budget (without a cluster: as `recommend`). A node so drained is
    # uncordoned once back within fleet normal after a re-probe (controller/kube/recovery.py).
    default_policy: str = "recommend"  # for every cause `policy` does not name
    policy: dict[str, str] = msgspec.field(default_factory=dict)  # cause -> off | recommend | auto
    # Replicas elect their leader on this Lease (coordination.k8s.io/v1) in the pod's namespace
    # ($GPUFLEET_POD_NAMESPACE), then take the store's own lease (controller/kube/lease.py). None:
    # the store's lease alone elects (a PostgreSQL advisory lock, or a file lock beside SQLite).
    leader_lease: str | None = None

    def __post_init__(self) -> None:
        if self.leader_lease is not None and not _DNS_LABEL.fullmatch(self.leader_lease):
            raise ValueError(
                f"kubernetes.leader_lease: {self.leader_lease!r} is not a Lease name (lower-case letters, "
                "digits and '-', at most 63, starting and ending with a letter or digit)"
            )
        if self.leader_lease is not None and not self.enabled:
            raise ValueError("kubernetes.leader_lease needs kubernetes.enabled: true")
        if self.default_policy not in POLICY_MODES:
            raise ValueError(
                f"kubernetes.default_policy: {self.default_policy!r} is not one of {', '.join(POLICY_MODES)}"
            )
        for cause, mode in self.policy.items():
            if cause not in CAUSES:
                raise ValueError(f"kubernetes.policy: {cause!r} is not a finding cause ({', '.join(CAUSES)})")
            if mode not in POLICY_MODES:
                raise ValueError(
                    f"kubernetes.policy.{cause}: {mode!r} is not one of {', '.join(POLICY_MODES)}"
                )
        if self.kubeconfig is not None and not self.kubeconfig.strip():
            raise ValueError("kubernetes.kubeconfig must name a file (or be left out)")

    def mode(self, cause: str) -> str:
        """off, recommend or auto: what a drain recommendation for `cause` does."""
        return self.policy.get(cause, self.default_policy)


class TlsConfig(_Config):
    """TLS of the gRPC ports (controller/security/). With cert and key the ports speak TLS; then
    client_ca is required: every client of `listen` presents a certificate it signed (an agent: its
    node's, the node name in a DNS SAN; an operator there: any, plus a token). The files are re-read
    when they change (rotation without restart)."""

    cert: str | None = None  # PEM certificate chain of the controller
    key: str | None = None  # its PEM private key
    client_ca: str | None = None  # PEM CA bundle that signed the agents' (and operators') certificates

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("tls.cert and tls.key go together")
        if self.cert is not None and self.client_ca is None:
            raise ValueError("tls.client_ca is required with tls.cert: agents authenticate with certificates")
        if self.cert is None and self.client_ca is not None:
            raise ValueError("tls.client_ca needs tls.cert and tls.key")

    @property
    def enabled(self) -> bool:
        return self.cert is not None


class LimitsConfig(_Config):
    """Bounds on what nodes can make the controller hold or answer."""

    max_nodes: int = 20_000  # a Hello from one more node is refused (RESOURCE_EXHAUSTED)
    forget_after_seconds: float = 7 * 86400.0  # a node gone this long is forgotten (0: never)
    page_size: int = 500  # the most findings in one operator answer
    # The most nodes in one ListNodes answer (a summary is ~200 bytes; a page also ends before
    # paging.PAGE_BYTES). 12,500 nodes in 3 answers: each answer waits its turn behind the frames.
    node_page_size: int = 5000
    max_clock_skew_seconds: float = 300.0  # a frame this far in the future is refused

    def __post_init__(self) -> None:
        if self.max_nodes < 1 or self.page_size < 1 or self.node_page_size < 1:
            raise ValueError("limits.max_nodes, limits.page_size and limits.node_page_size must be >= 1")
        if self.forget_after_seconds < 0 or self.max_clock_skew_seconds <= 0:
            raise ValueError("limits.forget_after_seconds must be >= 0 and max_clock_skew_seconds > 0")


MAX_FRONTS = 64
MAX_RECORD_WORKERS = 32
MAX_LISTENERS = 64


class ControllerConfig(_Config):
    listen: str = "127.0.0.1:50051"
    # A second port for operators only (the CLI): server TLS and tokens, no client certificates.
    # None: operators use `listen` (with a client certificate when TLS is on).
    operator_listen: str | None = None
    tls: TlsConfig = msgspec.field(default_factory=TlsConfig)
    # gRPC servers sharing `listen` (SO_REUSEPORT), each taking new streams on its own: gRPC's
    # asyncio server takes one new stream per turn of the event loop, so a fleet reconnecting at
    # once waited on that (controller/listeners.py). 1: one server. With ingest_fronts the fronts
    # serve `listen` instead, one server each.
    listeners: int = 8
    # Processes that serve the agents' gRPC streams on `listen` (sharing the port, SO_REUSEPORT)
    # and relay them to this controller, which then does no gRPC work for agents on its own core
    # (controller/fronts/). 0: the controller serves `listen` itself. Needs operator_listen: the
    # fronts serve agents only.
    ingest_fronts: int = 0
    # Standbys ingest too (controller/replicas.py): every replica serves the agents that connect to
    # it on `listen` and owns their nodes in the shared store (the newest stream's replica owns a
    # node); the leader takes in what the others stored every replica_sync_seconds, and they store
    # their nodes' latest readings at least that often. Needs a store the replicas share.
    replica_ingest: bool = False
    replica_sync_seconds: float = 10.0
    # With replica_ingest, a standby loads the store while it waits and keeps up with it, so that
    # taking the lead costs one look rather than a whole load (controller/warm_standby.py); it then
    # holds the fleet in memory as the leader does. false: it loads the store on taking the lead.
    warm_standby: bool = True
    # Plaintext gRPC on a non-loopback address, explicitly chosen (--insecure, or `tls: off`).
    # Plaintext on a loopback address is allowed without it, with a warning.
    insecure: bool = False
    operator_tokens: str | None = None  # YAML file of operator tokens (name, role, sha256); None: open API
    # Prometheus exporter-toolkit web-config file for /metrics (TLS, basic auth); None: plain HTTP.
    metrics_web_config: str | None = None
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    # Prometheus /metrics (HOST:PORT); None (or "none") serves none.
    metrics_address: str | None = "0.0.0.0:9401"
    # Plain HTTP /livez and /readyz (HOST:PORT), served from before the controller waits for the
    # lead (controller/standing.py): the chart's probes. None serves none.
    health_listen: str | None = None
    db: str = "gpufleet.db"  # SQLite file (":memory:" for tests) or postgresql://USER:PASSWORD@HOST:PORT/DB
    db_synchronous: Literal["full", "normal"] = "full"  # full: an ack survives power loss
    # A node's latest readings are written at most this often (0: with every frame; the next frame
    # replaces them, so a crash loses at most this much of them). Ack positions, probe results and
    # findings are written as they come, whatever this says. Each write of a node's readings costs
    # about 110 KB of WAL and checkpoint: every 60 s that was 18 KB per frame, every 300 s 3.6.
    db_state_seconds: float = 300.0
    # A store transaction begins at most this often; frames that arrive meanwhile join it (each
    # still acked only once committed). 0: each begins as soon as the last ended. At 2,000 nodes on
    # a disk with quick syncs (about 160 commits a second for 200 frames), 0.01 cut the main
    # process's CPU per frame by 0.1-0.2 ms and the bytes written per frame by a third, for about
    # 5 ms more ack latency (bench/results/2026-11-29_controller_scale_commit_interval.txt).
    db_commit_interval_seconds: float = 0.01
    max_message_bytes: int = 4 * 1024 * 1024
    stale_after_seconds: float = 60.0  # a node silent this long is shown stale
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # The controller's and its fronts' event loop: auto (uvloop where installed, else asyncio's own),
    # uvloop (an error without it) or asyncio. uvloop: less CPU a frame (controller/event_loop.py).
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    # Append every accepted Hello and frame to this file (JSON Lines, for `gpufleet analyze`);
    # "" records nothing. A write error loses recorded lines (counted), never telemetry.
    record: str = ""
    # Processes that make the recording's lines (controller/record_lines.py; 0: on the recording's
    # thread, which holds the interpreter the event loop needs). Each takes ~1.3 ms of CPU an 8-GPU
    # frame (~1.5 compressed, a .gz name): two keep up with ~1,300 frames a second (12,500 nodes at a
    # 10 s cadence is 1,250); give more on a host with cores to spare, or recording loses lines.
    record_workers: int = 2
    # Recording pauses while its filesystem has less than this free (the store beside it needs the
    # room: controller/record_space.py); 0: no check.
    record_min_free_bytes: int = 1 << 30
    detect: DetectConfig = msgspec.field(default_factory=DetectConfig)
    probes: ProbeConfig = msgspec.field(default_factory=ProbeConfig)
    breaker: BreakerConfig = msgspec.field(default_factory=BreakerConfig)
    tuning: TuningConfig = msgspec.field(default_factory=TuningConfig)
    kubernetes: KubernetesConfig = msgspec.field(default_factory=KubernetesConfig)

    def __post_init__(self) -> None:
        check_address(self.listen, "listen")
        check_db(self.db)
        if self.metrics_address is not None and self.metrics_address.lower() == "none":
            self.metrics_address = None
        if self.metrics_address is not None:
            check_address(self.metrics_address, "metrics_address")
        if self.health_listen is not None:
            check_address(self.health_listen, "health_listen")
        if self.record_min_free_bytes < 0:
            raise ValueError("record_min_free_bytes must be >= 0 (0: no check)")
        if not 0 <= self.record_workers <= MAX_RECORD_WORKERS:
            raise ValueError(f"record_workers must be between 0 and {MAX_RECORD_WORKERS}")
        if not 0 <= self.db_state_seconds <= 3600:
            raise ValueError("db_state_seconds must be between 0 and 3600")
        if not 0 <= self.db_commit_interval_seconds <= 1:
            raise ValueError("db_commit_interval_seconds must be between 0 and 1")
        if self.max_message_bytes < 64 * 1024:
            raise ValueError("max_message_bytes must be at least 64 KiB")
        if not 1 <= self.replica_sync_seconds <= 300:
            raise ValueError("replica_sync_seconds must be between 1 and 300")
        if self.replica_ingest and self.db == ":memory:":
            raise ValueError("replica_ingest needs a store the replicas share: a file or a postgresql:// URL")
        if not 1 <= self.listeners <= MAX_LISTENERS:
            raise ValueError(f"listeners must be between 1 and {MAX_LISTENERS}")
        if not 0 <= self.ingest_fronts <= MAX_FRONTS:
            raise ValueError(f"ingest_fronts must be between 0 and {MAX_FRONTS}")
        if self.ingest_fronts and self.operator_listen is None:
            raise ValueError(
                "ingest_fronts serve agents only: give operator_listen (--operator-listen) for operators"
            )
        if self.operator_listen is not None:
            check_address(self.operator_listen, "operator_listen")
            if not self.tls.enabled and not self.insecure and not is_loopback(self.operator_listen):
                raise ValueError(
                    f"operator_listen {self.operator_listen} is not a loopback address: give tls.cert and "
                    "tls.key (operators then use tokens over TLS), or insecure: true for plaintext"
                )
        if self.tls.enabled and self.insecure:
            raise ValueError("insecure (plaintext) and tls.cert exclude each other")
        if not self.tls.enabled and not self.insecure and not is_loopback(self.listen):
            raise ValueError(
                f"listen {self.listen} is not a loopback address: give tls.cert, tls.key and "
                "tls.client_ca (--tls-cert, --tls-key, --tls-client-ca), or choose plaintext "
                "explicitly with --insecure (tls: off)"
            )

    @property
    def plaintext(self) -> bool:
        return not self.tls.enabled


def check_db(text: str) -> str:
    """The store: an SQLite file path, ":memory:", or a postgresql:// URL. Any other URL is refused
    rather than taken as a file name, and the message never carries its password."""
    if not text:
        raise ValueError("db must name an SQLite file (or :memory:) or a postgresql:// URL")
    if is_postgres_url(text):
        parts = urllib.parse.urlsplit(text)
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            raise ValueError(f"db {redact_url(text)}: the port is not a number") from None
        if not parts.path.strip("/"):
            raise ValueError(
                f"db {redact_url(text)}: name the database (postgresql://USER@HOST:PORT/DATABASE)"
            )
        return text
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text) or text.lower().startswith(
        ("postgres:", "postgresql:")
    ):
        raise ValueError(
            f"db {redact_url(text)}: give an SQLite file path or a "
            "postgresql://USER:PASSWORD@HOST:PORT/DATABASE URL"
        )
    return text


def check_address(text: str, what: str) -> str:
    """HOST:PORT with a numeric port in 0..65535; raises ValueError naming `what`."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} must be HOST:PORT, not {text!r}")
    return text


def load(path: str | Path | None, overrides: dict[str, Any] | None = None) -> ControllerConfig:
    """Read YAML at `path` (None: defaults), apply flat top-level `overrides`, validate."""
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
    if data.get("tls") in (False, "off"):  # `tls: off` (YAML reads off as false): plaintext, chosen
        data["tls"] = {}
        data["insecure"] = True
    data.update(overrides or {})
    found = non_finite(data)
    if found is not None:
        raise ConfigError(f"invalid controller config{f' {path}' if path else ''}: {finite_message(found)}")
    try:
        return msgspec.convert(data, ControllerConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid controller config{f' {path}' if path else ''}: {exc}") from exc
