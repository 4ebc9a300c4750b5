"""A simulated GPU node: the GpuSource contract plus modelled probe results.

Healthy variation is built in (GPU-to-GPU traits, diurnal inlet drift, measurement noise, brief
power-cap blips under load), so detection is tested against realistic scatter, not clean data.
Everything is seeded: the same node name and seed give the same fleet.
"""

from __future__ import annotations

import math
import random
import time
import uuid
from collections.abc import Callable, Sequence

from agent.probes.base import ProbeOutcome
from agent.sources.gpu import GpuInfo, GpuReading, Inventory, NvLinkReading
from agent.sources.sim.faults import FAULTS, FaultSpec
from agent.sources.sim.gpu import GpuTraits, SimGpu, bounded_gauss
from agent.sources.sim.profile import (
    CUDA_DRIVER_VERSION,
    DRIVER_VERSION,
    H100_SXM,
    HGX_BUS_IDS,
    NVSWITCH_BUS_IDS,
    NVSWITCH_LINKS,
    PCIE_LANE_GBPS,
    GpuProfile,
)

_UUID_NAMESPACE = uuid.UUID("6f1c3c2e-6b1e-4b8e-9a59-1f1d0c6b7a10")
GIB = 1024**3

# Probe variants the simulator models, as the real probes name them.
PROBE_VARIANTS: dict[str, tuple[str, ...]] = {
    "gemm": ("bf16", "fp16", "tf32", "fp8"),
    "membw": ("d2d",),
    "pcie": ("h2d", "d2h"),
    "nccl": ("all_reduce",),
}


class SimNode:
    """One simulated node of `gpus` GPUs running a steady job at `load` (0 = idle)."""

    source = "sim"

    def __init__(
        self,
        node: str,
        *,
        gpus: int = 8,
        faults: Sequence[FaultSpec] = (),
        seed: int = 0,
        load: float = 0.95,
        profile: GpuProfile = H100_SXM,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if gpus < 1:
            raise ValueError("a simulated node needs at least one GPU")
        if not 0.0 <= load <= 1.0:
            raise ValueError(f"load must be within 0..1, not {load}")
        self.node = node
        self.profile = profile
        self.load = load
        self.clock = clock
        rng = random.Random(f"{seed}:{node}")
        self._noise = random.Random(f"{seed}:{node}:noise")
        self._inlet_base_c = 22.0 + rng.uniform(0.0, 4.0)
        self._nccl_factor = 1.0 + bounded_gauss(rng, 0.006, 0.015)
        self.gpus = [SimGpu(i, profile, GpuTraits.draw(rng)) for i in range(gpus)]
        self._crc = [[rng.choice((0, 0, 0, 1, 2)) for _ in range(profile.nvlink_count)] for _ in self.gpus]
        self.injected: list[tuple[str, int]] = []
        for spec in faults:
            index = spec.gpu if spec.gpu is not None else rng.randrange(gpus)
            if not 0 <= index < gpus:
                raise ValueError(f"fault {spec.fault}: gpu {index} out of range (node has {gpus})")
            FAULTS[spec.fault](self.gpus[index], rng)
            self.injected.append((spec.fault, index))
        self._energy_j = [0.0] * gpus
        self._ecc_corrected = [rng.choice((0, 0, 0, 0, 1, 3)) for _ in self.gpus]
        self._last_read: float | None = None

    # GpuSource

    def inventory(self) -> Inventory:
        p = self.profile
        infos = [
            GpuInfo(
                index=g.index,
                uuid=self._uuid(g.index),
                name=p.name,
                serial=f"1652{int(self._uuid(g.index)[4:12], 16) % 10**9:09d}",
                pci_bus_id=self._bus_id(g.index),
                vbios_version=p.vbios_version,
                driver_version=DRIVER_VERSION,
                board_part_number=p.board_part_number,
                memory_total_bytes=p.memory_total_bytes,
                nvlink_count=p.nvlink_count,
            )
            for g in self.gpus
        ]
        return Inventory(
            source=self.source,
            gpus=infos,
            driver_version=DRIVER_VERSION,
            cuda_driver_version=CUDA_DRIVER_VERSION,
            expected_gpu_count=len(self.gpus),
        )

    def read(self) -> list[GpuReading]:
        now = self.clock()
        elapsed = 0.0 if self._last_read is None else max(0.0, now - self._last_read)
        self._last_read = now
        readings = []
        for gpu in self.gpus:
            load = min(1.0, max(0.0, self.load + self._noise.uniform(-0.03, 0.03))) if self.load > 0 else 0.0
            spike = self._noise.uniform(0.08, 0.15) if load > 0 and self._noise.random() < 0.02 else 0.0
            reading = self.reading(gpu.index, load, now, power_spike=spike)
            self._energy_j[gpu.index] += (reading.power_watts or 0.0) * elapsed
            reading.energy_joules_total = self._energy_j[gpu.index]
            if self._noise.random() < 0.002:
                self._ecc_corrected[gpu.index] += 1
            readings.append(reading)
        return readings

    def last_errors(self) -> list[str]:
        return []

    def close(self) -> None:
        """Nothing to release."""

    # The model

    def inlet_celsius(self, now: float) -> float:
        """Cold-aisle inlet: a per-node base plus a +-3 C daily swing."""
        return self._inlet_base_c + 3.0 * math.sin(2.0 * math.pi * (now % 86400.0) / 86400.0)

    def reading(self, index: int, load: float, now: float, power_spike: float = 0.0) -> GpuReading:
        """What NVML would report for GPU `index` running at `load`."""
        gpu, p, noise = self.gpus[index], self.profile, self._noise
        c = gpu.condition
        op = gpu.operating_point(load, self.inlet_celsius(now), power_spike)
        temp = op.temperature_celsius + noise.gauss(0.0, 0.3)
        gen, width = gpu.pcie_link()
        return GpuReading(
            index=index,
            uuid=self._uuid(index),
            gpu_utilization_ratio=round(load, 2),
            memory_utilization_ratio=round(load * 0.55, 2),
            memory_used_bytes=72 * GIB if load > 0 else GIB // 2,
            memory_total_bytes=p.memory_total_bytes,
            sm_clock_hz=op.sm_clock_hz,
            graphics_clock_hz=op.sm_clock_hz,
            memory_clock_hz=p.memory_clock_hz,
            max_sm_clock_hz=p.max_sm_clock_hz,
            max_memory_clock_hz=p.memory_clock_hz,
            applications_sm_clock_hz=c.locked_sm_clock_hz or p.max_sm_clock_hz,
            power_watts=round(op.power_watts * (1.0 + noise.gauss(0.0, 0.005)), 2),
            enforced_power_limit_watts=gpu.power_limit_watts,
            default_power_limit_watts=p.default_power_limit_watts,
            energy_joules_total=self._energy_j[index],
            temperature_celsius=round(temp),
            memory_temperature_celsius=round(
                temp + p.memory_temperature_offset_celsius + 4.0 * (c.cooling - 1.0) + noise.gauss(0.0, 0.3)
            ),
            slowdown_temperature_celsius=p.slowdown_temperature_celsius,
            clock_event_reasons=op.reasons,
            # Links train down to gen 1 while idle to save power; that is not a fault.
            pcie_link_gen=gen if load > 0 else 1,
            pcie_link_gen_max=p.pcie_gen_max,
            pcie_link_width=width,
            pcie_link_width_max=p.pcie_width_max,
            ecc_corrected_volatile_total=self._ecc_corrected[index],
            ecc_uncorrected_volatile_total=c.extra_uncorrectable,
            row_remap_correctable_total=gpu.traits.rows_remapped,
            row_remap_uncorrectable_total=c.extra_uncorrectable,
            row_remap_pending=c.row_remap_pending,
            row_remap_failure=False,
            performance_state=0 if load > 0 else 8,
            nvlinks=[self._nvlink(gpu, link) for link in range(p.nvlink_count)],
        )

    def _nvlink(self, gpu: SimGpu, link: int) -> NvLinkReading:
        down = link in gpu.condition.nvlinks_down
        switch, start = 0, 0
        while link >= start + NVSWITCH_LINKS[switch]:
            start += NVSWITCH_LINKS[switch]
            switch += 1
        return NvLinkReading(
            link=link,
            active=not down,
            version=self.profile.nvlink_version,
            crc_errors_total=self._crc[gpu.index][link] + (41 if down else 0),
            replay_errors_total=7 if down else 0,
            recovery_errors_total=3 if down else 0,
            remote_pci_bus_id=f"00000000:{NVSWITCH_BUS_IDS[switch]}:00.0",
        )

    def _uuid(self, index: int) -> str:
        return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{self.node}/{index}')}"

    @staticmethod
    def _bus_id(index: int) -> str:
        bus = HGX_BUS_IDS[index] if index < len(HGX_BUS_IDS) else f"{0xE0 + index:02X}"
        return f"00000000:{bus}:00.0"

    # Modelled probes

    def probe(self, probe: str, variant: str, gpu: int | None) -> ProbeOutcome:
        """A modelled result of `probe`/`variant` on GPU `gpu` (None for the node-level nccl)."""
        now = self.clock()
        run_noise = 1.0 + bounded_gauss(self._noise, 0.004, 0.01)
        p = self.profile
        if probe == "nccl":
            return self._nccl(variant, now, run_noise)
        if gpu is None or not 0 <= gpu < len(self.gpus):
            raise ValueError(f"probe {probe} needs a GPU index within 0..{len(self.gpus) - 1}")
        g = self.gpus[gpu]
        during = self.reading(gpu, 1.0, now)
        during.nvlinks = []  # links are not what a compute probe's context needs; keeps results small
        params: dict[str, str]
        if probe == "gemm":
            value = g.gemm_tflops(variant, self.inlet_celsius(now)) * run_noise
            unit, peak, duration = "TFLOP/s", p.gemm_peak_tflops[variant], 1.2
            params = {"m": "8192", "n": "8192", "k": "8192", "dtype": variant}
        elif probe == "membw":
            value = g.membw_gbps() * run_noise
            unit, peak, duration = "GB/s", p.membw_peak_gbps, 0.6
            params = {"size_bytes": str(4 * GIB), "counted": "read+write"}
        elif probe == "pcie":
            gen, width = g.pcie_link()
            value = g.pcie_gbps() * run_noise
            unit, duration = "GB/s", 0.8
            peak = PCIE_LANE_GBPS[p.pcie_gen_max] * p.pcie_width_max
            params = {
                "size_bytes": str(GIB),
                "pinned": "true",
                "link_gen": str(gen),
                "link_width": str(width),
                "link_gbps": f"{PCIE_LANE_GBPS[gen] * width:.1f}",
            }
        else:
            raise ValueError(f"the simulator does not model probe {probe!r}")
        return ProbeOutcome(
            probe=probe,
            variant=variant,
            gpu=gpu,
            value=round(value, 2),
            unit=unit,
            duration_seconds=duration,
            time=now,
            params=params,
            peak_ratio=round(value / peak, 4),
            during=during,
            simulated=True,
        )

    def _nccl(self, variant: str, now: float, run_noise: float) -> ProbeOutcome:
        p, n = self.profile, len(self.gpus)
        inlet = self.inlet_celsius(now)
        link_ratio = min(g.active_links() for g in self.gpus) / p.nvlink_count
        clock_ratio = min(g.operating_point(1.0, inlet).sm_clock_hz for g in self.gpus) / p.max_sm_clock_hz
        # NCCL bandwidth is link-bound; clocks matter only for the reduction kernels.
        busbw = p.nccl_busbw_gbps * self._nccl_factor * link_ratio * (0.97 + 0.03 * clock_ratio) * run_noise
        algbw = busbw * n / (2 * (n - 1)) if n > 1 else busbw
        return ProbeOutcome(
            probe="nccl",
            variant=variant,
            gpu=None,
            value=round(busbw, 2),
            unit="GB/s",
            duration_seconds=3.0,
            time=now,
            params={
                "ranks": str(n),
                "size_bytes": str(GIB),
                "algbw_gbps": f"{algbw:.2f}",
                "measure": "busbw",
            },
            simulated=True,
        )
