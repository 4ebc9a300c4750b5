"""Profiles are data: every shipped profile loads, a bad document fails with one line naming the
file, the key path and the allowed values, a site's directory adds and overrides profiles, and the
cause map covers every cause with profiles and settings that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.detect import host_tuning
from controller.profiles import ProfileError, load_catalogue, load_cause_map, parse_profile, problems
from controller.profiles.catalogue import SHIPPED_DIR, load_profile
from controller.profiles.causes import CAUSES_FILE, CauseEntry, Fix
from protos.names import CAUSES

SHIPPED = sorted(SHIPPED_DIR.glob("*.yaml"))
HEAD = "name: x\ndescription: test\n"


def error(body: str) -> str:
    with pytest.raises(ProfileError) as info:
        parse_profile(HEAD + body, "profiles/x.yaml")
    return str(info.value)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_each_shipped_profile_loads_and_every_setting_says_why_and_where_from(path: Path) -> None:
    profile = load_profile(path)
    assert profile.name == path.stem
    assert profile.settings()
    for setting in profile.settings():
        assert setting.reason.strip() and setting.source.strip(), setting.path
        assert setting.risk in ("online", "needs_reboot")


def test_the_shipped_catalogue_has_what_real_clusters_use() -> None:
    entries = load_catalogue()
    assert {"gpu-defaults", "gpu-locked-base", "os-accelerator-performance", "bios-hpc"} <= set(entries)
    assert all(e.origin == "shipped" and not e.overrides for e in entries.values())
    defaults = {s.path: s.target for s in entries["gpu-defaults"].profile.settings()}
    assert defaults["gpu.power_limit"] == "default"
    assert defaults["gpu.locked_gpu_clocks"] == "reset"
    assert defaults["gpu.persistence_mode"] == "on"  # YAML's "on" is a string here, never True
    base = {s.path: s.target for s in entries["gpu-locked-base"].profile.settings()}
    assert base["gpu.locked_gpu_clocks"] == {"min_mhz": "base", "max_mhz": "base"}
    host = {s.path: s.target for s in entries["os-accelerator-performance"].profile.settings()}
    assert host["os.cpu_governor"] == "performance"
    assert host["os.sysctls.kernel.numa_balancing"] == 0
    bios = entries["bios-hpc"].profile
    assert bios.risk() == "needs_reboot" and bios.levels() == ["bmc"]
    acs = next(s for s in bios.settings() if s.path == "bmc.bios.PcieAcsControl")
    assert acs.target == "Disabled" and "nccl" in acs.source
    assert entries["gpu-defaults"].profile.risk() == "online"


def test_a_bare_yaml_on_and_off_mean_on_and_off() -> None:
    source = "reason: r\n    source: s"
    profile = parse_profile(
        HEAD
        + f"gpu:\n  persistence_mode:\n    target: on\n    {source}\n  ecc:\n    target: off\n    {source}\n",
        "x.yaml",
    )
    targets = {s.path: (s.target, s.risk) for s in profile.settings()}
    assert targets == {"gpu.persistence_mode": ("on", "online"), "gpu.ecc": ("off", "needs_reboot")}


RS = "reason: r, source: s"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            f"gpu:\n  compute_mode: {{target: exclusive, {RS}}}",
            "profiles/x.yaml: gpu.compute_mode: 'exclusive' is not one of default, exclusive_process, "
            "prohibited",
        ),
        (
            "gpu:\n  fan_speed: 1",
            "profiles/x.yaml: gpu: unknown key 'fan_speed'; allowed: persistence_mode, power_limit, "
            "locked_gpu_clocks, locked_memory_clocks, compute_mode, ecc",
        ),
        (
            f"gpu:\n  application_clocks: {{target: 1410, {RS}}}",
            "profiles/x.yaml: gpu.application_clocks: application clocks are deprecated in NVML 13 and "
            "removed in CUDA 14; use locked_gpu_clocks / locked_memory_clocks",
        ),
        (
            f"os:\n  sysctls:\n    vm.overcommit_memory: {{target: 1, {RS}}}",
            "profiles/x.yaml: os.sysctls: 'vm.overcommit_memory' is not in the allowlist "
            "(kernel.numa_balancing, "
            "kernel.sched_autogroup_enabled, vm.swappiness, vm.zone_reclaim_mode, vm.dirty_ratio, "
            "vm.dirty_background_ratio, vm.min_free_kbytes)",
        ),
        (
            f"os:\n  sysctls:\n    kernel.numa_balancing: {{target: 2, {RS}}}",
            "profiles/x.yaml: os.sysctls.kernel.numa_balancing.target: 2 is outside 0..1",
        ),
        (
            f"gpu:\n  power_limit: {{target: -300, {RS}}}",
            "profiles/x.yaml: gpu.power_limit: power limit must be positive watts or 'default', not -300",
        ),
        (
            f"gpu:\n  power_limit: {{target: max, {RS}}}",
            "profiles/x.yaml: gpu.power_limit: 'max' is not watts (a positive integer) or 'default'",
        ),
        (
            f"gpu:\n  locked_gpu_clocks: {{target: {{min_mhz: 1980, max_mhz: 1410}}, {RS}}}",
            "profiles/x.yaml: gpu.locked_gpu_clocks: min_mhz 1980 is above max_mhz 1410",
        ),
        (
            f"gpu:\n  locked_memory_clocks: {{target: {{min_mhz: boost, max_mhz: 2619}}, {RS}}}",
            "profiles/x.yaml: gpu.locked_memory_clocks: min_mhz: 'boost' is not one of base, max (or MHz)",
        ),
        (
            f"gpu:\n  locked_gpu_clocks: {{target: unlocked, {RS}}}",
            "profiles/x.yaml: gpu.locked_gpu_clocks: 'unlocked' is not {min_mhz, max_mhz} or 'reset'",
        ),
        (
            f"os:\n  transparent_hugepages:\n    defrag: {{target: sometimes, {RS}}}",
            "profiles/x.yaml: os.transparent_hugepages.defrag.target: 'sometimes' is not one of always, "
            "defer, defer+madvise, madvise, never",
        ),
        (
            f"os:\n  cpu_governor: {{target: turbo, {RS}}}",
            "profiles/x.yaml: os.cpu_governor: 'turbo' is not one of performance, powersave, schedutil, "
            "ondemand, conservative, userspace",
        ),
        (
            f"os:\n  hugepages: {{target: -1, {RS}}}",
            "profiles/x.yaml: os.hugepages: hugepages must be 0 or more, not -1",
        ),
        (
            "gpu:\n  power_limit: {target: 700, reason: r}",
            "profiles/x.yaml: gpu.power_limit: missing key 'source'",
        ),
        (
            f"bmc:\n  firmware:\n    - {{component: BMC, target: fleet, {RS}, apply: true}}",
            "profiles/x.yaml: bmc.firmware.0: unknown key 'apply'; "
            "allowed: reason, source, component, target",
        ),
        (
            f"bmc:\n  bios:\n    TurboMode: {{target: Enabled, {RS}, "
            "vendors: {Dell: {name: X, target: Y}}}",
            "profiles/x.yaml: bmc.bios.TurboMode.vendors: 'Dell' must be a lower-case vendor name",
        ),
        ("gpu: {}", "profiles/x.yaml: (top level): a profile sets at least one setting (gpu, os or bmc)"),
        (
            "level: gpu",
            "profiles/x.yaml: (top level): unknown key 'level'; allowed: name, description, gpu, os, bmc",
        ),
    ],
)
def test_a_bad_document_says_file_key_and_allowed_values(body: str, expected: str) -> None:
    assert error(body) == expected


def test_not_yaml_and_not_a_mapping_name_the_file() -> None:
    with pytest.raises(ProfileError, match=r"^p\.yaml: not valid YAML"):
        parse_profile("name: [", "p.yaml")
    with pytest.raises(ProfileError, match=r"^p\.yaml: a profile is a mapping"):
        parse_profile("- 1", "p.yaml")
    with pytest.raises(ProfileError, match=r"^x\.yaml: name: 'GPU_Fast' must be lower-case"):
        parse_profile(
            "name: GPU_Fast\ndescription: d\nos: {hugepages: {target: 0, reason: r, source: s}}", "x.yaml"
        )


SITE_DEFAULTS = """name: gpu-defaults
description: This site's defaults keep ECC on as well.
gpu:
  power_limit: {target: default, reason: r, source: site runbook}
  locked_gpu_clocks: {target: reset, reason: r, source: site runbook}
  locked_memory_clocks: {target: reset, reason: r, source: site runbook}
  ecc: {target: "on", reason: r, source: site runbook}
"""
SITE_OWN = "name: gpu-capped\ndescription: d\ngpu:\n  power_limit: {target: 600, reason: r, source: s}\n"


def test_a_site_directory_adds_profiles_and_wins_on_a_shared_name(tmp_path: Path) -> None:
    (tmp_path / "defaults.yaml").write_text(SITE_DEFAULTS)
    (tmp_path / "capped.yml").write_text(SITE_OWN)
    entries = load_catalogue(tmp_path)
    assert entries["gpu-defaults"].origin == "site" and entries["gpu-defaults"].overrides
    assert entries["gpu-defaults"].profile.risk() == "needs_reboot"
    assert entries["gpu-capped"].origin == "site" and not entries["gpu-capped"].overrides
    assert entries["bios-hpc"].origin == "shipped"
    assert list(entries) == sorted(entries)
    assert problems(load_cause_map(), entries) == []  # the site's gpu-defaults still has what causes name


def test_a_name_twice_in_one_directory_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(SITE_OWN)
    (tmp_path / "b.yaml").write_text(SITE_OWN)
    with pytest.raises(ProfileError, match=r"b\.yaml: profile 'gpu-capped' is already defined in .*a\.yaml"):
        load_catalogue(tmp_path)


def test_a_bad_site_profile_or_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="not a directory of profiles"):
        load_catalogue(tmp_path / "missing")
    (tmp_path / "bad.yaml").write_text(SITE_OWN.replace("600", "-1"))
    with pytest.raises(ProfileError, match=r"bad\.yaml: gpu\.power_limit: power limit must be positive"):
        load_catalogue(tmp_path)


def test_the_cause_map_covers_every_cause_with_profiles_and_settings_that_exist() -> None:
    causes = load_cause_map()
    assert set(causes) == set(CAUSES)
    assert problems(causes, load_catalogue()) == []
    assert causes["clocks_locked_low"].fixes[0].profile == "gpu-defaults"
    assert "gpu.locked_gpu_clocks" in causes["clocks_locked_low"].fixes[0].settings
    assert causes["power_cap"].fixes[0].settings == ["gpu.power_limit"]
    for cause in ("cpu_governor_powersave", "host_tuning_drift"):
        assert causes[cause].fixes[0].profile == "os-accelerator-performance"
    # host_tuning_drift sets what its findings name: one entry per setting the detector compares
    assert set(causes["host_tuning_drift"].fixes[0].by_evidence) == set(host_tuning.SETTINGS)
    assert causes["bios_drift"].action == "set_fleet_value"
    assert causes["firmware_drift"].action == "recommend_firmware"
    assert causes["slow_unknown"].action == "investigate"
    for cause in (
        "nvlink_down",
        "ecc_row_remap_pending",
        "xid_error",
        "hbm_degraded",
        "pcie_downtrained",
        "fan_failure",
        "psu_failure",
        "thermal_throttle",
        "power_brake",
    ):
        assert causes[cause].action == "drain" and causes[cause].reason, cause


def test_the_cause_map_check_finds_what_is_missing_or_dangling() -> None:
    causes = dict(load_cause_map())
    del causes["nvlink_down"]
    causes["power_cap"] = CauseEntry(
        action="tune", reason="r", fixes=[Fix(profile="gpu-defaults", settings=["gpu.app_clocks"])]
    )
    causes["clocks_locked_low"] = CauseEntry(action="tune", reason="r", fixes=[Fix(profile="nope")])
    causes["xid_error"] = CauseEntry(action="tune", reason="r")
    causes["gpu_on_fire"] = CauseEntry(action="drain", reason="r")
    os_profile = "os-accelerator-performance"
    causes["host_tuning_drift"] = CauseEntry(
        action="tune",
        reason="r",
        fixes=[
            Fix(profile=os_profile, by_evidence={"numa_balancing": ["os.sysctls.kernel.numa"], "thp": []}),
            Fix(profile=os_profile, settings=["os.cpu_governor"], by_evidence={"x": ["os.cpu_governor"]}),
        ],
    )
    found = problems(causes, load_catalogue())
    assert f"host_tuning_drift: profile {os_profile} has no setting 'os.sysctls.kernel.numa'" in found
    assert "host_tuning_drift: by_evidence 'thp' names no setting" in found
    assert f"host_tuning_drift: profile {os_profile} has both settings and by_evidence" in found
    assert "cause 'nvlink_down' has no entry" in found
    assert "power_cap: profile gpu-defaults has no setting 'gpu.app_clocks'" in found
    assert "clocks_locked_low: no profile 'nope'" in found
    assert "xid_error: action tune names no profile" in found
    assert any(p.startswith("'gpu_on_fire' is not a cause") for p in found)
    assert CAUSES_FILE.is_file()
