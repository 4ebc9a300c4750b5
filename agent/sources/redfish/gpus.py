"""GPU baseboards (HGX): chassis such as `HGX_GPU_SXM_1` with their own Sensors, mapped to the
node's GPUs so the BMC's view of each GPU's temperature and power sits next to NVML's.

Mapping, best first: the chassis SerialNumber equals the GPU's serial; its UUID equals the GPU's
UUID (NVML writes "GPU-" before it); else by order: the k-th board by SXM slot is taken for GPU k.
Slot order need not be NVML's PCI order, so an index match says "index" and is a guess; a board
left over when the node has fewer GPUs says "none" and its index only numbers it after the GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.sources.bmc import BmcGpu
from agent.sources.gpu import GpuInfo
from agent.sources.redfish.thermal import is_temperature_sensor
from agent.sources.redfish.values import health, member_id, number, snake, text

# HGX_GPU_SXM_1, GPU_SXM_1, HGX_GPU_1; not HGX_ERoT_GPU_SXM_1 (its root of trust) nor NVSwitches.
_BOARD = re.compile(r"^(?:HGX_)?GPU_(?:SXM_)?(\d+)$", re.IGNORECASE)
_MEMORY = re.compile(r"DRAM|HBM|MEM", re.IGNORECASE)


@dataclass(slots=True)
class GpuBoard:
    slot: int
    chassis: str
    serial: str
    uuid: str
    temperature_celsius: float | None
    memory_temperature_celsius: float | None
    power_watts: float | None
    health: str


def board_slot(chassis: dict[str, Any]) -> int | None:
    """The SXM slot number when `chassis` is a GPU board, else None."""
    match = _BOARD.match(member_id(chassis))
    return int(match.group(1)) if match else None


def gpu_board(
    chassis: dict[str, Any], sensors: list[dict[str, Any]], environment: dict[str, Any]
) -> GpuBoard:
    """A GPU board's readings: GPU and memory temperature and power from its sensors, with the
    board's EnvironmentMetrics as the fallback."""
    gpu_temp = mem_temp = power = None
    for sensor in sensors:
        reading = number(sensor, "Reading")
        if reading is None:
            continue
        name = text(sensor, "Name") or text(sensor, "Id")
        if is_temperature_sensor(sensor):
            is_memory = snake(text(sensor, "PhysicalContext")) == "memory" or bool(_MEMORY.search(name))
            if is_memory and mem_temp is None:
                mem_temp = reading
            elif not is_memory and gpu_temp is None:
                gpu_temp = reading
        elif text(sensor, "ReadingType") == "Power" and power is None:
            power = reading
    slot = board_slot(chassis)
    return GpuBoard(
        slot=0 if slot is None else slot,
        chassis=member_id(chassis),
        serial=text(chassis, "SerialNumber").strip(),
        uuid=text(chassis, "UUID").strip(),
        temperature_celsius=gpu_temp
        if gpu_temp is not None
        else number(environment, "TemperatureCelsius", "Reading"),
        memory_temperature_celsius=mem_temp,
        power_watts=power if power is not None else number(environment, "PowerWatts", "Reading"),
        health=health(chassis, rollup=True),
    )


def _bare_uuid(text_uuid: str) -> str:
    return text_uuid.lower().removeprefix("gpu-")


def map_boards(boards: Sequence[GpuBoard], gpus: Sequence[GpuInfo]) -> list[BmcGpu]:
    """Each board as a BmcGpu with the node's GPU index; boards no GPU matches keep their order."""
    by_serial = {g.serial.strip(): g.index for g in gpus if g.serial.strip()}
    by_uuid = {_bare_uuid(g.uuid): g.index for g in gpus if g.uuid}
    taken: set[int] = set()
    matched: dict[int, tuple[int, str]] = {}  # position in boards -> (gpu index, how)
    for pos, board in enumerate(boards):
        index, how = by_serial.get(board.serial) if board.serial else None, "serial"
        if index is None and board.uuid:
            index, how = by_uuid.get(_bare_uuid(board.uuid)), "uuid"
        if index is not None and index not in taken:
            matched[pos] = (index, how)
            taken.add(index)
    # The rest by slot order onto the GPU indices still free (all of them when nothing matched).
    free = [g.index for g in sorted(gpus, key=lambda g: g.index) if g.index not in taken]
    if not gpus:
        free = [i for i in range(len(boards)) if i not in taken]
    rest = sorted((pos for pos in range(len(boards)) if pos not in matched), key=lambda p: boards[p].slot)
    for pos, index in zip(rest, free, strict=False):
        matched[pos] = (index, "index")
    # More boards than GPUs (one fell off the bus, say): keep them, numbered after every known
    # index, since the BMC's view of a GPU the host lost is exactly what an operator wants to see.
    spare = max([g.index for g in gpus] + [i for i, _ in matched.values()], default=-1) + 1
    for pos in rest:
        if pos not in matched:
            matched[pos] = (spare, "none")
            spare += 1
    out = []
    for pos, board in enumerate(boards):
        index, how = matched[pos]
        out.append(
            BmcGpu(
                index=index,
                chassis=board.chassis,
                serial=board.serial,
                uuid=board.uuid,
                temperature_celsius=board.temperature_celsius,
                memory_temperature_celsius=board.memory_temperature_celsius,
                power_watts=board.power_watts,
                health=board.health,
                matched_by=how,
            )
        )
    return sorted(out, key=lambda g: g.index)
