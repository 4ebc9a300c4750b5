"""The agent's tuning service from its config: the actuators of every level, over NVML, the host
tree under `host_root` and the BMC's Redfish service, or over the simulator's GPUs, host and BMC.

Imports stay inside: an agent that never tunes never loads them. NVML's control is opened on the
first apply (and kept), so a node whose NVML is broken still starts and says why at the apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from agent.config import AgentConfig
from agent.tuning.base import Actuator, Tree
from agent.tuning.os_settings import os_actuators
from agent.tuning.tuner import Tuner

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent.sources.bmc import BmcSource
    from agent.sources.gpu import GpuSource
    from agent.sources.host import HostReader
    from agent.tuning.bios import BiosControl
    from agent.tuning.gpu_control import GpuControl


def build_tuner(config: AgentConfig, gpu: GpuSource, host: HostReader | None, bmc: BmcSource | None) -> Tuner:
    """A Tuner whether or not tuning is enabled: a disabled one refuses applies (dry runs still
    plan) but still finishes, at start, an apply a crash left."""
    from agent.tuning.bios import BiosActuator, bios_reboot_state
    from agent.tuning.gpu_settings import gpu_actuators

    tree, gpu_control, bios = _parts(config, gpu, host, bmc)

    def actuators(gpus: Sequence[int] | None) -> list[Actuator]:
        found: list[Actuator] = [*os_actuators(), *gpu_actuators(gpu_control(), gpus)]
        if bios is not None:
            found.append(BiosActuator(bios))
        return found

    return Tuner(
        enabled=config.tuning.enabled,
        tree=tree,
        actuators=actuators,
        state_dir=config.tuning.journal_dir(config.stream.spool_dir),
        after_reboot=None if bios is None else partial(bios_reboot_state, bios),
    )


class _Lazy:
    """NVML's control, opened on first use and kept."""

    def __init__(self, base_clocks_mhz: dict[str, int]) -> None:
        self.base_clocks_mhz = base_clocks_mhz
        self.control: GpuControl | None = None

    def __call__(self) -> GpuControl:
        if self.control is None:
            from agent.sources.nvml.control import NvmlControl

            self.control = NvmlControl(base_clocks=self.base_clocks_mhz)
        return self.control


def _parts(
    config: AgentConfig, gpu: GpuSource, host: HostReader | None, bmc: BmcSource | None
) -> tuple[Tree, Callable[[], GpuControl], BiosControl | None]:
    if config.source == "sim":
        from agent.sources.sim import SimHost, SimNode
        from agent.sources.sim.bmc import SimBmc
        from agent.sources.sim.control import SimGpuControl, SimHostTree

        if not isinstance(gpu, SimNode) or not isinstance(host, SimHost):
            raise TypeError("the simulator's tuning needs the simulated node and host")
        sim_control = SimGpuControl(gpu)
        return SimHostTree(host), lambda: sim_control, bmc.bios if isinstance(bmc, SimBmc) else None
    bios: BiosControl | None = None
    if config.bmc.url:
        from agent.compose.bmc import endpoint
        from agent.sources.redfish.bios_control import RedfishBiosControl

        bios = RedfishBiosControl(endpoint(config.bmc, config.bmc.url))
    return Tree(config.host_root), _Lazy(config.tuning.base_clocks_mhz), bios
