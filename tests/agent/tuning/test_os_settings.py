"""Each OS actuator reads and writes a temp tree shaped like the kernel's files; bad targets are
refused before any write, and OS errors become one clear line."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from agent.tuning.apply import REFUSED, apply_settings
from agent.tuning.base import Change, Tree, TuningError
from agent.tuning.fake import KernelTree
from agent.tuning.os_settings import CpuGovernor, Hugepages, Sysctls, TransparentHugepages, os_actuators
from agent.tuning.targets import SYSCTLS, OsTargets, Targets
from controller.profiles.schema import SYSCTLS as SCHEMA_SYSCTLS
from tests.agent.tuning.host_tree import CPU, NR_HUGEPAGES, SWAPPINESS, THP, contents, make_host


def test_each_actuator_reads_the_kernel_files(tmp_path: Path) -> None:
    tree = Tree(make_host(tmp_path, cpus=11))
    governors = CpuGovernor().read(tree)
    assert list(governors)[:3] == ["os.cpu_governor.cpu0", "os.cpu_governor.cpu1", "os.cpu_governor.cpu2"]
    assert list(governors)[-1] == "os.cpu_governor.cpu10" and set(governors.values()) == {"powersave"}
    assert Sysctls().read(tree) == {
        "os.sysctls.kernel.numa_balancing": "1",
        "os.sysctls.vm.swappiness": "60",
        "os.sysctls.vm.zone_reclaim_mode": "0",
        "os.sysctls.vm.dirty_ratio": "20",
    }
    assert TransparentHugepages().read(tree) == {
        "os.transparent_hugepages.enabled": "madvise",
        "os.transparent_hugepages.defrag": "madvise",
    }
    assert Hugepages().read(tree) == {"os.hugepages": "0"}


@pytest.mark.parametrize(
    ("targets", "rel", "expected"),
    [
        (OsTargets(cpu_governor="performance"), f"{CPU}/cpu1/cpufreq/scaling_governor", "performance\n"),
        (OsTargets(sysctls={"vm.swappiness": 10}), SWAPPINESS, "10\n"),
        (OsTargets(thp_enabled="never"), f"{THP}/enabled", "always madvise [never]"),
        (
            OsTargets(thp_defrag="defer+madvise"),
            f"{THP}/defrag",
            "always defer [defer+madvise] madvise never",
        ),
        (OsTargets(hugepages=64), NR_HUGEPAGES, "64"),
    ],
)
def test_each_actuator_writes_and_reads_back(
    tmp_path: Path, targets: OsTargets, rel: str, expected: str
) -> None:
    tree = KernelTree(make_host(tmp_path))
    result = apply_settings(os_actuators(), targets, tree, tmp_path / "journal")
    assert result.state == "applied", result.problems
    assert (tmp_path / rel).read_text().strip() == expected.strip()
    for actuator in os_actuators():  # a second apply finds nothing to do
        assert actuator.plan(tree, Targets(os=targets)) == []


def test_the_plain_tree_writes_a_value_file(tmp_path: Path) -> None:
    tree = Tree(make_host(tmp_path))
    Sysctls().apply(tree, Change("os.sysctls.vm.swappiness", "60", "10"))
    assert (tmp_path / SWAPPINESS).read_text() == "10\n"
    Sysctls().verify(tree, Change("os.sysctls.vm.swappiness", "60", "10"))


def test_the_allowlist_matches_the_controller_schema() -> None:
    assert SYSCTLS == SCHEMA_SYSCTLS


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (OsTargets(sysctls={"kernel.panic": 1}), "sysctl 'kernel.panic' is not in the allowlist"),
        (OsTargets(sysctls={"vm.swappiness": 500}), "os.sysctls.vm.swappiness: 500 is outside 0..200"),
        (
            OsTargets(cpu_governor="turbo"),
            "os.cpu_governor.cpu0: 'turbo' is not one of performance, powersave",
        ),
        (OsTargets(thp_enabled="defer"), "'defer' is not one of always, madvise, never"),
        (OsTargets(hugepages=-1), "os.hugepages: -1 is not a count"),
        (OsTargets(sysctls={"vm.dirty_background_ratio": 5}), "not supported on this kernel: /proc/sys/vm"),
    ],
)
def test_a_bad_target_is_refused_before_any_write(tmp_path: Path, targets: OsTargets, message: str) -> None:
    make_host(tmp_path / "host")
    before = contents(tmp_path / "host")
    tree = KernelTree(tmp_path / "host")
    # A valid sysctl comes first, so a refusal after it would show as a write.
    asked = OsTargets(
        cpu_governor=targets.cpu_governor,
        sysctls={"vm.zone_reclaim_mode": 1, **targets.sysctls},
        thp_enabled=targets.thp_enabled,
        hugepages=targets.hugepages,
    )
    result = apply_settings(os_actuators(), asked, tree, tmp_path / "journal")
    assert result.state == REFUSED
    assert message in result.problems[0]
    assert tree.writes == [] and contents(tmp_path / "host") == before
    assert not (tmp_path / "journal").exists()


def test_no_cpufreq_is_not_supported(tmp_path: Path) -> None:
    tree = Tree(make_host(tmp_path, cpus=0))
    with pytest.raises(TuningError, match="not supported on this kernel: no cpufreq"):
        CpuGovernor().plan(tree, OsTargets(cpu_governor="performance"))


def test_a_value_the_kernel_refuses_is_named(tmp_path: Path) -> None:
    tree = KernelTree(make_host(tmp_path))
    with pytest.raises(TuningError) as caught:  # validate skipped: the kernel itself says no
        TransparentHugepages().apply(tree, Change("os.transparent_hugepages.enabled", "madvise", "sometimes"))
    assert str(caught.value) == (
        "the kernel refused 'sometimes' for /sys/kernel/mm/transparent_hugepage/enabled: Invalid argument"
    )


NEEDS_ROOT = "needs root (or CAP_SYS_ADMIN) to write /proc/sys/vm/swappiness"


def test_permission_denied_is_one_clear_line_before_any_write(tmp_path: Path) -> None:
    """Tests run as root in CI, where a 0444 file is still writable: a fake refuses as the kernel would."""
    make_host(tmp_path)
    denied = PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    tree = KernelTree(tmp_path, fail_paths={"proc/sys/vm/swappiness": denied})
    targets = OsTargets(sysctls={"vm.zone_reclaim_mode": 1, "vm.swappiness": 10})
    result = apply_settings(os_actuators(), targets, tree, tmp_path / "journal")
    assert (result.state, result.problems, tree.writes) == (REFUSED, [NEEDS_ROOT], [])


def test_a_read_only_file_without_root(tmp_path: Path) -> None:
    make_host(tmp_path)
    (tmp_path / SWAPPINESS).chmod(0o444)
    if os.geteuid() == 0:
        pytest.skip("root writes a 0444 file; the fake above covers permission denied")
    result = apply_settings(
        os_actuators(), OsTargets(sysctls={"vm.swappiness": 10}), tmp_path, tmp_path / "j"
    )
    assert (result.state, result.problems) == (REFUSED, [NEEDS_ROOT])


def test_a_write_refused_for_permission_is_translated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Permission can also fail at the write itself (a capability dropped, an LSM): same message."""
    tree = Tree(make_host(tmp_path))

    def refuse(*args: object, **kwargs: object) -> int:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(TuningError) as caught:
        Sysctls().apply(tree, Change("os.sysctls.vm.swappiness", "60", "10"))
    assert str(caught.value) == NEEDS_ROOT
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_targets_read_the_profile_os_section() -> None:
    profile_os = {
        "cpu_governor": {"target": "performance", "reason": "r", "source": "s"},
        "sysctls": {"kernel.numa_balancing": {"target": 0, "reason": "r", "source": "s"}},
        "transparent_hugepages": {"enabled": {"target": "always", "reason": "r", "source": "s"}},
        "hugepages": 8,
    }
    assert OsTargets.from_dict(profile_os) == OsTargets(
        cpu_governor="performance", sysctls={"kernel.numa_balancing": 0}, thp_enabled="always", hugepages=8
    )
