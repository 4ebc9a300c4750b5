"""The GPU actuators over an in-memory GpuControl: what they plan (defaults and base/max clocks
resolved per GPU), what they refuse before any write, and the journaled apply around them: a fault
at any step leaves every GPU at the target or exactly at its snapshot, and recover() rolls back
what a killed apply left."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.tuning.apply import FAILED, NOTHING_TO_DO, PLANNED, REFUSED, ApplyResult, apply_settings, recover
from agent.tuning.base import Change, Tree, TuningError
from agent.tuning.gpu_control import NOT_LOCKED, UNKNOWN, ClockDomain, PowerLimits
from agent.tuning.gpu_settings import gpu_actuators
from agent.tuning.targets import GpuTargets, Targets

EVERYTHING = GpuTargets(
    persistence_mode="on",
    power_limit=300,
    locked_gpu_clocks=("base", "max"),
    locked_memory_clocks=("max", "max"),
    compute_mode="exclusive_process",
    ecc="off",
)
# What EVERYTHING plans on two_models(): GPU 1 is already in exclusive_process mode.
PLAN = [
    ("gpu[0].persistence_mode", "off", "on", False),
    ("gpu[1].persistence_mode", "off", "on", False),
    ("gpu[0].power_limit", "700", "300", False),
    ("gpu[1].power_limit", "350", "300", False),
    ("gpu[0].locked_gpu_clocks", "reset", "1590..1980", False),
    ("gpu[1].locked_gpu_clocks", "reset", "1110..2520", False),
    ("gpu[0].locked_memory_clocks", "reset", "2619..2619", False),
    ("gpu[1].locked_memory_clocks", "reset", "9001..9001", False),
    ("gpu[0].compute_mode", "default", "exclusive_process", False),
    ("gpu[0].ecc", "on", "off", True),
    ("gpu[1].ecc", "on", "off", True),
]


class Killed(BaseException):
    """The process dies here: nothing after it runs (no rollback), as with SIGKILL."""


@dataclass
class Gpu:
    persistence: bool = False
    limit: float = 700.0
    default: float = 700.0
    low: float = 200.0
    high: float = 700.0
    cap: float | None = None  # a lower limit from elsewhere: the enforced one is the lower
    locked: dict[str, str] = field(default_factory=lambda: {"gpu": NOT_LOCKED, "memory": NOT_LOCKED})
    compute: str = "default"
    ecc: tuple[bool, bool] = (True, True)  # (current, pending)
    base: int | None = 1590
    clocks: dict[str, list[int]] = field(
        default_factory=lambda: {"gpu": list(range(1980, 344, -15)), "memory": [2619]}
    )


class FakeControl:
    """GPUs in memory. `fail_at`: the Nth write raises `fault`; `ignore`: writes (what, gpu) that
    silently do nothing; `unknown_locks`: locked clocks read "unknown" until this control (this
    process) sets them, as with NVML, and `forget()` starts a new process."""

    def __init__(self, *, fail_at: int | None = None, fault: BaseException | None = None) -> None:
        self.state = [Gpu(), l40s()]
        self.fail_at = fail_at
        self.fault = fault or TuningError("gpu 0: injected fault")
        self.ignore: set[tuple[str, int]] = set()
        self.unknown_locks = False
        self.seen: set[tuple[int, str]] = set()
        self.attempts = 0
        self.writes: list[tuple[str, int, object]] = []

    def forget(self) -> None:
        self.seen.clear()

    def _write(self, what: str, gpu: int, value: object) -> bool:
        self.attempts += 1
        if self.attempts == self.fail_at:
            raise self.fault
        self.writes.append((what, gpu, value))
        return (what, gpu) not in self.ignore

    def gpus(self) -> list[int]:
        return list(range(len(self.state)))

    def persistence(self, gpu: int) -> bool:
        return self.state[gpu].persistence

    def set_persistence(self, gpu: int, on: bool) -> None:
        if self._write("persistence", gpu, on):
            self.state[gpu].persistence = on

    def power_limits(self, gpu: int) -> PowerLimits:
        g = self.state[gpu]
        enforced = g.limit if g.cap is None else min(g.limit, g.cap)
        return PowerLimits(g.limit, enforced, g.default, g.low, g.high)

    def set_power_limit(self, gpu: int, watts: float) -> None:
        if self._write("power", gpu, watts):
            self.state[gpu].limit = watts

    def locked_clocks(self, gpu: int, domain: ClockDomain) -> str:
        if self.unknown_locks and (gpu, domain) not in self.seen:
            return UNKNOWN
        return self.state[gpu].locked[domain]

    def supported_clocks(self, gpu: int, domain: ClockDomain) -> list[int]:
        return self.state[gpu].clocks[domain]

    def base_clock(self, gpu: int) -> int | None:
        return self.state[gpu].base

    def lock_clocks(self, gpu: int, domain: ClockDomain, min_mhz: int, max_mhz: int) -> None:
        if self._write(f"lock {domain}", gpu, (min_mhz, max_mhz)):
            self.state[gpu].locked[domain] = f"{min_mhz}..{max_mhz}"
        self.seen.add((gpu, domain))

    def reset_clocks(self, gpu: int, domain: ClockDomain) -> None:
        if self._write(f"reset {domain}", gpu, None):
            self.state[gpu].locked[domain] = NOT_LOCKED
        self.seen.add((gpu, domain))

    def compute_mode(self, gpu: int) -> str:
        return self.state[gpu].compute

    def set_compute_mode(self, gpu: int, mode: str) -> None:
        if self._write("compute", gpu, mode):
            self.state[gpu].compute = mode

    def ecc(self, gpu: int) -> tuple[bool, bool]:
        return self.state[gpu].ecc

    def set_ecc(self, gpu: int, on: bool) -> None:
        if self._write("ecc", gpu, on):
            self.state[gpu].ecc = (self.state[gpu].ecc[0], on)

    def close(self) -> None:
        pass


def l40s() -> Gpu:
    """GPU 1: another model, with its own base clock, clocks and power range."""
    return Gpu(
        limit=350.0,
        default=350.0,
        low=100.0,
        high=350.0,
        base=1110,
        compute="exclusive_process",
        clocks={"gpu": list(range(2520, 209, -15)), "memory": [9001, 5001, 810, 405]},
    )


def run(
    control: FakeControl,
    targets: GpuTargets,
    journal: Path,
    *,
    gpus: list[int] | None = None,
    dry_run: bool = False,
    check: Callable[[list[Change]], list[str]] | None = None,
) -> ApplyResult:
    """apply_settings over the GPU actuators; the host tree is unused by them."""
    actuators = gpu_actuators(control, gpus)
    return apply_settings(
        actuators, Targets(gpu=targets), journal.parent, journal, dry_run=dry_run, check=check
    )


def rows(changes: list[Change]) -> list[tuple[str, str, str, bool]]:
    return [(c.setting, c.current, c.target, c.pending_reboot) for c in changes]


def journals(directory: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


@pytest.fixture
def at_target(tmp_path: Path) -> list[Gpu]:
    """The GPUs of a node that reached EVERYTHING cleanly."""
    control = FakeControl()
    result = run(control, EVERYTHING, tmp_path / "reference")
    assert result.state == "applied", result
    return control.state


def test_a_dry_run_resolves_every_target_per_gpu_and_writes_nothing(tmp_path: Path) -> None:
    control = FakeControl()
    result = run(control, EVERYTHING, tmp_path / "journal", dry_run=True)
    assert result.state == PLANNED and rows(result.changes) == PLAN
    assert control.writes == [] and control.attempts == 0
    assert not (tmp_path / "journal").exists()  # not even the journal


def test_a_clean_apply_reaches_the_target_and_journals_each_actuator(tmp_path: Path) -> None:
    control = FakeControl()
    result = run(control, EVERYTHING, tmp_path / "journal")
    assert result.state == "applied" and rows(result.changes) == PLAN
    gpu0, gpu1 = control.state
    assert (gpu0.persistence, gpu0.limit, gpu0.locked, gpu0.compute) == (
        True,
        300.0,
        {"gpu": "1590..1980", "memory": "2619..2619"},
        "exclusive_process",
    )
    assert gpu0.ecc == gpu1.ecc == (True, False)  # pending until the next reboot
    assert gpu1.locked == {"gpu": "1110..2520", "memory": "9001..9001"}
    [record] = journals(tmp_path / "journal")
    assert record["state"] == "applied"
    changes = {c["setting"]: c for c in record["changes"]}  # type: ignore[attr-defined]
    assert changes["gpu[1].power_limit"]["actuator"] == "gpu_power_limit"
    assert changes["gpu[0].locked_memory_clocks"]["actuator"] == "gpu_locked_memory_clocks"
    ecc = {
        "actuator": "gpu_ecc",
        "setting": "gpu[0].ecc",
        "current": "on",
        "target": "off",
        "pending_reboot": True,
    }
    assert changes["gpu[0].ecc"] == ecc


def test_nothing_to_do_writes_nothing(tmp_path: Path) -> None:
    control = FakeControl()
    assert run(control, EVERYTHING, tmp_path / "j1").state == "applied"
    written = len(control.writes)
    assert run(control, EVERYTHING, tmp_path / "j2").state == NOTHING_TO_DO
    assert len(control.writes) == written and not (tmp_path / "j2").exists()


def test_default_power_limit_is_each_gpu_s_default(tmp_path: Path) -> None:
    control = FakeControl()
    control.state[0].limit = 450.0
    result = run(control, GpuTargets(power_limit="default"), tmp_path / "journal", dry_run=True)
    assert rows(result.changes) == [("gpu[0].power_limit", "450", "700", False)]  # GPU 1 is at its 350


def test_an_odd_milliwatt_limit_is_rolled_back_exactly(tmp_path: Path) -> None:
    control = FakeControl()
    control.state[0].limit = 312.5
    control.ignore.add(("compute", 0))
    targets = GpuTargets(power_limit=300, compute_mode="prohibited")
    result = run(control, targets, tmp_path / "journal", gpus=[0])
    assert result.state == "rolled_back" and rows(result.changes)[0] == (
        "gpu[0].power_limit",
        "312.5",
        "300",
        False,
    )
    assert control.state[0].limit == 312.5


def test_the_actuators_have_distinct_names_and_read_every_gpu(tmp_path: Path) -> None:
    actuators = gpu_actuators(FakeControl())
    names = [a.name for a in actuators]
    assert len(set(names)) == len(names) == 6
    assert "gpu_power_limit" in names
    read = {}
    for actuator in actuators:
        read.update(actuator.read(Tree(tmp_path)))
    assert read["gpu[1].power_limit"] == "350" and read["gpu[0].locked_gpu_clocks"] == "reset"
    assert read["gpu[1].compute_mode"] == "exclusive_process" and read["gpu[0].ecc"] == "on"
    assert len(read) == 12


def test_only_the_gpus_asked_for(tmp_path: Path) -> None:
    result = run(FakeControl(), EVERYTHING, tmp_path / "journal", gpus=[1], dry_run=True)
    assert rows(result.changes) == [row for row in PLAN if row[0].startswith("gpu[1]")]
    with pytest.raises(TuningError, match=r"^gpu 5: not on this node \(its GPUs: 0, 1\)$"):
        gpu_actuators(FakeControl(), [0, 5])


def _no_base(control: FakeControl) -> None:
    control.state[1].base = None


def _capped(control: FakeControl) -> None:
    control.state[0].cap = 400.0  # shows: the enforced limit is below the one set


@pytest.mark.parametrize(
    ("targets", "setup", "problem"),
    [
        (GpuTargets(power_limit=800), None, "gpu 0: power limit 800 W is outside the driver's 200..700 W"),
        (GpuTargets(power_limit=400), None, "gpu 1: power limit 400 W is outside the driver's 100..350 W"),
        (GpuTargets(power_limit="lots"), None, "gpu.power_limit: 'lots' is not watts or 'default'"),
        (
            GpuTargets(power_limit=300, locked_gpu_clocks=(300, 1980)),
            None,
            "gpu 0: locked gpu clocks 300..1980 MHz are outside the supported 345..1980 MHz",
        ),
        (
            GpuTargets(locked_gpu_clocks=(1980, 1590)),
            None,
            "gpu 0: locked gpu clocks 1980..1590: min is above max",
        ),
        (
            GpuTargets(locked_gpu_clocks=("base", "base")),
            _no_base,
            "gpu 1: 'base' is not known for this GPU: give locked_gpu_clocks in MHz",
        ),
        (
            GpuTargets(locked_memory_clocks=("base", "max")),
            None,
            "gpu 0: 'base' is a GPU clock, not a memory one: give locked_memory_clocks in MHz",
        ),
        (
            GpuTargets(persistence_mode="on", compute_mode="exclusive_thread"),
            None,
            "gpu[0].compute_mode: 'exclusive_thread' is not one of default, exclusive_process, prohibited",
        ),
        (GpuTargets(ecc="maybe"), None, "gpu[0].ecc: 'maybe' is not on or off"),
        (
            GpuTargets(persistence_mode="on", power_limit=500),
            _capped,
            "gpu 0: power limit 500 W would not be enforced: another limit caps the GPU at 400 W",
        ),
    ],
)
def test_refused_before_any_write(
    tmp_path: Path, targets: GpuTargets, setup: Callable[[FakeControl], None] | None, problem: str
) -> None:
    control = FakeControl()
    if setup is not None:
        setup(control)
    result = run(control, targets, tmp_path / "journal")
    assert result.state == REFUSED and result.problems == [problem]
    assert control.attempts == 0 and not (tmp_path / "journal").exists()


def test_a_limit_below_a_cap_is_enforced_and_applies(tmp_path: Path) -> None:
    control = FakeControl()
    control.state[0].cap = 400.0
    assert run(control, GpuTargets(power_limit=300), tmp_path / "journal", gpus=[0]).state == "applied"


def test_a_cap_that_did_not_show_fails_the_read_back(tmp_path: Path) -> None:
    control = FakeControl()
    control.state[0].limit, control.state[0].cap = 300.0, 450.0  # enforced 300: the cap is hidden
    result = run(control, GpuTargets(power_limit=500), tmp_path / "journal", gpus=[0])
    assert result.state == "rolled_back"
    assert result.problems[0] == (
        "gpu 0: power limit set to 500 W but 450 W is enforced (a lower limit elsewhere caps the GPU)"
    )
    assert control.state[0].limit == 300.0


def test_a_rollback_keeps_a_cap_that_was_there_before(tmp_path: Path) -> None:
    control = FakeControl()
    control.state[0].cap = 400.0  # 700 set, 400 enforced: the snapshot
    control.ignore.add(("compute", 0))
    targets = GpuTargets(power_limit=300, compute_mode="prohibited")
    result = run(control, targets, tmp_path / "journal", gpus=[0])
    assert result.state == "rolled_back", result  # not needs_attention: 700 is back as set
    assert control.state[0].limit == 700.0


@pytest.mark.parametrize("nth", range(1, len(PLAN) + 1))
def test_a_fault_at_each_write_puts_every_gpu_back(tmp_path: Path, nth: int) -> None:
    control = FakeControl(fail_at=nth)
    before = copy.deepcopy(control.state)
    result = run(control, EVERYTHING, tmp_path / "journal")
    assert result.state == "rolled_back" and result.problems[0] == "gpu 0: injected fault"
    assert control.state == before, f"a fault at write {nth} left a GPU changed"
    assert [r["state"] for r in journals(tmp_path / "journal")] == ["rolled_back"]


@pytest.mark.parametrize("what", ["persistence", "power", "lock gpu", "lock memory", "compute", "ecc"])
def test_a_write_that_does_not_take_fails_the_read_back_and_rolls_back(tmp_path: Path, what: str) -> None:
    control = FakeControl()
    control.ignore.add((what, 1))
    before = copy.deepcopy(control.state)
    targets = dataclasses.replace(EVERYTHING, compute_mode="prohibited")  # GPU 1 changes mode too
    result = run(control, targets, tmp_path / "journal")
    assert result.state == "rolled_back" and "read back" in result.problems[0]
    assert result.problems[0].startswith("gpu[1].")
    assert control.state == before


def test_a_failed_check_rolls_back(tmp_path: Path) -> None:
    control = FakeControl()
    before = copy.deepcopy(control.state)
    result = run(control, EVERYTHING, tmp_path / "journal", check=lambda changes: ["2% slower"])
    assert result.state == "rolled_back" and result.problems == ["2% slower"]
    assert control.state == before


def test_a_journal_that_cannot_be_written_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("")
    control = FakeControl()
    result = run(control, EVERYTHING, tmp_path / "not-a-dir" / "journal")
    assert result.state == FAILED and control.attempts == 0


def test_a_kill_mid_apply_is_rolled_back_by_recover(tmp_path: Path, at_target: list[Gpu]) -> None:
    control = FakeControl(fail_at=6, fault=Killed())
    before = copy.deepcopy(control.state)
    with pytest.raises(Killed):
        run(control, EVERYTHING, tmp_path / "journal")
    assert control.state != before and len(control.writes) == 5
    [left] = journals(tmp_path / "journal")
    assert left["state"] == "applying"

    [result] = recover(tmp_path / "journal", tmp_path, gpu_actuators(control))
    assert result.state == "rolled_back" and result.op_id == left["op_id"]
    assert control.state == before
    assert recover(tmp_path / "journal", tmp_path, gpu_actuators(control)) == []
    assert run(control, EVERYTHING, tmp_path / "journal").state == "applied"  # no longer held up
    assert control.state == at_target


def test_locks_the_driver_cannot_report_are_written_and_unlocked_on_rollback(tmp_path: Path) -> None:
    control = FakeControl()
    control.unknown_locks = True
    lock = run(control, GpuTargets(locked_gpu_clocks=(1590, 1590)), tmp_path / "j", gpus=[0], dry_run=True)
    assert rows(lock.changes) == [("gpu[0].locked_gpu_clocks", "reset", "1590..1590", False)]
    reset = run(control, GpuTargets(locked_gpu_clocks="reset"), tmp_path / "j", gpus=[0], dry_run=True)
    assert rows(reset.changes) == [("gpu[0].locked_gpu_clocks", "unknown", "reset", False)]

    killed = FakeControl(fail_at=2, fault=Killed())
    killed.unknown_locks = True
    with pytest.raises(Killed):
        run(
            killed,
            GpuTargets(locked_gpu_clocks=(1590, 1590), compute_mode="prohibited"),
            tmp_path / "k",
            gpus=[0],
        )
    assert killed.state[0].locked["gpu"] == "1590..1590"
    killed.forget()  # the agent restarts: the lock it set is "unknown" again
    [result] = recover(tmp_path / "k", tmp_path, gpu_actuators(killed))
    assert result.state == "rolled_back" and killed.state[0].locked["gpu"] == NOT_LOCKED


def test_a_reset_over_an_unknown_lock_rolls_back_cleanly(tmp_path: Path) -> None:
    control = FakeControl()
    control.unknown_locks = True
    control.state[0].locked["gpu"] = "1000..1000"  # left by someone else
    control.ignore.add(("compute", 0))
    targets = GpuTargets(locked_gpu_clocks="reset", compute_mode="prohibited")
    result = run(control, targets, tmp_path / "journal", gpus=[0])
    assert result.state == "rolled_back", result  # "unknown" is back: reset is as close as it gets
    assert control.state[0].locked["gpu"] == NOT_LOCKED
