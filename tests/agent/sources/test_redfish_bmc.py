"""RedfishBmc against real Redfish servers: DMTF's public mockup served by sushy-static, our own
captured-style HGX and legacy-only trees, and sushy-emulator.

Each test starts its server on 127.0.0.1 (a free port) and stops it (fixtures in
tests/redfish_servers.py).
"""

from __future__ import annotations

from agent.sources.bmc import SECTIONS, BmcSample
from agent.sources.gpu import GpuInfo
from agent.sources.redfish.bmc import RedfishBmc
from agent.sources.redfish.session import BmcEndpoint, Credentials
from tests.redfish_servers import LEGACY_ONLY, FakeBmcServer, RunningServer

HGX_SERIALS = [f"16549220000{k}" for k in range(1, 9)]
# NVML numbers GPUs by PCI bus, not SXM slot: give slot k's GPU a different index on purpose.
HGX_GPUS = [
    GpuInfo((k + 2) % 8, f"GPU-x{k}", "NVIDIA H100 80GB HBM3", serial=s) for k, s in enumerate(HGX_SERIALS)
]


def poll(url: str, *, user: str | None = "admin", password: str = "secret", **kwargs: object) -> BmcSample:
    creds = Credentials(user, password) if user else None
    bmc = RedfishBmc(BmcEndpoint(url, creds, read_timeout_seconds=5.0), **kwargs)  # type: ignore[arg-type]
    try:
        return bmc.poll(HGX_GPUS)
    finally:
        bmc.close()


def failed(sample: BmcSample) -> dict[str, str]:
    return {s.name: s.error for s in sample.sections if not s.success}


def test_dmtf_mockup_prefers_new_resources_without_double_counting(dmtf_mockup: RunningServer) -> None:
    sample = poll(dmtf_mockup.url)
    assert sample.success, failed(sample)
    assert [s.name for s in sample.sections] == list(SECTIONS)
    assert (sample.manufacturer, sample.model, sample.serial) == ("Contoso", "3500", "437XR1138R2")
    assert (sample.system_health, sample.chassis_health) == ("ok", "ok")
    # Temperatures come from Sensors only: the legacy Thermal's "CPU1 Temp" is not added again.
    names = {t.name for t in sample.temperatures}
    assert "CPU1 Temp" not in names and "Chassis Intake Temp" not in names
    cpu = next(t for t in sample.temperatures if t.name == "CPU #1 Temperature")
    assert (cpu.context, cpu.reading_celsius) == ("cpu", 37.0)
    assert (cpu.upper_caution_celsius, cpu.upper_critical_celsius, cpu.upper_fatal_celsius) == (42, 45, 50)
    assert {t.context for t in sample.temperatures} >= {"intake", "exhaust", "cpu", "memory"}
    assert all(t.source.startswith("/redfish/v1/Chassis/1U/Sensors/") for t in sample.temperatures)
    # Fans from ThermalSubsystem (4), not the legacy Thermal's 2 as well.
    assert sorted(f.name for f in sample.fans) == ["Fan Bay 1", "Fan Bay 2", "Fan for CPU 1", "Fan for CPU 2"]
    bay1 = next(f for f in sample.fans if f.name == "Fan Bay 1")
    assert (bay1.speed_rpm, bay1.speed_ratio, bay1.health) == (2200.0, 0.45, "ok")
    # PSUs from PowerSubsystem with their Metrics; the empty bay is reported as absent.
    psu = {p.name: p for p in sample.power_supplies}
    assert set(psu) == {"Power Supply Bay 1", "Power Supply Bay 2"}
    assert (psu["Power Supply Bay 1"].health, psu["Power Supply Bay 1"].input_watts) == ("warning", 937.4)
    assert psu["Power Supply Bay 2"].state == "absent"
    assert sample.power_supply_redundancy_mode == "Failover"
    assert sample.power_consumed_watts == 374.0  # EnvironmentMetrics, not the legacy PowerControl's 344
    assert sample.bios_version == "P79 v1.45 (12/06/2017)"
    assert sample.bios_attributes["ProcTurboMode"] == "Enabled" and len(sample.bios_attributes) == 10
    assert sample.bios_pending == {
        "AdminPhone": "(404) 555-1212",
        "EmbeddedSata": "Ahci",
        "NicBoot2": "NetworkBoot",
        "ProcTurboMode": "Disabled",
    }
    assert {(f.id, f.version, f.updateable) for f in sample.firmware} == {
        ("BMC", "1.45.455b66-rev4", True),
        ("SS", "2.50", True),
        ("BIOS", "P79 v1.45", True),
    }
    assert sample.bmc_firmware_version == "1.45.455b66-rev4"
    newest = sample.log_entries[0]
    assert (newest.log.rsplit("/", 1)[-1], newest.id) == ("Log1", "2")
    assert {e.severity for e in sample.log_entries} == {"critical"}
    assert sample.auth == "basic"  # sushy-static's session answer has no token: basic auth instead
    assert sample.gpus == []


def test_mockup_claims_expand_it_refuses_asked_once_per_source(dmtf_mockup: RunningServer) -> None:
    bmc = RedfishBmc(BmcEndpoint(dmtf_mockup.url, Credentials("a", "b")))
    try:
        first, second = bmc.poll(), bmc.poll()
    finally:
        bmc.close()
    assert first.success and second.success
    expand_requests = [
        line for line in dmtf_mockup.log_text().splitlines() if '"GET ' in line and "$expand" in line
    ]
    assert len(expand_requests) == 1
    assert second.requests < first.requests  # no login, no $expand attempt, inventory reused


def test_hgx_node_maps_gpu_boards_and_reads_new_subsystems(hgx_bmc: FakeBmcServer) -> None:
    sample = poll(hgx_bmc.url)
    assert sample.auth == "session"
    assert failed(sample) == {}
    assert not sample.success or sample.chassis_health == "critical"
    assert sample.chassis_health == "critical"  # Fan_4 failed
    by_index = {g.index: g for g in sample.gpus}
    assert sorted(by_index) == list(range(8))  # the ERoT and the baseboard are not GPUs
    for k, gpu in enumerate(HGX_GPUS, start=1):
        board = by_index[gpu.index]
        assert (board.chassis, board.matched_by, board.serial) == (f"HGX_GPU_SXM_{k}", "serial", gpu.serial)
        assert (board.temperature_celsius, board.memory_temperature_celsius) == (40.0 + k, 50.0 + k)
        assert board.power_watts == 300.0 + 10 * k
    fans = {f.name: f for f in sample.fans}
    assert len(fans) == 6 and fans["Fan_4"].health == "critical" if "Fan_4" in fans else len(fans) == 6
    assert [f.health for f in sample.fans].count("critical") == 1
    psus = sorted(sample.power_supplies, key=lambda p: p.name)
    assert [(p.input_watts, p.output_watts) for p in psus] == [(905, 860), (912, 866), (455, 401), (898, 853)]
    assert [p.health for p in psus].count("warning") == 1
    assert sample.power_consumed_watts == 3420.0
    intake = [t for t in sample.temperatures if t.context == "intake" and t.chassis == "BMC_0"]
    assert [(t.reading_celsius, t.upper_caution_celsius, t.upper_critical_celsius) for t in intake] == [
        (24.5, 35.0, 40.0)
    ]
    gpu_temps = [t for t in sample.temperatures if t.context == "gpu"]
    assert len(gpu_temps) == 8 and {t.upper_critical_celsius for t in gpu_temps} == {87.0}
    assert sample.bios_pending == {"PcieAcsControl": "Disabled", "ProcessorPowerProfile": "PowerSaving"}
    assert sample.bios_apply_times == ["OnReset", "AtMaintenanceWindowStart"]
    assert sample.bmc_firmware_version == "01.02.03"
    assert [e.id for e in sample.log_entries] == ["3", "1", "5", "2", "4"]
    assert hgx_bmc.logouts, "close() must end the Redfish session"


def test_gpu_boards_fall_back_to_uuid_and_slot_order(hgx_bmc: FakeBmcServer) -> None:
    uuids = [GpuInfo(5, "GPU-5C0E0B3E-1AB6-4C1E-9E62-000000000003", "H100")]
    bmc = RedfishBmc(BmcEndpoint(hgx_bmc.url, Credentials("admin", "secret")))
    try:
        by_uuid = {g.chassis: (g.index, g.matched_by) for g in bmc.poll(uuids).gpus}
        no_inventory = [(g.index, g.chassis, g.matched_by) for g in bmc.poll(()).gpus]
    finally:
        bmc.close()
    assert by_uuid["HGX_GPU_SXM_3"] == (5, "uuid")
    assert by_uuid["HGX_GPU_SXM_1"] == (6, "none")  # the node knows one GPU: the rest numbered after it
    assert no_inventory[:2] == [(0, "HGX_GPU_SXM_1", "index"), (1, "HGX_GPU_SXM_2", "index")]


def test_inventory_is_reread_only_every_n_polls(hgx_bmc: FakeBmcServer) -> None:
    bmc = RedfishBmc(BmcEndpoint(hgx_bmc.url, Credentials("admin", "secret")), inventory_every=3)
    try:
        samples = [bmc.poll() for _ in range(4)]
    finally:
        bmc.close()
    bios_reads = [p for p in hgx_bmc.paths("GET") if p.endswith("/Bios")]
    assert len(bios_reads) == 2  # polls 1 and 4
    assert all(
        s.bios_pending == samples[0].bios_pending and s.firmware == samples[0].firmware for s in samples
    )
    assert all(s.success == samples[0].success for s in samples)
    assert len(hgx_bmc.paths("POST")) == 1  # one session for all four polls


def test_legacy_only_service_with_missing_properties(fake_bmc: object) -> None:
    server = fake_bmc(LEGACY_ONLY)  # type: ignore[operator]
    sample = poll(server.url)
    assert sample.success, failed(sample)
    temps = {t.name: t for t in sample.temperatures}
    absent = [t for t in sample.temperatures if t.state == "absent"]
    assert len(absent) == 1 and absent[0].reading_celsius is None
    assert any(t.context == "intake" and t.reading_celsius == 22.0 for t in temps.values())
    assert sorted(f.speed_rpm or 0 for f in sample.fans) == [720.0, 5400.0, 5640.0]
    assert [f.health for f in sample.fans].count("") == 1  # the fan without Status
    assert sample.power_consumed_watts == 412.0
    assert sorted(p.output_watts or 0 for p in sample.power_supplies) == [190.0, 198.0]
    assert all(p.name for p in sample.power_supplies)  # the PSU without Name still gets one
    assert sample.power_supply_redundancy_mode == "N+m"
    assert len(sample.bios_attributes) == 4 and sample.bios_pending == {}
    assert sample.firmware == []  # no UpdateService: nothing to read, nothing failed


def test_emulator_without_sessions_or_firmware_inventory(sushy_emulator: object) -> None:
    server = sushy_emulator(users={"admin": "secret"})  # type: ignore[operator]
    sample = poll(server.url)
    assert sample.auth == "basic"  # no SessionService at all: basic auth
    assert sample.manufacturer == "Sushy Emulator"
    assert {t.name for t in sample.temperatures} >= {"CPU Temp", "Chassis Intake Temp"}  # legacy Thermal
    assert sample.fans
    # The emulator links FirmwareInventory but answers 404: that section fails, the rest stands.
    assert list(failed(sample)) == ["firmware"]
    assert "HTTP 404" in failed(sample)["firmware"]
    assert not sample.success and sample.error == ""
