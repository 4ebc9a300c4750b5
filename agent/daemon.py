"""The agent daemon: a sampling loop over registered collectors, and the stream to the controller.

Sampling runs on its own schedule in a worker thread, whatever the controller does; each cycle
makes one Snapshot, which becomes one spooled frame. Commands from the controller go through the
handler registry (agent/commands/); probe results ride in the next frame, taken at once rather than
at the next tick.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from agent import version
from agent.collectors.base import Collector, CollectorContext, discover
from agent.commands.executor import CommandExecutor
from agent.commands.registry import CommandContext
from agent.compose.stream import client_tls
from agent.config import AgentConfig
from agent.exporter import Exporter
from agent.probes.base import ProbeOutcome, ProbeRunner
from agent.probes.kernels import infos
from agent.snapshot import CollectorStatus, Snapshot
from agent.sources.bmc import BmcSource
from agent.sources.bmc_poller import BmcPoller
from agent.sources.errors import SourceError
from agent.sources.gpu import GpuSource, Inventory
from agent.sources.host import HostFacts, HostReader
from agent.stream import frames
from agent.stream.backoff import Backoff
from agent.stream.client import StreamClient
from agent.stream.spool import Spool
from agent.stream.status import StreamStatus
from agent.tuning.tuner import Tuner
from protos.gpufleet.v1 import telemetry_pb2 as pb

log = logging.getLogger("gpufleet.agent")


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        gpu: GpuSource,
        host: HostReader | None,
        probes: ProbeRunner,
        *,
        bmc: BmcSource | None = None,
        tuner: Tuner | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.tuner = tuner
        self.gpu = gpu
        self.host = host
        self.probes = probes
        self.clock = clock
        self.boot_id = uuid.uuid4().hex
        self.started_at = clock()
        self.inventory: Inventory = gpu.inventory()
        self.host_facts: HostFacts | None = host.facts() if host else None
        self.inventory.expected_gpu_count = self._expected_gpus()
        self.bmc: BmcPoller | None = None
        if bmc is not None:
            self.bmc = BmcPoller(
                bmc,
                interval_seconds=config.bmc.interval_seconds,
                backoff_max_seconds=config.bmc.backoff_max_seconds,
                gpus=self.inventory.gpus,
                poll_timeout_seconds=config.bmc.poll_timeout_seconds,
            )
        registry = discover()
        ctx = CollectorContext(gpu=gpu, host=host, bmc=self.bmc)
        self.collectors: list[Collector] = [
            registry[name](ctx)
            for name in config.enabled_collectors(sorted(registry))
            if registry[name].applies(ctx)
        ]
        self._failing: dict[str, str] = {}  # collector -> error last logged
        self.latest: Snapshot | None = None
        self.exporter: Exporter | None = None  # set where /metrics is served: it sees every snapshot
        self.seq = 0
        self._pending_probes: list[ProbeOutcome] = []
        self._pending_lock = threading.Lock()  # sample() runs in a worker thread
        self._wake_sampler = asyncio.Event()
        spool_dir = config.stream.spool_dir
        self.commands = CommandExecutor(
            CommandContext(probes=probes, deliver_probes=self._deliver_probes, tuner=tuner),
            state_dir=None if spool_dir is None else Path(spool_dir) / ".commands",
        )
        self.spool: Spool | None = None
        self.client: StreamClient | None = None

    def stream_status(self) -> StreamStatus | None:
        """Where the stream to the controller stands (the /metrics page); None when not streaming."""
        client = self.client
        return None if client is None else client.status()

    def _expected_gpus(self) -> int | None:
        """The configured GPU count, else the most any view shows (NVML, or the PCI bus for NVML)."""
        if self.config.expected_gpus is not None:
            return self.config.expected_gpus
        counts = [self.inventory.expected_gpu_count, len(self.inventory.gpus)]
        if self.inventory.source == "nvml" and self.host_facts is not None:
            counts.append(self.host_facts.nvidia_gpu_pci_count)
        known = [c for c in counts if c is not None]
        return max(known) if known else None

    def sample(self) -> Snapshot:
        """Run every collector once, each in a guard; attach probe results waiting to be sent."""
        snapshot = Snapshot(node=self.config.node, time=self.clock())
        for collector in self.collectors:
            start = time.perf_counter()
            try:
                collector.collect(snapshot)
                status = CollectorStatus(collector.name, True, time.perf_counter() - start)
            except Exception as exc:  # noqa: BLE001 - one bad collector never breaks the cycle; it is reported
                status = CollectorStatus(collector.name, False, time.perf_counter() - start, str(exc))
            self._log_change(status)
            snapshot.collectors[collector.name] = status
        with self._pending_lock:
            snapshot.probes, self._pending_probes = self._pending_probes, []
        self.latest = snapshot
        if self.exporter is not None:
            self.exporter.observe(snapshot)
        return snapshot

    def _log_change(self, status: CollectorStatus) -> None:
        """Log a collector failing, its error changing and its recovery; not the same error every cycle."""
        previous = self._failing.get(status.name)
        if status.success:
            if previous is not None:
                log.info("collector %s works again", status.name)
                del self._failing[status.name]
        elif status.error != previous:
            log.warning("collector %s failed: %s", status.name, status.error)
            self._failing[status.name] = status.error

    def hello(self) -> pb.Hello:
        """Hello: inventory, host facts, commands served, and each offered probe with its declared
        facts (a ProbeInfo from its kernel's file), from which the controller schedules and compares it."""
        offered = self.probes.available()
        return frames.hello(
            self.config.node,
            self.boot_id,
            version(),
            self.inventory,
            host=self.host_facts,
            probes=offered,
            started_at=self.started_at,
            capabilities=self.commands.capabilities,
            probe_infos=infos(offered),
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Sample every interval until `stop`; stream to the controller when one is configured.
        First, tuning's start duties: finish an apply a crash left, and put committed settings back."""
        await self.settle_tuning()
        stream_cfg = self.config.stream
        tasks = []
        wake = self._wake_sampler
        if stream_cfg.controller:
            self.spool = Spool(stream_cfg.spool_dir, max_frames=stream_cfg.spool_max_frames)
            self.client = StreamClient(
                stream_cfg.controller,
                self.spool,
                self.hello,
                self.handle_command,
                backoff=Backoff(stream_cfg.backoff_initial_seconds, stream_cfg.backoff_max_seconds),
                tls=client_tls(stream_cfg),
            )
            self.commands.on_started = self.client.command_started
            tasks.append(asyncio.create_task(self.client.run(stop), name="stream"))
        log.info(
            "agent %s on node %s: %d GPUs (%s), every %.1fs, %s",
            version(),
            self.config.node,
            len(self.inventory.gpus),
            self.inventory.source,
            self.config.interval_seconds,
            f"streaming to {stream_cfg.controller}" if stream_cfg.controller else "not streaming",
        )
        if self.bmc is not None:
            self.bmc.start()
            log.info(
                "reading BMC %s every %.0fs in its own thread",
                self.bmc.source.endpoint,
                self.config.bmc.interval_seconds,
            )
        try:
            await self._sample_loop(stop, wake)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.close()

    async def settle_tuning(self) -> None:
        """Roll back (or flag) an apply the last run left unfinished, see where committed BIOS changes
        that waited for a reboot stand, then re-apply the committed profiles' GPU and OS settings a
        reboot lost; all logged. Before the first sample, so that
        what the controller sees is the node as it will stay."""
        if self.tuner is None:
            return
        await asyncio.to_thread(self.tuner.recover)
        await asyncio.to_thread(self.tuner.check_pending)
        if self.config.tuning.reapply_at_start:
            await asyncio.to_thread(self.tuner.reapply)

    async def _sample_loop(self, stop: asyncio.Event, wake: asyncio.Event) -> None:
        interval = self.config.interval_seconds
        next_at = time.monotonic()
        while not stop.is_set():
            wake.clear()  # before sampling: a wake-up that arrives during the sample is kept
            snapshot = await asyncio.to_thread(self.sample)
            self._emit(snapshot)
            now = time.monotonic()
            if now >= next_at:  # a scheduled tick (an early wake-up keeps the schedule)
                next_at += interval
                if next_at < now:  # a cycle overran: skip the missed ticks rather than bunch them up
                    log.warning("sampling cycle took longer than the %.1fs interval", interval)
                    next_at = now + interval
            waiters = {asyncio.create_task(stop.wait()), asyncio.create_task(wake.wait())}
            _, pending = await asyncio.wait(
                waiters, timeout=next_at - now, return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending | waiters:
                task.cancel()

    def _emit(self, snapshot: Snapshot) -> None:
        if self.spool is None or self.client is None:
            return
        self.seq += 1
        self.spool.append(frames.frame(snapshot, self.boot_id, self.seq))
        self.client.notify()

    async def handle_command(self, command: pb.Command) -> pb.CommandResult:
        """Run a command from the controller through the registered handlers (agent/commands/)."""
        return await self.commands.execute(command)

    def _deliver_probes(self, outcomes: Sequence[ProbeOutcome]) -> None:
        with self._pending_lock:
            self._pending_probes.extend(outcomes)
        self._wake_sampler.set()  # send the results now rather than at the next tick

    def close(self) -> None:
        """Stop a probe run in progress, release collectors, the BMC (logout) and the GPU source;
        failures are logged, never raised."""
        try:
            self.probes.close()
        except Exception as exc:  # noqa: BLE001 - shutting down: report and go on
            log.warning("probe runner did not close cleanly: %s", exc)
        if self.bmc is not None:
            self.bmc.stop()
        for collector in self.collectors:
            try:
                collector.close()
            except Exception as exc:  # noqa: BLE001 - shutting down: report and go on
                log.warning("collector %s did not close cleanly: %s", collector.name, exc)
        try:
            self.gpu.close()
        except SourceError as exc:
            log.warning("GPU source did not close cleanly: %s", exc)
