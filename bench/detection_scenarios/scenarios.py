"""The scenario suite: which fleets to simulate, with which faults, when.

A scenario is one fleet run from its agents' first Hello to its end: nodes (and their GPU model),
frames every `step` seconds, a probe round at connect and then every `probe_interval` (as the
controller's scheduler would ask), and the faults injected, each at one node (and GPU) from
`onset` to `end` (None: to the end of the run).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from agent.sources.sim.faults import FAULTS
from agent.sources.sim.profile import H100_SXM, GpuProfile
from detection_scenarios.severity import DRAWN, KNOBS, severities

# No second GPU model in the simulator yet: an H200 SXM as its datasheet differs from the H100 SXM
# (141 GB HBM3e at 4.8 TB/s; same compute, links and power), sustained memory bandwidth at the
# H100 profile's share of peak. Enough to tell whether peers are kept apart by model.
H200_SXM = dataclasses.replace(
    H100_SXM,
    name="NVIDIA H200",
    board_part_number="692-2G520-0280-000",
    memory_total_bytes=143771 * 1024 * 1024,
    membw_gbps=H100_SXM.membw_gbps * 4800.0 / H100_SXM.membw_peak_gbps,
    membw_peak_gbps=4800.0,
)
# The same model name at another power class: an HGX H100 whose board's default (and maximum) power
# limit is 500 W, as some OEM boards ship. It runs GEMM about 12% below the 700 W boards by design:
# by the model name alone, its healthy GPUs were slow outliers (controller/fleet/peers.py).
H100_SXM_500W = dataclasses.replace(H100_SXM, default_power_limit_watts=500.0, max_power_limit_watts=500.0)
MODELS: dict[str, GpuProfile] = {"h100": H100_SXM, "h200": H200_SXM, "h100-500w": H100_SXM_500W}

# Faults whose evidence is only in what the agent announces at connect (the Hello's inventory):
# a standing condition from the start, not something that appears mid-run.
AT_CONNECT = frozenset({"vbios_drift", "driver_branch_slow"})  # in the Hello: present at boot
# Intermittent faults: (fault, severity, seconds it lasts), each where the registry has it.
INTERMITTENT = (
    ("thermal_throttle", "moderate", 300.0),
    ("power_brake", "moderate", 180.0),
    ("power_cap", "moderate", 240.0),
    ("clocks_locked_low", "moderate", 600.0),
    ("fan_failure", DRAWN, 600.0),
    ("ib_port_degraded", DRAWN, 300.0),
)


@dataclass(frozen=True, slots=True)
class Injection:
    fault: str
    severity: str  # a knob's label (severity.KNOBS) or "drawn"
    node: str
    gpu: int | None  # GPU faults: the GPU index; other levels: None (the node)
    onset: float  # seconds after the run starts
    end: float | None = None  # seconds after the run starts; None: lasts to the end

    @property
    def cause(self) -> str:
        return FAULTS[self.fault].cause

    @property
    def label(self) -> str:
        return self.fault if self.severity == DRAWN else f"{self.fault}/{self.severity}"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    kind: str  # fault | intermittent | small | mixed | healthy
    models: tuple[str, ...]  # one key of MODELS per node, node-00 first
    seconds: float
    step: float  # seconds between one node's frames
    probe_interval: float
    injections: tuple[Injection, ...] = ()
    seed: int = 1
    idle_nodes: int = 0  # the first this many nodes sit idle between jobs (load 0 for a while)
    gpus: int = 8
    # Seconds between detection passes: the controller's 10 s, or one pass per frame where frames
    # come less often (a pass per frame keeps "one new sample per pass", as at 10 s).
    detect_interval: float = 10.0

    @property
    def nodes(self) -> list[str]:
        return [node_name(i) for i in range(len(self.models))]


@dataclass(frozen=True, slots=True)
class Timing:
    """How long runs last: warm-up before faults start, the probe interval and a tail after."""

    warmup: float
    probe_interval: float
    tail: float
    jitter_ratio: float = 0.1  # the scheduler's per-node shift of the probe interval

    @property
    def seconds(self) -> float:
        """A fault that starts after warm-up is seen by at least one probe round."""
        return self.warmup + self.probe_interval * (1.0 + self.jitter_ratio) + self.tail


@dataclass(slots=True)
class Suite:
    scenarios: list[Scenario] = field(default_factory=list)


def node_name(i: int) -> str:
    return f"node-{i:02d}"


FULL = Timing(warmup=300.0, probe_interval=1800.0, tail=300.0)
QUICK = Timing(warmup=60.0, probe_interval=600.0, tail=120.0)


def fault_cases(names: list[str] | None = None) -> list[tuple[str, str]]:
    """(fault, severity) for every fault of the registry (or of `names`) at each of its severities."""
    return [(f, s) for f in (names or list(FAULTS)) for s in severities(f)]


def _place(
    cases: list[tuple[str, str]], nodes: int, rng: random.Random, onset: float, gpus: int
) -> list[Injection]:
    """One fault per node, on node-00, node-01, ...; a GPU fault on a GPU drawn from `rng`."""
    out = []
    for i, (fault, severity) in enumerate(cases):
        if i >= nodes:
            raise ValueError("more faults than nodes")
        gpu = rng.randrange(gpus) if FAULTS[fault].level == "gpu" else None
        start = 0.0 if fault in AT_CONNECT else onset
        out.append(Injection(fault, severity, node_name(i), gpu, start))
    return out


def fault_fleets(
    cases: list[tuple[str, str]], timing: Timing, *, nodes: int, per_fleet: int, seed: int, step: float = 10.0
) -> list[Scenario]:
    """Every case in one of several fleets of `nodes` H100 nodes, `per_fleet` faults each. Cases are
    dealt round-robin, so one fault's severities land in different fleets and no peer group holds
    more than one instance of it."""
    count = -(-len(cases) // per_fleet)
    fleets = []
    for f in range(count):
        mine = cases[f::count]
        rng = random.Random(f"{seed}:faults-{f}")
        fleets.append(
            Scenario(
                name=f"faults-{f:02d}",
                kind="fault",
                models=("h100",) * nodes,
                seconds=timing.seconds,
                step=step,
                probe_interval=timing.probe_interval,
                injections=tuple(_place(mine, nodes, rng, timing.warmup, 8)),
                seed=seed + f,
            )
        )
    return fleets


def intermittent_fleets(timing: Timing, *, nodes: int, per_fleet: int, seed: int) -> list[Scenario]:
    """Faults that come and go within minutes, between probe rounds: only telemetry can see them."""
    cases = [(f, s, d) for f, s, d in INTERMITTENT if f in FAULTS]
    count = -(-len(cases) // per_fleet)
    fleets = []
    for f in range(count):
        mine = cases[f::count]
        rng = random.Random(f"{seed}:intermittent-{f}")
        placed = _place([(c[0], c[1]) for c in mine], nodes, rng, timing.warmup, 8)
        injections = tuple(
            dataclasses.replace(inj, end=inj.onset + seconds)
            for inj, (_, _, seconds) in zip(placed, mine, strict=True)
        )
        fleets.append(
            Scenario(
                name=f"intermittent-{f:02d}",
                kind="intermittent",
                models=("h100",) * nodes,
                seconds=timing.seconds,
                step=10.0,
                probe_interval=timing.probe_interval,
                injections=injections,
                seed=seed + 100 + f,
            )
        )
    return fleets


def history_timing(timing: Timing, rounds: int = 2) -> Timing:
    """Faults start after `rounds` probe rounds more, so a GPU's own history has points to compare with."""
    warmup = timing.warmup + rounds * timing.probe_interval * (1.0 + timing.jitter_ratio)
    return dataclasses.replace(timing, warmup=warmup)


def small_fleet(timing: Timing, seed: int) -> Scenario:
    """Three nodes of a model: too few for a node-level (NCCL) peer baseline."""
    cases = [("nvlink_down", "moderate"), ("hbm_degraded", "mild")]
    rng = random.Random(f"{seed}:small")
    return _after_history("small-group", ("h100",) * 3, cases, timing, rng=rng, seed=seed + 200, kind="small")


def small_nodes_fleet(timing: Timing, seed: int) -> Scenario:
    """Six nodes of two GPUs each (PCIe servers, a lab's small boxes): a node's GPUs are fewer than
    detect.min_peers, so its own GPUs are no baseline, and a driver branch on one node has two results."""
    cases = [("driver_branch_slow", DRAWN), ("power_cap", "moderate"), ("thermal_throttle", "mild")]
    rng = random.Random(f"{seed}:small-nodes")
    return _after_history(
        "small-nodes", ("h100",) * 6, cases, timing, rng=rng, seed=seed + 600, kind="small", gpus=2
    )


def _after_history(
    name: str,
    models: tuple[str, ...],
    cases: list[tuple[str, str]],
    timing: Timing,
    *,
    rng: random.Random,
    seed: int,
    kind: str = "mixed",
    gpus: int = 8,
) -> Scenario:
    """A fleet of `models` (node-00 first) of `gpus` GPUs a node, one fault of `cases` per node from
    node-00 on (GPUs drawn from `rng`), after enough probe rounds for a GPU's own history."""
    t = history_timing(timing)
    return Scenario(
        name=name,
        kind=kind,
        models=models,
        seconds=t.seconds,
        step=10.0,
        probe_interval=t.probe_interval,
        injections=tuple(_place([c for c in cases if c[0] in FAULTS], len(models), rng, t.warmup, gpus)),
        seed=seed,
        gpus=gpus,
    )


def mixed_fleet(timing: Timing, seed: int) -> Scenario:
    """Five H100 nodes and three H200 nodes (a small group of its own), with faults on both."""
    models = ("h200", "h200", "h100", "h100", "h100", "h100", "h100", "h200")
    cases = [("hbm_degraded", "mild"), ("clocks_locked_low", "mild"), ("thermal_throttle", "mild")]
    return _after_history(
        "mixed-models", models, cases, timing, rng=random.Random(f"{seed}:mixed"), seed=seed + 300
    )


def mixed_power_fleet(timing: Timing, seed: int) -> Scenario:
    """Five 700 W and three 500 W H100 nodes of one model name, with faults on both classes."""
    models = ("h100-500w", "h100", "h100-500w", "h100", "h100", "h100", "h100", "h100-500w")
    cases = [("clocks_locked_low", "mild"), ("power_brake", "moderate"), ("power_cap", "moderate")]
    return _after_history(
        "mixed-power", models, cases, timing, rng=random.Random(f"{seed}:mixed-power"), seed=seed + 500
    )


def healthy_fleet(
    name: str, models: tuple[str, ...], seconds: float, *, step: float, probe_interval: float, seed: int
) -> Scenario:
    """No fault at all; half the nodes sit idle 45 minutes every 6 hours, as between jobs."""
    return Scenario(
        name=name,
        kind="healthy",
        models=models,
        seconds=seconds,
        step=step,
        probe_interval=probe_interval,
        seed=seed,
        idle_nodes=len(models) // 2,
        detect_interval=max(10.0, step),
    )


def full_suite(seed: int, *, day_step: float = 30.0, day_nodes: int = 4) -> Suite:
    """Every fault at each severity, intermittent faults, a small group, nodes of two GPUs, mixed
    models and power classes, a healthy day."""
    return Suite(
        [
            *fault_fleets(fault_cases(), FULL, nodes=6, per_fleet=4, seed=seed),
            *intermittent_fleets(FULL, nodes=6, per_fleet=3, seed=seed),
            small_fleet(FULL, seed),
            small_nodes_fleet(FULL, seed),
            mixed_fleet(FULL, seed),
            mixed_power_fleet(FULL, seed),
            healthy_fleet(
                "healthy-day",
                ("h100",) * day_nodes,
                86400.0,
                step=day_step,
                probe_interval=FULL.probe_interval,
                seed=seed + 400,
            ),
        ]
    )


QUICK_CASES = [
    ("thermal_throttle", "severe"),
    ("hbm_degraded", "severe"),
    ("nvlink_down", "severe"),
    ("power_cap", "moderate"),
    ("pcie_downtrained", "gen-2"),
    ("xid_79", DRAWN),
]


def quick_suite(seed: int) -> Suite:
    """A few gross faults on small fleets and a healthy hour: the harness end to end in seconds."""
    cases = [c for c in QUICK_CASES if c[0] in FAULTS and (c[1] == DRAWN or c[1] in KNOBS.get(c[0], {}))]
    return Suite(
        [
            *fault_fleets(cases, QUICK, nodes=4, per_fleet=3, seed=seed),
            mixed_power_fleet(QUICK, seed),
            healthy_fleet(
                "healthy-hour",
                ("h100",) * 4,
                3600.0,
                step=30.0,
                probe_interval=QUICK.probe_interval,
                seed=seed + 400,
            ),
        ]
    )
