"""A real controller for tests: ControllerApp + build_server on 127.0.0.1, port chosen by the OS.

`running_controller` serves on the caller's event loop (async clients, direct access to the app);
`ControllerThread` serves on a loop of its own, for synchronous clients such as the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from controller.app import ControllerApp
from controller.config import ControllerConfig, DetectConfig
from controller.fleet.finding import Evidence, Finding
from controller.fleet.findings import StoredFinding, finding_id
from controller.fronts.relay import Fronts
from controller.fronts.wire import FrontSettings
from controller.listeners import Listeners
from controller.server import build_server, server_options
from controller.servicer import TelemetryServicer
from protos.gpufleet.v1 import bmc_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb

T = TypeVar("T")
T0 = 1_800_000_000.0
H100 = "NVIDIA H100 80GB HBM3"
# Findings open the first pass they are raised and resolve the first clean one (the hysteresis of
# detect.open_after_passes and close_after_passes off), for tests about what follows a finding.
NO_HYSTERESIS = DetectConfig(open_after_passes=1, open_window_passes=1, close_after_passes=1)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def config(**overrides: Any) -> ControllerConfig:
    fields: dict[str, Any] = {"listen": "127.0.0.1:0", "db": ":memory:"}
    fields.update(overrides)
    return ControllerConfig(**fields)


@dataclass(slots=True)
class Running:
    app: ControllerApp
    server: Listeners
    address: str  # agents (and operators, without fronts)
    operators: str = ""  # with fronts: the server's own port
    fronts: Fronts | None = None


@contextlib.asynccontextmanager
async def running_controller(
    cfg: ControllerConfig | None = None, clock: Callable[[], float] | None = None, *, fronts: int = 0
) -> AsyncIterator[Running]:
    """With `fronts`, that many ingest front processes serve the agents (Running.address) and relay
    to the app (controller/fronts/); the server then serves operators only (Running.operators)."""
    app = ControllerApp(cfg or config(), clock=clock or Clock())
    await app.start()
    try:
        server, address = await build_server(app)
        try:
            if not fronts:
                yield Running(app, server, address)
                return
            settings = FrontSettings("127.0.0.1:0", server_options(app.config), None, operators=address)
            relay = Fronts(TelemetryServicer(app), fronts, settings)
            agents = await relay.start()
            app.fronts = relay
            try:
                yield Running(app, server, agents, address, relay)
            finally:
                await relay.stop()
        finally:
            await server.stop(None)
    finally:
        app.close()


class ControllerThread:
    """`with ControllerThread() as c:` serves until the block ends; `c.call(fn)` runs a coroutine
    function on the server's loop (so tests can change the app's state safely)."""

    def __init__(self, cfg: ControllerConfig | None = None, clock: Callable[[], float] | None = None) -> None:
        self._cfg = cfg
        self._clock = clock
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._running: Running | None = None
        self._thread = threading.Thread(target=self._run, name="test-controller", daemon=True)

    @property
    def app(self) -> ControllerApp:
        assert self._running is not None
        return self._running.app

    @property
    def address(self) -> str:
        assert self._running is not None
        return self._running.address

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                async with running_controller(self._cfg, self._clock) as running:
                    self._running = running
                    self._ready.set()
                    await self._stop.wait()
            except BaseException as exc:
                self._error = exc
                raise
            finally:
                self._ready.set()

        with contextlib.suppress(Exception):
            asyncio.run(main())

    def call(self, fn: Callable[[ControllerApp], Coroutine[Any, Any, T]]) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(self.app), self._loop).result(timeout=10)

    def __enter__(self) -> ControllerThread:
        self._thread.start()
        if not self._ready.wait(timeout=10) or self._error is not None or self._running is None:
            raise RuntimeError(f"test controller did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "test controller did not stop"


# Wire messages


def hello(node: str = "n1", boot: str = "b1", gpus: int = 1, **fields: Any) -> pb.Hello:
    msg = pb.Hello(node=node, boot_id=boot, **({"agent_version": "test"} | fields))
    msg.inventory.source = "sim"
    for i in range(gpus):
        msg.inventory.gpus.add(index=i, uuid=f"GPU-{node}-{i}", name=H100)
    return msg


def frame(seq: int, node: str = "n1", boot: str = "b1", t: float = T0) -> pb.TelemetryFrame:
    msg = pb.TelemetryFrame(node=node, boot_id=boot, seq=seq)
    msg.time.FromSeconds(int(t) - 10 + seq)
    msg.gpus.add(index=0, power_watts=400.0 + seq, temperature_celsius=60.0)
    msg.probes.add(probe="gemm", variant="bf16", gpu=0, value=700.0 + seq, unit="TFLOP/s")
    return msg


def bmc_sample(t: float = T0, node: str = "n1") -> bmc_pb2.BmcSample:
    """A partial poll of an HGX-like node: two chassis, a failed fan, a degraded PSU, an empty PSU
    bay, one pending BIOS setting, a failed logs section, and GPU sensors mapped to GPUs 0 and 1."""
    msg = bmc_pb2.BmcSample(
        endpoint=f"https://bmc-{node}.example",
        poll_duration_seconds=1.4,
        success=False,
        system_health="ok",
        chassis_health="critical",
        power_consumed_watts=5230.0,
        bios_version="2.1.4",
        bios_attributes={"ProcCStates": "Disabled", "SriovGlobalEnable": "Enabled"},
        bios_pending={"ProcCStates": "Enabled"},
        bmc_firmware_version="7.10.30",
    )
    msg.time.FromNanoseconds(int(t * 1e9))
    msg.sections.add(name="thermal", success=True, duration_seconds=0.3)
    msg.sections.add(name="logs", success=False, error="HTTP 500")
    msg.temperatures.add(name="Inlet 1", context="intake", reading_celsius=24.0, chassis="1")
    msg.temperatures.add(name="Inlet 2", context="intake", reading_celsius=26.0, chassis="2")
    msg.temperatures.add(name="Exhaust", context="exhaust", reading_celsius=41.0, upper_critical_celsius=70.0)
    msg.temperatures.add(name="CPU 1", context="cpu", reading_celsius=55.0)
    msg.fans.add(name="Fan 1", speed_rpm=9000.0, health="ok")
    msg.fans.add(name="Fan 4", speed_rpm=0.0, health="critical")
    msg.fans.add(name="Fan 9", state="absent")
    msg.power_supplies.add(name="PSU 1", health="ok", input_watts=1800.0)
    msg.power_supplies.add(name="PSU 2", health="ok", input_watts=1750.0)
    msg.power_supplies.add(name="PSU 3", health="warning", input_watts=1680.0)
    msg.power_supplies.add(name="PSU 4", state="absent")
    msg.gpus.add(index=0, chassis="HGX_GPU_SXM_1", temperature_celsius=63.0, power_watts=415.0, health="ok")
    msg.gpus.add(index=1, chassis="HGX_GPU_SXM_2", temperature_celsius=71.0, health="warning")
    return msg


def as_hello(msg: pb.Hello) -> pb.AgentMessage:
    return pb.AgentMessage(hello=msg)


def as_frame(msg: pb.TelemetryFrame) -> pb.AgentMessage:
    return pb.AgentMessage(frame=msg)


# Findings, as a detection pass would leave them


def stored_finding(
    node: str,
    gpu: int | None,
    cause: str,
    severity: str,
    *,
    first_seen: float = T0 - 100,
    active: bool = True,
) -> StoredFinding:
    evidence = Evidence("enforced_power_limit_watts", 400.0, 700.0, -0.43, "W", ("sw_power_cap",), 7, "why")
    finding = Finding(node, gpu, cause, severity, f"{cause} on {node}", evidence, detectors=["throttle"])
    return StoredFinding(finding_id(finding.key, first_seen), finding, first_seen, first_seen + 50, active)


async def add_findings(app: ControllerApp, findings: list[StoredFinding]) -> None:
    """Store findings and make the active ones current, the way ControllerApp.detection_pass does."""
    await app.store.save_findings([s for s in findings if s.active], [s for s in findings if not s.active])
    for s in findings:
        if s.active:
            app.active[s.finding.key] = s


# A small fleet with every health: see populate()

STALE_AFTER = 60.0  # pass as stale_after_seconds
FINDINGS = [
    stored_finding("b-degraded", 1, "power_cap", "warning"),
    stored_finding("c-critical", 0, "thermal_throttle", "warning"),
    stored_finding("c-critical", None, "nvlink_down", "critical"),
    stored_finding("c-critical", 1, "ecc_row_remap_pending", "critical"),
    stored_finding("d-stale", 0, "ecc_row_remap_pending", "critical"),
    stored_finding("a-healthy", 0, "slow_unknown", "info", active=False),
    stored_finding("b-degraded", 0, "hbm_degraded", "info"),
]


async def populate(app: ControllerApp, clock: Clock) -> None:
    """Five nodes at T0; a minute and a bit later, a, b and c are still heard from on their streams,
    d-stale has gone quiet and e-returned said hello."""
    for name in ("a-healthy", "b-degraded", "c-critical", "d-stale", "e-returned"):
        await app.ingest.hello(hello(name, gpus=2))
        assert await app.ingest.frame(name, frame(1, name)) == 1
        if name in ("a-healthy", "b-degraded", "c-critical"):
            app.connected(name)
    await add_findings(app, FINDINGS)
    clock.now = T0 + STALE_AFTER + 1
    for name in ("a-healthy", "b-degraded", "c-critical"):  # streaming on: heard from just now
        app.fleet.nodes[name].last_heard = clock.now
    await app.ingest.hello(hello("e-returned", boot="b2", gpus=2))
