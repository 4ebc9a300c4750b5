"""The BMC source over Redfish: one poll walks the service from its root through Systems, Chassis,
Managers and UpdateService and fills a BmcSample section by section.

Per chassis the newest resources win, so nothing is counted twice: temperatures from Sensors, else
ThermalSubsystem/ThermalMetrics, else the legacy Thermal; fans from ThermalSubsystem/Fans, else
Thermal; power supplies from PowerSubsystem, else Power; the system's power from its chassis'
EnvironmentMetrics, else Power, else a total-power sensor. Each section runs in a guard: a section
that fails is reported with its error and the rest of the sample stands. A BMC that stops answering
ends the poll at once (the remaining sections say why) instead of timing out once per section.
Every request has a deadline for its whole answer, and the poll one for all of its requests
(`poll_timeout_seconds`): a BMC that trickles its answers ends the poll there, as a timeout.
BIOS and firmware inventory change rarely and are read every `inventory_every` polls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from agent.sources.bmc import SECTIONS, BmcLogEntry, BmcSample, BmcSectionStatus
from agent.sources.gpu import GpuInfo
from agent.sources.redfish import inventory as inv
from agent.sources.redfish import power as pwr
from agent.sources.redfish import thermal
from agent.sources.redfish.gpus import board_slot, gpu_board, map_boards
from agent.sources.redfish.reader import FATAL_KINDS, Reader, claims_expand
from agent.sources.redfish.session import BmcEndpoint, BmcError, RedfishSession
from agent.sources.redfish.values import health, link, links, member_id, text, worst

log = logging.getLogger("gpufleet.agent.bmc")
INVENTORY_SECTIONS = ("bios", "firmware")


class RedfishBmc:
    """A BmcSource for one BMC. Keeps its Redfish session between polls; `close()` logs out."""

    def __init__(
        self,
        endpoint: BmcEndpoint,
        *,
        log_entries: int = 20,
        inventory_every: int = 10,
        progress: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
        poll_timeout_seconds: float | None = None,
    ) -> None:
        self.endpoint = endpoint.base
        self._endpoint = endpoint
        self.log_entries = log_entries
        self.inventory_every = max(1, inventory_every)
        self.progress = progress
        self.clock = clock
        self.poll_timeout = poll_timeout_seconds  # None: each request's own deadline only
        self._session: RedfishSession | None = None
        self._expand_broken = False
        self._polls = 0
        self._inventory: BmcSample | None = None  # the last poll that read bios and firmware

    def poll(self, gpus: Sequence[GpuInfo] = ()) -> BmcSample:
        sample = BmcSample(time=self.clock(), endpoint=self.endpoint)
        start = time.perf_counter()
        if self._session is None or not self._session.is_open:
            self._session = RedfishSession(self._endpoint)
        session = self._session
        if self.poll_timeout is not None:
            session.deadline = time.monotonic() + self.poll_timeout
            session.deadline_seconds = self.poll_timeout
        try:
            return self._poll(session, sample, start, gpus)
        finally:
            session.deadline = None

    def interrupt(self) -> None:
        """From another thread: end the poll in flight now (the poller gave up waiting on it)."""
        session = self._session
        if session is not None:
            session.interrupt()

    def _poll(
        self, session: RedfishSession, sample: BmcSample, start: float, gpus: Sequence[GpuInfo]
    ) -> BmcSample:
        requests_before = session.requests  # 0 for a new session: its login counts in this poll
        try:
            if not session.is_open:
                self.report("connecting")
                session.open()
        except BmcError as exc:
            sample.error = exc.message
            sample.sections = [
                BmcSectionStatus(name, False, 0.0, f"not read: {exc.message}") for name in SECTIONS
            ]
            sample.requests = session.requests - requests_before
            sample.poll_duration_seconds = time.perf_counter() - start
            return sample
        reader = Reader(
            session,
            expand=claims_expand(session.root) and not self._expand_broken,
            on_expand_broken=self._expand_off,
        )
        walk = _Walk(self, reader, sample, session.root, gpus)
        refresh = self._inventory is None or self._polls % self.inventory_every == 0
        walk.run(refresh_inventory=refresh)
        sample.auth = session.auth
        sample.requests = session.requests - requests_before
        if walk.fatal is not None:
            sample.error = walk.fatal
            session.abandon()  # reconnect (and log in again) on the next poll
        elif refresh:
            inventory_ok = all(s.success for s in sample.sections if s.name in INVENTORY_SECTIONS)
            self._inventory = sample if inventory_ok else None  # None: read them again next poll
        if not refresh and self._inventory is not None:
            _reuse_inventory(sample, self._inventory)
        self._polls += 1
        sample.success = not sample.error and all(s.success for s in sample.sections)
        sample.poll_duration_seconds = time.perf_counter() - start
        return sample

    def _expand_off(self) -> None:
        if not self._expand_broken:
            log.info("BMC %s claims $expand but refuses it; reading members one by one", self.endpoint)
        self._expand_broken = True

    def report(self, step: str) -> None:
        if self.progress is not None:
            self.progress(step)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


def host_system(systems: list[dict[str, Any]]) -> dict[str, Any]:
    """The host's ComputerSystem among the service's systems ({} when there is none).

    HGX boards show up as systems of their own (HGX_Baseboard_0): the host is the one to read.
    """
    hosts = [m for m in systems if not member_id(m).upper().startswith("HGX")] or systems
    physical = [m for m in hosts if text(m, "SystemType") in ("", "Physical")] or hosts
    return physical[0] if physical else {}


def _reuse_inventory(sample: BmcSample, last: BmcSample) -> None:
    """Between inventory refreshes, carry BIOS and firmware (and how they were read) forward."""
    sample.bios_attributes = dict(last.bios_attributes)
    sample.bios_pending = dict(last.bios_pending)
    sample.bios_apply_times = list(last.bios_apply_times)
    sample.firmware = list(last.firmware)
    carried = {s.name: s for s in last.sections if s.name in INVENTORY_SECTIONS}
    sample.sections = [carried.get(s.name, s) for s in sample.sections]


class _Walk:
    """One poll's walk; sections record into `sample`; `fatal` stops the rest of the walk."""

    def __init__(
        self,
        bmc: RedfishBmc,
        reader: Reader,
        sample: BmcSample,
        root: dict[str, Any],
        gpus: Sequence[GpuInfo],
    ) -> None:
        self.bmc = bmc
        self.reader = reader
        self.sample = sample
        self.root = root
        self.gpus = gpus
        self.fatal: str | None = None
        self.system: dict[str, Any] = {}
        self.chassis: list[dict[str, Any]] | None = None
        self.managers: list[dict[str, Any]] = []

    def run(self, *, refresh_inventory: bool) -> None:
        steps: dict[str, Callable[[], None]] = {
            "systems": self.systems,
            "chassis": self.read_chassis,
            "managers": self.read_managers,
            "thermal": self.thermal,
            "power": self.power,
            "gpus": self.gpu_boards,
            "bios": self.bios,
            "firmware": self.firmware,
            "logs": self.logs,
        }
        for name in SECTIONS:
            if name in INVENTORY_SECTIONS and not refresh_inventory:
                self.sample.sections.append(
                    BmcSectionStatus(name, True, 0.0)
                )  # replaced by the carried status
                continue
            self.section(name, steps[name])

    def section(self, name: str, step: Callable[[], None]) -> None:
        if self.fatal is not None:
            self.sample.sections.append(BmcSectionStatus(name, False, 0.0, f"not read: {self.fatal}"))
            return
        self.bmc.report(name)
        self.reader.errors = []
        start = time.perf_counter()
        error = ""
        try:
            step()
        except BmcError as exc:
            error = exc.message
            if exc.kind in FATAL_KINDS:
                self.fatal = error
        except Exception as exc:  # an unexpected shape costs one section, not the poller thread
            log.warning("BMC %s: section %s failed unexpectedly", self.bmc.endpoint, name, exc_info=True)
            error = f"unexpected {type(exc).__name__}: {exc}"
        if not error and self.reader.errors:
            more = len(self.reader.errors) - 2
            error = "; ".join(self.reader.errors[:2]) + (f" (and {more} more)" if more > 0 else "")
        self.sample.sections.append(BmcSectionStatus(name, not error, time.perf_counter() - start, error))

    def each(self, items: list[dict[str, Any]], step: Callable[[dict[str, Any]], None]) -> None:
        """`step` for every item; a failure confined to one item is recorded and the rest go on."""
        for item in items:
            try:
                step(item)
            except BmcError as exc:
                if exc.kind in FATAL_KINDS:
                    raise
                self.reader.errors.append(exc.message)

    # -- sections -------------------------------------------------------------------------------

    def systems(self) -> None:
        path = link(self.root, "Systems")
        self.system = host_system(self.reader.members(path) if path else [])
        s = self.sample
        s.manufacturer = text(self.system, "Manufacturer")
        s.model = text(self.system, "Model")
        s.serial = text(self.system, "SerialNumber")
        s.system_health = health(self.system, rollup=True)
        s.bios_version = text(self.system, "BiosVersion")

    def read_chassis(self) -> None:
        path = link(self.root, "Chassis")
        self.chassis = self.reader.members(path) if path else []
        self.sample.chassis_health = worst([health(c, rollup=True) for c in self.chassis])

    def read_managers(self) -> None:
        path = link(self.root, "Managers")
        self.managers = self.reader.members(path) if path else []
        bmcs = [m for m in self.managers if text(m, "ManagerType") == "BMC"] or self.managers
        self.sample.bmc_firmware_version = text(bmcs[0], "FirmwareVersion") if bmcs else ""

    def _need_chassis(self) -> list[dict[str, Any]]:
        if self.chassis is None:
            raise BmcError("not read: the chassis collection could not be read", kind="http")
        return self.chassis

    def thermal(self) -> None:
        self.each(self._need_chassis(), self._chassis_thermal)

    def _chassis_thermal(self, chassis: dict[str, Any]) -> None:
        cid, r, s = member_id(chassis), self.reader, self.sample
        sensors_path = link(chassis, "Sensors")
        subsystem = r.optional(link(chassis, "ThermalSubsystem"))
        fans_path = link(subsystem, "Fans")
        # The legacy resource is read only for what the newer ones do not give.
        needs_legacy = not (sensors_path or subsystem) or not fans_path
        legacy = r.optional(link(chassis, "Thermal")) if needs_legacy else {}
        if sensors_path:
            s.temperatures += thermal.temperatures_from_sensors(r.members(sensors_path), cid)
        elif subsystem:
            metrics = r.optional(link(subsystem, "ThermalMetrics"))
            s.temperatures += thermal.temperatures_from_thermal_metrics(metrics, cid)
        else:
            s.temperatures += thermal.temperatures_from_legacy(legacy, cid)
        if fans_path:
            s.fans += thermal.fans_from_subsystem(r.members(fans_path), cid)
        else:
            s.fans += thermal.fans_from_legacy(legacy, cid)

    def power(self) -> None:
        chassis = self._need_chassis()
        self.each(chassis, self._chassis_power)
        main = self._main_chassis(chassis)
        if main is not None:
            self.sample.power_consumed_watts = self._consumed(main)

    def _chassis_power(self, chassis: dict[str, Any]) -> None:
        cid, r, s = member_id(chassis), self.reader, self.sample
        if link(chassis, "PowerSubsystem"):
            subsystem = r.get(link(chassis, "PowerSubsystem"))
            psus = r.members(link(subsystem, "PowerSupplies")) if link(subsystem, "PowerSupplies") else []
            s.power_supplies += [pwr.psu_from_subsystem(p, r.optional(link(p, "Metrics")), cid) for p in psus]
            mode, psu_health = pwr.redundancy_from_subsystem(subsystem)
        elif link(chassis, "Power"):
            legacy = r.get(link(chassis, "Power"))
            s.power_supplies += pwr.psus_from_legacy(legacy, cid)
            mode, psu_health = pwr.redundancy_from_legacy(legacy)
        else:
            return
        if mode and not s.power_supply_redundancy_mode:
            s.power_supply_redundancy_mode, s.power_supply_redundancy_health = mode, psu_health

    def _main_chassis(self, chassis: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The chassis whose power is the node's: the system's own, else the first that is no component."""
        wanted = links(self.system, "Links", "Chassis")
        for c in chassis:
            if text(c, "@odata.id") in wanted:
                return c
        return next(
            (c for c in chassis if board_slot(c) is None and text(c, "ChassisType") != "Component"), None
        )

    def _consumed(self, chassis: dict[str, Any]) -> float | None:
        r = self.reader
        watts = pwr.consumed_from_environment(r.optional(link(chassis, "EnvironmentMetrics")))
        if watts is None and link(chassis, "Power"):
            watts = pwr.consumed_from_legacy(r.optional(link(chassis, "Power")))
        if watts is None and link(chassis, "Sensors"):
            watts = pwr.consumed_from_sensors(r.members(link(chassis, "Sensors")))
        return watts

    def gpu_boards(self) -> None:
        boards = []
        for chassis in sorted(self._need_chassis(), key=lambda c: board_slot(c) or 0):
            if board_slot(chassis) is None:
                continue
            sensors = self.reader.members(link(chassis, "Sensors")) if link(chassis, "Sensors") else []
            environment = self.reader.optional(link(chassis, "EnvironmentMetrics"))
            boards.append(gpu_board(chassis, sensors, environment))
        self.sample.gpus = map_boards(boards, self.gpus)

    def _systems_failed(self) -> bool:
        systems = self.sample.section("systems")
        return systems is not None and not systems.success

    def bios(self) -> None:
        if self._systems_failed():  # else "no Bios link" would pass for "nothing to read"
            raise BmcError("not read: the systems collection could not be read", kind="http")
        path = link(self.system, "Bios")
        if not path:
            return  # the service exposes no BIOS resource: nothing to read, nothing failed
        bios = self.reader.get(path)
        s = self.sample
        s.bios_attributes = inv.bios_attributes(bios)
        settings = self.reader.optional(inv.settings_object_path(bios))
        s.bios_pending = inv.bios_pending(s.bios_attributes, settings) if settings else {}
        s.bios_apply_times = inv.apply_times(bios, settings)

    def firmware(self) -> None:
        update = self.reader.optional(link(self.root, "UpdateService"))
        path = link(update, "FirmwareInventory")
        self.sample.firmware = [inv.firmware_item(m) for m in self.reader.members(path)] if path else []

    def logs(self) -> None:
        limit = self.bmc.log_entries
        if limit == 0:
            return
        owners = [self.system, *[m for m in self.managers if text(m, "ManagerType") in ("BMC", "")]]
        if self._systems_failed():
            self.reader.errors.append("system logs not read: the systems collection could not be read")
        services: list[dict[str, Any]] = []

        def list_services(owner: dict[str, Any]) -> None:
            services.extend(self.reader.members(link(owner, "LogServices")))

        self.each([o for o in owners if link(o, "LogServices")], list_services)
        entries: list[BmcLogEntry] = []

        def read(service: dict[str, Any]) -> None:
            path = link(service, "Entries")
            if path:
                found = self.reader.members(path, fetch_limit=limit)
                entries.extend(inv.log_entry(e, text(service, "@odata.id")) for e in found)

        self.each(services, read)
        self.sample.log_entries = inv.newest(entries, limit)
