"""Dry-run ApplyProfile planned against real NVML, with every write path blocked twice over.

Guarantees that nothing is written:
  * the Tuner is built with enabled=False and state_dir=None: a non-dry apply is refused before any
    actuator is built, and no journal directory exists;
  * every apply is called with dry_run=True: apply_settings returns after plan() + validate();
  * the pynvml module handed to NvmlControl is a proxy that allows only nvmlInit*, nvmlShutdown,
    nvmlErrorString and nvml{Device,System}Get* functions; any other nvml* function raises
    BlockedWrite (a BaseException, so no `except NVMLError` / `except Exception` swallows it);
  * the GpuControl handed to the actuators is a proxy whose set_*/lock_*/reset_* raise BlockedWrite;
  * the host tree is a Tree whose write()/_write() raise BlockedWrite.
"""

from __future__ import annotations

import json
import re
import sys
import traceback
from typing import Any

import pynvml

from agent.config import load
from agent.sources.nvml.control import NvmlControl
from agent.tuning.base import Tree
from agent.tuning.gpu_settings import gpu_actuators
from agent.tuning.os_settings import os_actuators
from agent.tuning.tuner import Tuner


class BlockedWrite(BaseException):
    pass


_ALLOWED_NVML = re.compile(r"^nvml(Init\w*|Shutdown|ErrorString|(Device|System)Get\w*)$")
blocked_attempts: list[str] = []


class ReadOnlyNvml:
    def __init__(self, module: Any) -> None:
        self._m = module

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._m, name)
        if name.startswith("nvml") and callable(value) and not _ALLOWED_NVML.match(name):

            def blocked(*_a: Any, **_k: Any) -> Any:
                blocked_attempts.append(name)
                raise BlockedWrite(f"blocked NVML call {name}")

            return blocked
        return value


class ReadOnlyControl:
    def __init__(self, control: Any) -> None:
        self._c = control

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("set_", "lock_", "reset_")):

            def blocked(*_a: Any, **_k: Any) -> Any:
                blocked_attempts.append(f"control.{name}")
                raise BlockedWrite(f"blocked control call {name}")

            return blocked
        return getattr(self._c, name)


class ReadOnlyTree(Tree):
    def write(self, rel: str, value: str) -> None:
        blocked_attempts.append(f"tree.write {rel}")
        raise BlockedWrite(f"blocked host write {rel}")

    def _write(self, rel: str, value: str) -> None:
        blocked_attempts.append(f"tree._write {rel}")
        raise BlockedWrite(f"blocked host write {rel}")


def profile_targets() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    try:
        from controller.profiles import load_catalogue
        from controller.remediate.changes import applicable, targets_of

        for name, entry in load_catalogue().items():
            targets = targets_of(applicable(entry.profile))
            if set(targets) & {"gpu", "os"}:
                out[name] = {k: v for k, v in targets.items() if k in ("gpu", "os")}
    except Exception:  # noqa: BLE001
        print("could not load the controller's catalogue; using built-in copies:", file=sys.stderr)
        traceback.print_exc()
        out["gpu-defaults"] = {
            "gpu": {
                "persistence_mode": "on",
                "power_limit": "default",
                "locked_gpu_clocks": "reset",
                "locked_memory_clocks": "reset",
            }
        }
    # Every GPU actuator's read + validate path, with targets resolved on this GPU.
    out["synthetic-every-gpu-setting"] = {
        "gpu": {
            "persistence_mode": "on",
            "power_limit": "default",
            "locked_gpu_clocks": ["max", "max"],
            "locked_memory_clocks": ["max", "max"],
            "compute_mode": "default",
            "ecc": "on",
        }
    }
    return out


def main() -> int:
    config = load(None, {})
    control = NvmlControl(
        nvml=ReadOnlyNvml(pynvml),  # type: ignore[arg-type]  # a proxy of the module
        base_clocks=config.tuning.base_clocks_mhz,
    )
    guarded = ReadOnlyControl(control)
    tree = ReadOnlyTree(config.host_root)
    print(f"host_root={config.host_root} base_clocks_mhz={config.tuning.base_clocks_mhz}")
    print(f"GPUs: {control.gpus()}")

    def actuators(gpus: Any) -> list[Any]:
        return [*os_actuators(), *gpu_actuators(guarded, gpus)]

    tuner = Tuner(enabled=False, tree=tree, actuators=actuators, state_dir=None)
    # The real GPU values the actuators read (all reads).
    for act in gpu_actuators(guarded, None):
        try:
            print(f"read {act.name}: {act.read(tree)}")
        except Exception as exc:  # noqa: BLE001
            print(f"read {act.name}: error {type(exc).__name__}: {exc}")
    for act in os_actuators():
        try:
            print(f"read {act.name}: {act.read(tree)}")
        except Exception as exc:  # noqa: BLE001
            print(f"read {act.name}: error {type(exc).__name__}: {exc}")
    # A non-dry apply must be refused without touching anything.
    refused = tuner.apply("gpu-defaults", {"gpu": {"persistence_mode": "on"}}, dry_run=False)
    print(f"non-dry apply on a disabled tuner: state={refused.state} problems={refused.problems}")
    results: dict[str, Any] = {}
    for name, targets in profile_targets().items():
        result = tuner.apply(name, targets, dry_run=True)
        results[name] = {
            "targets": targets,
            "state": result.state,
            "ok": result.ok,
            "changes": [
                {
                    "setting": c.setting,
                    "current": c.current,
                    "target": c.target,
                    "pending_reboot": c.pending_reboot,
                }
                for c in result.changes
            ],
            "problems": result.problems,
        }
        print(f"\n== dry run {name}: state={result.state} ok={result.ok}")
        for c in result.changes:
            print(
                f"   {c.setting}: {c.current} -> {c.target}{' (pending reboot)' if c.pending_reboot else ''}"
            )
        for p in result.problems:
            print(f"   problem: {p}")
    control.close()
    print(f"\nblocked write attempts: {blocked_attempts or 'none'}")
    print("JSON " + json.dumps(results, sort_keys=True, default=str))
    return 1 if blocked_attempts else 0


if __name__ == "__main__":
    sys.exit(main())
