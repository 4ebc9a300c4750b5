"""A simulated GPU node: the GpuSource contract plus modelled probe results.

Every GpuReading field is produced with NVML's names, units and types, except those the simulated
board cannot report (listed in its GpuInfo.unsupported_fields, as NVML's NOT_SUPPORTED would list
them). Instantaneous fields come from the GPU's physical model at this read's load; cumulative ones
(energy, ECC, NVLink bytes and errors, XIDs) from counters that each read advances.

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
from agent.probes.kernels import infos
from agent.sources.gpu import ComputeProcess, GpuInfo, GpuReading, Inventory, NvLinkReading, XidEvent
from agent.sources.sim.counters import GpuCounters
from agent.sources.sim.faults import FAULTS, FaultSpec
from agent.sources.sim.gpu import COMPUTE_MODES, GpuTraits, SimGpu, bounded_gauss
from agent.sources.sim.profile import (
    CUDA_DRIVER_VERSION,
    DRIVER_VERSION,
    FABRIC_CLIQUE_ID,
    FABRIC_CLUSTER_UUID,
    FABRIC_STATE_COMPLETED,
    H100_SXM,
    HGX_BUS_IDS,
    NVSWITCH_BUS_IDS,
    NVSWITCH_LINKS,
    PCIE_LANE_GBPS,
    TRAINING_JOB,
    GpuProfile,
    Workload,
)

_UUID_NAMESPACE = uuid.UUID("6f1c3c2e-6b1e-4b8e-9a59-1f1d0c6b7a10")
GIB = 1024**3
MIB = 1024**2
IDLE_MEMORY_USED_BYTES = 4 * MIB  # the driver's own allocations with persistence mode on

# The probes the simulator models (SimNode.probe), with the variants their kernels declare for a GPU
# (agent/probes/*.py `gpu_variants`; the registry is read without importing torch).
MODELLED_PROBES = ("gemm", "membw", "pcie", "nccl")
PROBE_VARIANTS: dict[str, tuple[str, ...]] = {
    i.name: i.variants for i in infos() if i.name in MODELLED_PROBES and i.variants
}


def _ratio(value: float) -> float:
    return round(min(1.0, max(0.0, value)), 4)


def _lost_message(index: int) -> str:
    return f"gpu {index} lost (fallen off the bus)"


def _failed(probe: str, variant: str, gpu: int | None, now: float, error: str) -> ProbeOutcome:
    return ProbeOutcome(
        probe=probe,
        variant=variant,
        gpu=gpu,
        value=0.0,
        unit="",
        duration_seconds=0.0,
        time=now,
        error=error,
        simulated=True,
    )


class SimNode:
    """One simulated node of `gpus` GPUs running a steady job at `load` (0 = idle).

    With `idle_every_seconds`, the job stops for `idle_seconds` once per period, as a cluster's
    nodes sit idle between jobs (load 0: no process, idle clocks and power). Each node has its own
    phase (seeded), so a fleet's gaps do not line up.
    """

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
        job: Workload = TRAINING_JOB,
        idle_every_seconds: float | None = None,
        idle_seconds: float = 0.0,
    ) -> None:
        if gpus < 1:
            raise ValueError("a simulated node needs at least one GPU")
        if not 0.0 <= load <= 1.0:
            raise ValueError(f"load must be within 0..1, not {load}")
        if idle_every_seconds is not None and not 0.0 < idle_seconds < idle_every_seconds:
            raise ValueError("idle gaps need 0 < idle_seconds < idle_every_seconds")
        self.node = node
        self.profile = profile
        self.job_load = load
        self.idle_every_seconds = idle_every_seconds
        self.idle_seconds = idle_seconds
        # Its own stream, so that the gaps move none of the draws below.
        self._idle_phase = random.Random(f"{seed}:{node}:jobs").uniform(0.0, idle_every_seconds or 0.0)
        self.job = job
        self.clock = clock
        rng = random.Random(f"{seed}:{node}")
        self._noise = random.Random(f"{seed}:{node}:noise")
        # Separate streams for the counters and the activity jitter, so that neither moves the
        # draws above (traits, fault placement, noise) that detection is tuned against.
        start = random.Random(f"{seed}:{node}:counters")
        self._jitter = random.Random(f"{seed}:{node}:jitter")
        self._inlet_base_c = 22.0 + rng.uniform(0.0, 4.0)
        self._nccl_factor = 1.0 + bounded_gauss(rng, 0.006, 0.015)
        self.gpus = [SimGpu(i, profile, GpuTraits.draw(rng)) for i in range(gpus)]
        crc = [[rng.choice((0, 0, 0, 1, 2)) for _ in range(profile.nvlink_count)] for _ in self.gpus]
        # Every level's faults: the GPU ones act here, the host's and the BMC's where SimHost and
        # SimBmc are built beside this node (they read them from here), never on this node's state
        # but for the driver the host loads (load_driver).
        self.driver_version = DRIVER_VERSION
        self.faults = list(faults)
        self.injected: list[tuple[str, int]] = []
        for spec in self.faults:
            if spec.level != "gpu":
                continue
            index = spec.gpu if spec.gpu is not None else rng.randrange(gpus)
            if not 0 <= index < gpus:
                raise ValueError(f"fault {spec.fault}: gpu {index} out of range (node has {gpus})")
            FAULTS[spec.fault].apply(self.gpus[index], None, rng)
            self.injected.append((spec.fault, index))
        uptime = start.uniform(2 * 3600.0, 40 * 86400.0)  # since the driver loaded
        self._counters = [GpuCounters.start(g, start, crc[g.index], uptime, job) for g in self.gpus]
        # One process per GPU (torchrun's workers: consecutive pids), each with its own allocation.
        first_pid = start.randrange(2_000, 400_000)
        self._processes = [
            ComputeProcess(pid=first_pid + g.index, used_memory_bytes=start.randrange(*job.memory_bytes, MIB))
            for g in self.gpus
        ]
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
                vbios_version=g.condition.vbios_version or p.vbios_version,
                driver_version=self.driver_version,
                board_part_number=p.board_part_number,
                unsupported_fields=list(p.unsupported_fields),
                memory_total_bytes=p.memory_total_bytes,
                nvlink_count=p.nvlink_count,
                mig_mode_enabled=False,
                default_power_limit_watts=p.default_power_limit_watts,
            )
            for g in self.gpus
        ]
        return Inventory(
            source=self.source,
            gpus=infos,
            driver_version=self.driver_version,
            cuda_driver_version=CUDA_DRIVER_VERSION,
            expected_gpu_count=len(self.gpus),
        )

    def load_driver(self, version: str, gemm_factor: float) -> None:
        """The host loads another driver (a host fault): NVML reports it, and its GEMM kernels run
        `gemm_factor` times as fast as the fleet's driver's on every GPU."""
        self.driver_version = version
        for gpu in self.gpus:
            gpu.condition.gemm_factor = gemm_factor

    @property
    def load(self) -> float:
        """The job's load now: `job_load`, or 0 within an idle gap between jobs."""
        return self.load_at(self.clock())

    def load_at(self, now: float) -> float:
        every = self.idle_every_seconds
        if every is not None and (now + self._idle_phase) % every < self.idle_seconds:
            return 0.0
        return self.job_load

    def read(self) -> list[GpuReading]:
        now = self.clock()
        elapsed = 0.0 if self._last_read is None else max(0.0, now - self._last_read)
        self._last_read = now
        job_load = self.load_at(now)
        readings = []
        for gpu in self.gpus:
            load = min(1.0, max(0.0, job_load + self._noise.uniform(-0.03, 0.03))) if job_load > 0 else 0.0
            spike = self._noise.uniform(0.08, 0.15) if load > 0 and self._noise.random() < 0.02 else 0.0
            reading = self._instant(gpu, load, now, spike)
            counters = self._counters[gpu.index]
            rates = [gpu.nvlink_bytes_per_second(link, load, self.job) for link in range(len(counters.links))]
            counters.advance(gpu, elapsed, reading.power_watts or 0.0, rates)
            if self._noise.random() < 0.002:
                counters.ecc_corrected_volatile += 1
            events = counters.take_xids(now)
            self._fill_counters(reading, gpu)
            reading.xid_events = events
            if gpu.condition.lost:  # read all the same, so that no other GPU's draws move
                reading = self._lost_reading(gpu, events)
                if not reading.xid_counts:
                    continue
            readings.append(reading)
        return readings

    def last_errors(self) -> list[str]:
        """What NVML says of a GPU that fell off the bus, each read, as the NVML source does."""
        return [_lost_message(g.index) for g in self.gpus if g.condition.lost]

    def close(self) -> None:
        """Nothing to release."""

    def reboot(self) -> None:
        """The node reboots: every GPU loses its NVML settings and takes its pending ECC mode
        (GpuCondition.reboot); counters, faults and the job carry on as they were."""
        for gpu in self.gpus:
            gpu.condition.reboot()

    # The model

    def inlet_celsius(self, now: float) -> float:
        """Cold-aisle inlet: a per-node base plus a +-3 C daily swing."""
        return self._inlet_base_c + 3.0 * math.sin(2.0 * math.pi * (now % 86400.0) / 86400.0)

    def reading(self, index: int, load: float, now: float, power_spike: float = 0.0) -> GpuReading:
        """What NVML would report for GPU `index` running at `load`, counters as they stand."""
        gpu = self.gpus[index]
        reading = self._instant(gpu, load, now, power_spike)
        self._fill_counters(reading, gpu)
        return self._lost_reading(gpu, []) if gpu.condition.lost else reading

    def _lost_reading(self, gpu: SimGpu, events: list[XidEvent]) -> GpuReading:
        """A GPU off the bus answers nothing: only its XIDs reach the stream (as from the NVML source)."""
        counts = self._counters[gpu.index].xid_counts()
        return GpuReading(index=gpu.index, uuid=self._uuid(gpu.index), xid_events=events, xid_counts=counts)

    def _instant(self, gpu: SimGpu, load: float, now: float, power_spike: float) -> GpuReading:
        """The fields that describe this moment: clocks, power, temperatures, activity, links."""
        p, c, noise, jitter = self.profile, gpu.condition, self._noise, self._jitter
        op = gpu.operating_point(load, self.inlet_celsius(now), power_spike)
        temp = op.temperature_celsius + noise.gauss(0.0, 0.3)
        gen, width = gpu.pcie_link()
        activity = gpu.activity(load, op, self.job)
        tx, rx = gpu.pcie_bytes_per_second(load, self.job)
        # GPM and NVML utilisation sample a short window: a little scatter around the job's mean.
        sm, tensor, dram, graphics = (jitter.gauss(1.0, 0.01) for _ in range(4))
        job = self._processes[gpu.index]
        processes = [ComputeProcess(job.pid, job.used_memory_bytes)] if load > 0 else []
        used = IDLE_MEMORY_USED_BYTES + sum(process.used_memory_bytes or 0 for process in processes)
        power_limit = gpu.power_limit_watts
        memory_lock = c.locked_memory_clocks_mhz
        memory_clock = (
            p.memory_clock_hz if memory_lock is None else min(p.memory_clock_hz, memory_lock[1] * 1e6)
        )
        return GpuReading(
            index=gpu.index,
            uuid=self._uuid(gpu.index),
            gpu_utilization_ratio=round(load, 2),
            # NVML's memory utilisation is the share of time HBM was read or written.
            memory_utilization_ratio=round(min(1.0, activity.dram), 2),
            memory_used_bytes=used,
            memory_total_bytes=p.memory_total_bytes,
            memory_reserved_bytes=p.memory_reserved_bytes,
            memory_free_bytes=p.memory_total_bytes - p.memory_reserved_bytes - used,
            sm_clock_hz=op.sm_clock_hz,
            graphics_clock_hz=op.sm_clock_hz,  # one clock domain on Hopper
            memory_clock_hz=memory_clock,
            max_sm_clock_hz=p.max_sm_clock_hz,
            max_graphics_clock_hz=p.max_sm_clock_hz,
            max_memory_clock_hz=p.memory_clock_hz,
            applications_sm_clock_hz=c.locked_sm_clock_hz or p.max_sm_clock_hz,
            applications_memory_clock_hz=memory_clock,
            power_watts=round(op.power_watts * (1.0 + noise.gauss(0.0, 0.005)), 2),
            power_management_limit_watts=power_limit,
            enforced_power_limit_watts=power_limit,
            default_power_limit_watts=p.default_power_limit_watts,
            power_limit_min_watts=p.min_power_limit_watts,
            power_limit_max_watts=p.max_power_limit_watts,
            temperature_celsius=float(round(temp)),
            memory_temperature_celsius=float(
                round(
                    temp
                    + p.memory_temperature_offset_celsius
                    + 4.0 * (c.cooling - 1.0)
                    + noise.gauss(0.0, 0.3)
                )
            ),
            slowdown_temperature_celsius=p.slowdown_temperature_celsius,
            shutdown_temperature_celsius=p.shutdown_temperature_celsius,
            max_operating_temperature_celsius=p.max_operating_temperature_celsius,
            memory_max_operating_temperature_celsius=p.memory_max_operating_temperature_celsius,
            clock_event_reasons=op.reasons,
            # Links train down to gen 1 while idle to save power; that is not a fault.
            pcie_link_gen=gen if load > 0 else 1,
            pcie_link_gen_max=p.pcie_gen_max,
            pcie_link_width=width,
            pcie_link_width_max=p.pcie_width_max,
            pcie_tx_bytes_per_second=float(round(tx * jitter.gauss(1.0, 0.02))),
            pcie_rx_bytes_per_second=float(round(rx * jitter.gauss(1.0, 0.02))),
            # H100 SXM has NVDEC/NVJPG but no NVENC; a training job uses neither.
            encoder_utilization_ratio=0.0,
            decoder_utilization_ratio=0.0,
            ecc_mode_enabled=c.ecc_enabled,
            row_remap_correctable_total=gpu.traits.rows_remapped,
            row_remap_uncorrectable_total=c.extra_uncorrectable,
            row_remap_pending=c.row_remap_pending,
            row_remap_failure=False,
            # Data-centre parts stay in P0 with persistence on, idle or not; clocks do the saving.
            performance_state=0,
            persistence_mode_enabled=c.persistence_mode,
            compute_mode=COMPUTE_MODES[c.compute_mode],
            processes=processes,
            gpm_sm_activity_ratio=_ratio(activity.sm * sm),
            gpm_tensor_activity_ratio=_ratio(activity.tensor * tensor),
            gpm_dram_activity_ratio=_ratio(activity.dram * dram),
            gpm_graphics_activity_ratio=_ratio(activity.graphics * graphics),
            fabric_state=FABRIC_STATE_COMPLETED,
            fabric_status=0,  # NVML_SUCCESS
            fabric_cluster_uuid=FABRIC_CLUSTER_UUID,
            fabric_clique_id=FABRIC_CLIQUE_ID,
        )

    def _fill_counters(self, reading: GpuReading, gpu: SimGpu) -> None:
        """Set the cumulative fields of `reading` from the GPU's counters as they stand."""
        counters, c = self._counters[gpu.index], gpu.condition
        reading.energy_joules_total = round(counters.energy_joules, 3)
        reading.ecc_corrected_volatile_total = counters.ecc_corrected_volatile
        reading.ecc_corrected_aggregate_total = (
            counters.ecc_corrected_lifetime + counters.ecc_corrected_volatile
        )
        # This boot's uncorrectable errors; earlier boots had none (they would have left remapped rows).
        reading.ecc_uncorrected_volatile_total = c.extra_uncorrectable + c.sram_uncorrectable
        reading.ecc_uncorrected_aggregate_total = c.extra_uncorrectable + c.sram_uncorrectable
        reading.pcie_replay_errors_total = counters.pcie_replays
        reading.nvlinks = [self._nvlink(gpu, link) for link in range(len(counters.links))]
        reading.nvlink_tx_bytes_total = sum(link.tx_bytes_total or 0 for link in reading.nvlinks)
        reading.nvlink_rx_bytes_total = sum(link.rx_bytes_total or 0 for link in reading.nvlinks)
        reading.xid_counts = counters.xid_counts()

    def _nvlink(self, gpu: SimGpu, link: int) -> NvLinkReading:
        counters = self._counters[gpu.index].links[link]
        switch, start = 0, 0
        while link >= start + NVSWITCH_LINKS[switch]:
            start += NVSWITCH_LINKS[switch]
            switch += 1
        return NvLinkReading(
            link=link,
            active=link not in gpu.condition.nvlinks_down,
            version=self.profile.nvlink_version,
            crc_errors_total=int(counters.crc_errors),
            replay_errors_total=int(counters.replay_errors),
            recovery_errors_total=int(counters.recovery_errors),
            remote_pci_bus_id=f"00000000:{NVSWITCH_BUS_IDS[switch]}:00.0",
            tx_bytes_total=int(counters.tx_bytes),
            rx_bytes_total=int(counters.rx_bytes),
        )

    def _uuid(self, index: int) -> str:
        return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{self.node}/{index}')}"

    @staticmethod
    def _bus_id(index: int) -> str:
        bus = HGX_BUS_IDS[index] if index < len(HGX_BUS_IDS) else f"{0xE0 + index:02X}"
        return f"00000000:{bus}:00.0"

    # Modelled probes

    def probe(
        self, probe: str, variant: str, gpu: int | None, *, ranks: Sequence[int] | None = None
    ) -> ProbeOutcome:
        """A modelled result of `probe`/`variant` on GPU `gpu` (None for the node-level nccl).

        nccl runs across `ranks` (GPU indices; None: every GPU of the node).
        """
        now = self.clock()
        run_noise = 1.0 + bounded_gauss(self._noise, 0.004, 0.01)
        p = self.profile
        if probe == "nccl":
            members = list(range(len(self.gpus))) if ranks is None else list(ranks)
            if len(members) < 2 or any(not 0 <= r < len(self.gpus) for r in members):
                raise ValueError(f"nccl needs 2 or more GPUs within 0..{len(self.gpus) - 1}, not {members}")
            lost = [r for r in members if self.gpus[r].condition.lost]
            if lost:
                return _failed(probe, variant, None, now, f"rank on GPU {lost[0]}: {_lost_message(lost[0])}")
            return self._nccl(variant, now, run_noise, [self.gpus[r] for r in members])
        if gpu is None or not 0 <= gpu < len(self.gpus):
            raise ValueError(f"probe {probe} needs a GPU index within 0..{len(self.gpus) - 1}")
        g = self.gpus[gpu]
        if g.condition.lost:
            return _failed(probe, variant, gpu, now, f"cuda:{gpu}: {_lost_message(gpu)}")
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

    def _nccl(self, variant: str, now: float, run_noise: float, members: list[SimGpu]) -> ProbeOutcome:
        p, n = self.profile, len(members)
        inlet = self.inlet_celsius(now)
        link_ratio = min(g.active_links() for g in members) / p.nvlink_count
        clock_ratio = min(g.operating_point(1.0, inlet).sm_clock_hz for g in members) / p.max_sm_clock_hz
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
