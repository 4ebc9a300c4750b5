"""A profile's settings on one node: the targets an ApplyProfile carries (targets_json) and the
exact changes, each with its current value from the node's latest readings.

Each change names the setting as the agent reports it (`gpu[3].power_limit`, `os.cpu_governor`,
`bmc.bios.PcieAcsControl`), its current value from the node's latest readings ("unknown" where they
do not say) and its target; a setting the readings show at its target already is left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from controller.fleet.governors import governors_text
from controller.fleet.model import NodeState
from controller.profiles import Profile, SettingView
from controller.store.recommendations import Change
from protos.gpufleet.v1 import bmc_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.names import clock_event_reason_names, enum_name

UNKNOWN = "unknown"


def applicable(profile: Profile, settings: Iterable[str] = ()) -> list[SettingView]:
    """The profile's settings an apply sets (firmware is recommend only): all, or those named."""
    named = set(settings)
    return [v for v in profile.settings() if not v.recommend_only and (not named or v.path in named)]


def targets_of(views: Iterable[SettingView]) -> dict[str, Any]:
    """The settings as ApplyProfile.targets_json carries them: bare targets, by level; a BIOS
    attribute with vendor names keeps them ({target, vendors})."""
    out: dict[str, Any] = {}
    for view in views:
        level, rest = view.path.split(".", 1)
        section = out.setdefault(level, {})
        if level == "gpu" or rest in ("cpu_governor", "hugepages"):
            section[rest] = view.target
        elif level == "os":
            group, name = rest.split(".", 1)  # sysctls.<name>, transparent_hugepages.<enabled|defrag>
            section.setdefault(group, {})[name] = view.target
        elif rest.startswith("bios."):
            name = rest.removeprefix("bios.")
            bios = section.setdefault("bios", {})
            bios[name] = {"target": view.target, "vendors": view.vendors} if view.vendors else view.target
    return out


def gpu_indexes(node: NodeState, gpus: list[int]) -> list[int]:
    return list(gpus) or sorted({g.index for g in node.hello.inventory.gpus} | set(node.gpus))


def setting_changes(view: SettingView, node: NodeState, gpus: list[int]) -> list[Change]:
    level, rest = view.path.split(".", 1)
    reboot = view.risk == "needs_reboot"
    if level == "gpu":
        out = []
        for index in gpu_indexes(node, gpus):
            state = node.gpus.get(index)
            found = gpu_change(None if state is None else state.sample, rest, view)
            if found is not None:
                out.append(Change(f"gpu[{index}].{rest}", *found, pending_reboot=reboot))
        return out
    if level == "os":
        found = host_change(node.host, rest, view)
        return [] if found is None else [Change(view.path, *found)]
    name = rest.removeprefix("bios.")
    setting, current, target = bios_change(node.bmc, name, view)
    return [] if current == target else [Change(f"bmc.bios.{setting}", current, target, pending_reboot=True)]


def _mhz(hz: float) -> str:
    return f"{hz / 1e6:.0f} MHz"


def _watts(sample: pb.GpuSample, name: str) -> float | None:
    return getattr(sample, name) if sample.HasField(name) else None  # type: ignore[arg-type]


def gpu_change(sample: pb.GpuSample | None, name: str, view: SettingView) -> tuple[str, str] | None:
    """(current, target) of a GPU setting from its latest reading; None when it is at the target."""
    target = view.target_text()
    if sample is None:
        return UNKNOWN, target
    if name == "power_limit":
        now = _watts(sample, "power_management_limit_watts") or _watts(sample, "enforced_power_limit_watts")
        want = _watts(sample, "default_power_limit_watts") if view.target == "default" else float(view.target)
        if view.target == "default" and want is not None:
            target = f"default ({want:.0f} W)"
        elif view.target != "default":
            target = f"{view.target} W"
        if now is not None and want is not None and abs(now - want) < 0.5:
            return None
        return (UNKNOWN if now is None else f"{now:.0f} W"), target
    if name in ("persistence_mode", "ecc"):
        flag = "persistence_mode_enabled" if name == "persistence_mode" else "ecc_mode_enabled"
        if not sample.HasField(flag):  # type: ignore[arg-type]
            return UNKNOWN, target
        on_off = "on" if getattr(sample, flag) else "off"
        return None if on_off == target else (on_off, target)
    if name == "compute_mode":
        mode = enum_name(pb.ComputeMode, sample.compute_mode) if sample.HasField("compute_mode") else ""
        return None if mode == target else (mode or UNKNOWN, target)
    if name == "locked_gpu_clocks" and "applications_clocks_setting" in clock_event_reason_names(
        sample.clock_event_reasons
    ):
        hz = sample.applications_sm_clock_hz or sample.sm_clock_hz
        return (f"locked ({_mhz(hz)})" if hz else "locked"), target
    if name == "locked_memory_clocks":
        app, top = sample.applications_memory_clock_hz, sample.max_memory_clock_hz
        if app and top and app < 0.95 * top:
            return f"locked ({_mhz(app)})", target
    return UNKNOWN, target


def host_change(host: pb.HostSample | None, path: str, view: SettingView) -> tuple[str, str] | None:
    """(current, target) of an OS setting from the latest host reading; None when it is at the target."""
    target = view.target_text()
    now = ""
    if host is not None:
        if path == "cpu_governor":  # at the target only when every CPU runs it
            now = governors_text(host)
        elif path == "sysctls.kernel.numa_balancing" and host.HasField("numa_balancing"):
            now = "1" if host.numa_balancing else "0"
        elif path == "transparent_hugepages.enabled" and host.HasField("transparent_hugepage"):
            now = host.transparent_hugepage
        elif path == "hugepages" and host.HasField("hugepages_total"):
            now = str(host.hugepages_total)
    return None if now == target else (now or UNKNOWN, target)


def bios_change(bmc: bmc_pb2.BmcSample | None, name: str, view: SettingView) -> tuple[str, str, str]:
    """(attribute, current, target): under the vendor's own name when the BMC uses it."""
    target = view.target_text()
    attributes = {} if bmc is None else dict(bmc.bios_attributes)
    if name in attributes:
        return name, attributes[name], target
    for alternative in (view.vendors or {}).values():
        if alternative["name"] in attributes:
            return alternative["name"], attributes[alternative["name"]], str(alternative["target"])
    return name, UNKNOWN, target
