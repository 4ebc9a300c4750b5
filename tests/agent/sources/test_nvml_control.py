"""NvmlControl against the fake NVML: milliwatts as watts, the errors a normal user, an unsupported
GPU and a refused value get (one clear line each, nothing changed by the apply), ECC pending until
a reboot, and locked clocks known only once this process set them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.sources.nvml import control as control_module
from agent.sources.nvml import source as nvml_source
from agent.sources.nvml.control import NvmlControl
from agent.tuning.apply import NOTHING_TO_DO, REFUSED, ApplyResult, apply_settings, recover
from agent.tuning.base import TuningError
from agent.tuning.gpu_control import PowerLimits
from agent.tuning.gpu_settings import gpu_actuators
from agent.tuning.targets import GpuTargets, Targets
from tests.agent.sources.test_nvml_fake import FakeNvml

H100, L40S = "NVIDIA H100 80GB HBM3", "NVIDIA L40S"
BASE_CLOCKS = {H100: 1590, L40S: 1110}
SETTERS = ("nvmlDeviceSet", "nvmlDeviceReset")

FULL = GpuTargets(
    persistence_mode="off",
    power_limit=300,
    locked_gpu_clocks=("base", "max"),
    locked_memory_clocks=("max", "max"),
    compute_mode="prohibited",
    ecc="off",
)


class Killed(BaseException):
    """The process dies here: nothing after it runs (no rollback), as with SIGKILL."""


@pytest.fixture(autouse=True)
def new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh agent: no locked clocks remembered from another."""
    monkeypatch.setattr(control_module, "_locked", {})


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


@pytest.fixture
def root() -> FakeNvml:
    return FakeNvml(root=True)


@pytest.fixture
def control(fake: FakeNvml) -> Iterator[NvmlControl]:
    opened = open_control(fake)
    yield opened
    opened.close()


def open_control(fake: FakeNvml) -> NvmlControl:
    return NvmlControl(nvml=fake.module, base_clocks=BASE_CLOCKS)


def settings(fake: FakeNvml) -> list[tuple[Any, ...]]:
    """What the apply may change, on every GPU."""
    return [(g.persistence, g.limit_mw, dict(g.locked), g.compute_mode, g.ecc) for g in fake.gpus]


def setter_calls(fake: FakeNvml) -> int:
    return sum(n for (name, _), n in fake.calls.items() if name.startswith(SETTERS))


def run(
    control: NvmlControl, targets: GpuTargets, journal: Path, *, gpus: list[int] | None = None
) -> ApplyResult:
    """apply_settings over the GPU actuators; the host tree is unused by them."""
    return apply_settings(gpu_actuators(control, gpus), Targets(gpu=targets), journal.parent, journal)


def journal_states(directory: Path) -> list[str]:
    return [json.loads(p.read_text())["state"] for p in sorted(directory.glob("*.json"))]


def kill_at(fake: FakeNvml, nth: int) -> None:
    """The agent dies at the Nth setter call into NVML."""
    count = 0

    def dying(real: Any) -> Any:
        def call(*args: Any) -> Any:
            nonlocal count
            count += 1
            if count == nth:
                raise Killed
            return real(*args)

        return call

    for name in dir(fake.module):
        if name.startswith(SETTERS):
            setattr(fake.module, name, dying(getattr(fake.module, name)))


def test_limits_are_read_in_watts(control: NvmlControl) -> None:
    assert control.gpus() == [0, 1]
    assert control.power_limits(1) == PowerLimits(350.0, 350.0, 350.0, 100.0, 350.0)
    assert control.supported_clocks(1, "memory") == [9001, 5001, 810, 405]
    gpu = control.supported_clocks(1, "gpu")
    assert gpu[:2] == [2520, 2505] and gpu[-1] == 210
    assert (control.base_clock(0), control.compute_mode(1), control.ecc(0)) == (
        1590,
        "exclusive_process",
        (True, True),
    )
    assert control.persistence(0) is True


def test_a_model_without_a_known_base_clock_answers_none(fake: FakeNvml) -> None:
    control = NvmlControl(nvml=fake.module, base_clocks={H100: 1590})
    assert (control.base_clock(0), control.base_clock(1)) == (1590, None)  # the L40S answers bytes
    assert NvmlControl(nvml=fake.module).base_clock(0) is None


def test_without_root_the_apply_changes_nothing_and_says_why(
    fake: FakeNvml, control: NvmlControl, tmp_path: Path
) -> None:
    before = settings(fake)
    result = run(control, GpuTargets(persistence_mode="off", power_limit=300), tmp_path / "journal")
    assert result.state == "rolled_back"
    assert result.problems[0] == "gpu 0: needs root (or CAP_SYS_ADMIN) to set persistence mode to off"
    assert settings(fake) == before and setter_calls(fake) == 1
    assert journal_states(tmp_path / "journal") == ["rolled_back"]


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (
            lambda c: c.set_power_limit(0, 300),
            "gpu 0: needs root (or CAP_SYS_ADMIN) to set power limit to 300 W",
        ),
        (
            lambda c: c.lock_clocks(0, "gpu", 1590, 1980),
            "gpu 0: needs root (or CAP_SYS_ADMIN) to set locked gpu clocks to 1590..1980 MHz",
        ),
        (
            lambda c: c.reset_clocks(1, "memory"),
            "gpu 1: needs root (or CAP_SYS_ADMIN) to set locked memory clocks to reset",
        ),
        (
            lambda c: c.set_compute_mode(1, "prohibited"),
            "gpu 1: needs root (or CAP_SYS_ADMIN) to set compute mode to prohibited",
        ),
        (lambda c: c.set_ecc(0, False), "gpu 0: needs root (or CAP_SYS_ADMIN) to set ECC mode to off"),
    ],
)
def test_every_setter_needs_root(fake: FakeNvml, control: NvmlControl, call: Any, problem: str) -> None:
    before = settings(fake)
    with pytest.raises(TuningError) as raised:
        call(control)
    assert str(raised.value) == problem and settings(fake) == before


def test_as_root_every_setting_applies_and_reads_back(root: FakeNvml, tmp_path: Path) -> None:
    control = open_control(root)
    result = run(control, FULL, tmp_path / "journal")
    assert result.state == "applied", result
    prohibited = pynvml.NVML_COMPUTEMODE_PROHIBITED
    assert settings(root) == [
        (False, 300_000, {"gpu": (1590, 1980), "memory": (2619, 2619)}, prohibited, (True, False)),
        (False, 300_000, {"gpu": (1110, 2520), "memory": (9001, 9001)}, prohibited, (True, False)),
    ]
    assert run(control, FULL, tmp_path / "journal").state == NOTHING_TO_DO  # this process knows the locks


def test_ecc_is_pending_until_a_reboot(root: FakeNvml, tmp_path: Path) -> None:
    control = open_control(root)
    result = run(control, GpuTargets(ecc="off"), tmp_path / "journal", gpus=[0])
    assert result.state == "applied"
    [change] = result.changes
    assert (change.setting, change.current, change.target, change.pending_reboot) == (
        "gpu[0].ecc",
        "on",
        "off",
        True,
    )
    assert control.ecc(0) == (True, False)  # still on now, off after the next reboot
    assert run(control, GpuTargets(ecc="off"), tmp_path / "journal", gpus=[0]).state == NOTHING_TO_DO


def test_an_ecc_less_gpu_is_refused_before_any_write(root: FakeNvml, tmp_path: Path) -> None:
    root.gpus[1].unsupported = {"ecc"}
    result = run(open_control(root), GpuTargets(persistence_mode="off", ecc="off"), tmp_path / "journal")
    assert result.state == REFUSED and result.problems == ["gpu 1: ECC mode not supported on this GPU"]
    assert setter_calls(root) == 0


def test_a_setter_the_gpu_does_not_support_rolls_back(root: FakeNvml, tmp_path: Path) -> None:
    before = settings(root)
    root.gpus[1].unsupported = {"compute_mode"}
    result = run(
        open_control(root), GpuTargets(persistence_mode="off", compute_mode="prohibited"), tmp_path / "j"
    )
    assert result.state == "rolled_back"
    assert result.problems[0] == "gpu 1: compute mode not supported on this GPU"
    assert settings(root) == before


def test_a_function_the_driver_lacks_reads_as_not_supported(root: FakeNvml) -> None:
    root.errors[("nvmlDeviceSetMemoryLockedClocks", 0)] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    with pytest.raises(TuningError, match=r"^gpu 0: locked memory clocks not supported on this GPU$"):
        open_control(root).lock_clocks(0, "memory", 2619, 2619)


def test_clocks_the_driver_does_not_list_cannot_resolve_max(root: FakeNvml, tmp_path: Path) -> None:
    root.gpus[0].unsupported = {"locked_gpu_clocks"}
    control = open_control(root)
    assert control.supported_clocks(0, "gpu") == []
    result = run(control, GpuTargets(locked_gpu_clocks=("max", "max")), tmp_path / "journal")
    assert result.problems == ["gpu 0: 'max' unknown: the driver lists no gpu clocks"]


def test_values_outside_the_driver_s_constraints_are_refused(root: FakeNvml) -> None:
    control = open_control(root)
    with pytest.raises(TuningError) as power:
        control.set_power_limit(0, 900)
    assert str(power.value) == "gpu 0: power limit 900 W refused: outside the driver's constraints"
    with pytest.raises(TuningError) as clocks:
        control.lock_clocks(1, "memory", 100, 100)
    assert (
        str(clocks.value)
        == "gpu 1: locked memory clocks 100..100 MHz refused: outside the driver's constraints"
    )
    assert root.gpus[0].limit_mw == 700_000 and root.gpus[1].locked == {}


def test_a_value_the_driver_refuses_mid_apply_rolls_back(root: FakeNvml, tmp_path: Path) -> None:
    before = settings(root)
    root.errors[("nvmlDeviceSetPowerManagementLimit", 1)] = pynvml.NVML_ERROR_INVALID_ARGUMENT
    result = run(open_control(root), GpuTargets(power_limit=300), tmp_path / "journal")
    assert result.state == "rolled_back"
    assert result.problems[0] == "gpu 1: power limit 300 W refused: outside the driver's constraints"
    assert settings(root) == before  # GPU 0's limit, set first, is back


def test_a_hidden_cap_fails_the_read_back_of_the_enforced_limit(root: FakeNvml, tmp_path: Path) -> None:
    root.gpus[0].limit_mw, root.gpus[0].power_cap_mw = 400_000, 450_000  # enforced 400 W: hidden
    result = run(open_control(root), GpuTargets(power_limit=500), tmp_path / "journal", gpus=[0])
    assert result.state == "rolled_back"
    assert result.problems[0] == (
        "gpu 0: power limit set to 500 W but 450 W is enforced (a lower limit elsewhere caps the GPU)"
    )
    assert root.gpus[0].limit_mw == 400_000


def test_locked_clocks_are_known_once_this_process_sets_them(root: FakeNvml) -> None:
    control = open_control(root)
    assert control.locked_clocks(0, "gpu") == "unknown"
    control.lock_clocks(0, "gpu", 1590, 1980)
    assert open_control(root).locked_clocks(0, "gpu") == "1590..1980"  # any control of this process
    assert control.locked_clocks(0, "memory") == control.locked_clocks(1, "gpu") == "unknown"
    control.reset_clocks(0, "gpu")
    assert control.locked_clocks(0, "gpu") == "reset" and root.gpus[0].locked == {}


def test_a_kill_mid_apply_is_rolled_back_by_a_restarted_agent(
    root: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = settings(root)
    kill_at(root, 3)
    targets = GpuTargets(power_limit=300, locked_gpu_clocks=(1590, 1980), compute_mode="prohibited")
    with pytest.raises(Killed):
        run(open_control(root), targets, tmp_path / "journal", gpus=[0])
    assert (root.gpus[0].limit_mw, root.gpus[0].locked) == (300_000, {"gpu": (1590, 1980)})
    monkeypatch.setattr(control_module, "_locked", {})  # the agent restarts: the lock is "unknown"
    restarted = open_control(root)
    [result] = recover(tmp_path / "journal", tmp_path, gpu_actuators(restarted))
    assert result.state == "rolled_back", result
    assert settings(root) == before


def test_nvml_is_initialised_here_and_shut_down_once(fake: FakeNvml) -> None:
    control = open_control(fake)
    assert (fake.initialised, fake.shut_down) == (1, 0)
    control.close()
    control.close()
    assert fake.shut_down == 1
    with pytest.raises(TuningError, match="closed"):
        control.persistence(0)


@pytest.mark.parametrize(
    ("code", "problem"),
    [
        (
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            "cannot tune GPUs: NVML library not found (is the NVIDIA driver installed?)",
        ),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "cannot tune GPUs: the NVIDIA driver is not loaded"),
    ],
)
def test_no_nvml_is_a_tuning_error(fake: FakeNvml, code: int, problem: str) -> None:
    fake.errors[("nvmlInit", None)] = code
    with pytest.raises(TuningError) as raised:
        open_control(fake)
    assert str(raised.value) == problem


def test_no_pynvml_is_a_tuning_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_source, "_pynvml", None)
    with pytest.raises(TuningError, match=r"the pynvml module is missing .*: install nvidia-ml-py$"):
        NvmlControl()


def test_a_lost_gpu_says_so(fake: FakeNvml, control: NvmlControl) -> None:
    fake.gpus[1].lost = True
    with pytest.raises(TuningError, match=r"^gpu 1: lost \(fallen off the bus\)$"):
        control.compute_mode(1)


def test_a_dry_run_calls_no_setter(root: FakeNvml, tmp_path: Path) -> None:
    before = settings(root)
    result = apply_settings(
        gpu_actuators(open_control(root)), Targets(gpu=FULL), tmp_path, tmp_path / "j", dry_run=True
    )
    assert result.state == "planned" and len(result.changes) == 12
    assert setter_calls(root) == 0 and settings(root) == before


@pytest.mark.parametrize(
    ("setter", "what"),
    [
        ("nvmlDeviceSetPersistenceMode", "persistence mode to off"),
        ("nvmlDeviceSetPowerManagementLimit", "power limit to 300 W"),
        ("nvmlDeviceSetGpuLockedClocks", "locked gpu clocks to 1110..2520 MHz"),
        ("nvmlDeviceSetMemoryLockedClocks", "locked memory clocks to 9001..9001 MHz"),
        ("nvmlDeviceSetComputeMode", "compute mode to prohibited"),
        ("nvmlDeviceSetEccMode", "ECC mode to off"),
    ],
)
def test_a_failing_setter_on_the_last_gpu_puts_every_gpu_back(
    root: FakeNvml, tmp_path: Path, setter: str, what: str
) -> None:
    before = settings(root)
    root.errors[(setter, 1)] = pynvml.NVML_ERROR_UNKNOWN
    result = run(open_control(root), FULL, tmp_path / "journal")
    assert result.state == "rolled_back" and result.problems[0] == f"gpu 1: cannot set {what}: Unknown Error"
    assert settings(root) == before
