"""HostSource over a captured host tree (tests/fixtures/host/vm-ib-aer, see its README).

Every field is checked against the files as the kernel wrote them; copies of the tree in tmp_path
are changed to test utilisation between reads, missing files and text no kernel would write.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.collectors.base import CollectorContext, PartialRead
from agent.collectors.host import HostCollector
from agent.snapshot import Snapshot
from agent.sources.host import (
    CpuCoreReading,
    DiskReading,
    InfinibandPortReading,
    NetInterfaceReading,
    PcieAerReading,
)
from agent.sources.linux.source import HostSource
from agent.sources.sim import SimNode

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "host" / "vm-ib-aer"
KIB = 1024
IB = "sys/class/infiniband"
PCI = "sys/bus/pci/devices"
CPUFREQ = "sys/devices/system/cpu/cpu{}/cpufreq"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy of the captured tree that a test may change."""
    copy = tmp_path / "host"
    shutil.copytree(FIXTURE, copy)
    return copy


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def advance_stat(root: Path, ticks: dict[str, list[int]]) -> None:
    """Add `ticks` (user nice system idle iowait ...) to the named cpu lines of proc/stat."""
    lines = []
    for line in (root / "proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name in ticks:
            added = ticks[name] + [0] * (len(fields) - len(ticks[name]))
            lines.append(" ".join([name, *(str(int(f) + a) for f, a in zip(fields, added, strict=True))]))
        else:
            lines.append(line)
    (root / "proc/stat").write_text("\n".join(lines) + "\n")


# -- every field -------------------------------------------------------------------------------


def test_the_proc_files_parse_to_their_values() -> None:
    source = HostSource(FIXTURE)
    reading = source.read()
    assert source.last_errors() == []
    assert (reading.load1, reading.load5, reading.load15) == (1.23, 0.39, 0.18)
    assert reading.uptime_seconds == 8865.47
    assert reading.memory_total_bytes == 24684084 * KIB
    assert reading.memory_available_bytes == 24177060 * KIB
    assert reading.memory_used_bytes == (24684084 - 24177060) * KIB
    assert (reading.swap_total_bytes, reading.swap_used_bytes) == (0, 0)
    assert (reading.hugepages_total, reading.hugepages_free) == (0, 0)
    assert reading.hugepage_size_bytes == 2048 * KIB
    assert reading.transparent_hugepage == "madvise"
    assert reading.numa_balancing is False
    assert reading.kernel == "6.18.44-fc-v669"


def test_cores_come_from_proc_stat_and_cpufreq() -> None:
    reading = HostSource(FIXTURE).read()
    # The same proc/stat as the constructor's baseline: no tick has passed, nothing to measure.
    assert reading.cpu_utilization_ratio is None
    assert reading.cpus == [
        CpuCoreReading(cpu=0, utilization_ratio=None, frequency_hz=2596140000.0, governor="performance"),
        CpuCoreReading(cpu=1, utilization_ratio=None, frequency_hz=3493110000.0, governor="performance"),
    ]
    assert reading.cpu_governor == "performance"
    assert reading.cpu_frequency_hz == (2596140000.0 + 3493110000.0) / 2


def test_network_leaves_loopback_out() -> None:
    network = HostSource(FIXTURE).read().network
    assert [i.name for i in network] == ["eth0", "ifb0", "ifb1"]
    assert network[0] == NetInterfaceReading(
        name="eth0",
        rx_bytes_total=435778581,
        tx_bytes_total=917486,
        rx_packets_total=12179,
        tx_packets_total=7526,
        rx_errors_total=0,
        tx_errors_total=0,
        rx_dropped_total=0,
        tx_dropped_total=0,
    )


def test_network_is_the_host_inits_namespace_not_the_readers(root: Path) -> None:
    # Under a host root, proc/net/dev is still the reader's own namespace (a pod's eth0 without
    # hostNetwork); proc/1/net/dev is the host's init's, the host's interfaces.
    pod = (root / "proc/net/dev").read_text()
    host = pod.replace("  eth0:", "  eno1:").replace("  ifb0:", "   ib0:").replace("  ifb1:", "   ib1:")
    write(root, "proc/1/net/dev", host)
    source = HostSource(root)
    assert [i.name for i in source.read().network] == ["eno1", "ib0", "ib1"]
    write(root, "proc/1/net/dev", host.replace("   ib1:       0       0", "   ib1:       x       0"))
    assert [i.name for i in source.read().network] == ["eno1", "ib0"]
    assert source.last_errors() == [
        "proc/1/net/dev: ib1: expected numbers, got '" + " ".join(["x"] + ["0"] * 15) + "'"
    ]


def test_disks_are_the_whole_disks_of_sys_block() -> None:
    # diskstats also lists loop0-7 and zram0, which sys/block has too but are not disks.
    assert HostSource(FIXTURE).read().disks == [
        DiskReading(
            name="vda",
            read_bytes_total=7689858 * 512,
            written_bytes_total=5946616 * 512,
            reads_total=183612,
            writes_total=43508,
            io_time_seconds_total=43.304,
        )
    ]


def test_partitions_are_not_disks(root: Path) -> None:
    with (root / "proc/diskstats").open("a") as f:
        f.write(" 254       1 vda1 1200 0 96000 800 300 0 2400 100 0 700 900 0 0 0 0 0 0\n")
    assert [d.name for d in HostSource(root).read().disks] == ["vda"]


def test_infiniband_and_roce_ports() -> None:
    assert HostSource(FIXTURE).read().infiniband == [
        InfinibandPortReading(
            device="mlx5_0",
            port=1,
            link_layer="infiniband",
            state="active",
            physical_state="link_up",
            rate_gbps=400.0,
            link_downed_total=1,
            symbol_error_total=2,
            port_rcv_errors_total=0,
            link_error_recovery_total=0,
            port_xmit_discards_total=14,
            port_rcv_data_bytes_total=1873643912553 * 4,
            port_xmit_data_bytes_total=1880021335990 * 4,
        ),
        InfinibandPortReading(
            device="mlx5_1",
            port=1,
            link_layer="infiniband",
            state="down",
            physical_state="polling",
            rate_gbps=10.0,
            link_downed_total=3,
            symbol_error_total=17,
            port_rcv_errors_total=5,
            link_error_recovery_total=2,
            port_xmit_discards_total=0,
            port_rcv_data_bytes_total=40536221 * 4,
            port_xmit_data_bytes_total=40222107 * 4,
        ),
        InfinibandPortReading(
            device="mlx5_2",
            port=1,
            link_layer="ethernet",
            state="active",
            physical_state="link_up",
            rate_gbps=200.0,
            link_downed_total=0,
            symbol_error_total=0,
            port_rcv_errors_total=0,
            link_error_recovery_total=0,
            port_xmit_discards_total=3,
            port_rcv_data_bytes_total=61133452094 * 4,
            port_xmit_data_bytes_total=3977120556 * 4,
        ),
    ]


def test_pcie_aer_of_every_device_that_has_it() -> None:
    # The guest's six virtio devices have no AER files and are left out.
    assert HostSource(FIXTURE).read().pcie_aer == [
        PcieAerReading("0000:0c:00.0", 0, 0, 0, nvidia_gpu=False),  # ConnectX-7
        PcieAerReading("0000:0d:00.0", 0, 0, 0, nvidia_gpu=False),
        PcieAerReading("0000:17:00.0", 12, 1, 0, nvidia_gpu=False),  # the switch port above a GPU
        PcieAerReading("0000:18:00.0", 3, 0, 0, nvidia_gpu=True),
        PcieAerReading("0000:2a:00.0", 0, 0, 0, nvidia_gpu=True),
        PcieAerReading("0000:9a:00.0", 0, 0, 0, nvidia_gpu=False),
    ]


def test_facts_of_the_tree() -> None:
    facts = HostSource(FIXTURE).facts()
    assert (facts.kernel, facts.os, facts.cpu_model) == (
        "6.18.44-fc-v669",
        "Debian GNU/Linux 12 (bookworm)",
        "AMD EPYC",
    )
    assert facts.cpu_count == 2
    assert facts.memory_total_bytes == 24684084 * KIB
    assert facts.nvidia_gpu_pci_count == 2


# -- utilisation between reads ---------------------------------------------------------------


def test_utilisation_is_the_busy_share_since_the_previous_read(root: Path) -> None:
    source = HostSource(root)  # proc/stat as it is now is the baseline
    # user nice system idle iowait: the node busy 400 of 1000 ticks; cpu0 100 of 500, cpu1 300 of 500.
    advance_stat(
        root, {"cpu": [250, 0, 150, 550, 50], "cpu0": [100, 0, 0, 400], "cpu1": [150, 0, 150, 150, 50]}
    )
    reading = source.read()
    assert reading.cpu_utilization_ratio == 0.4
    assert [c.utilization_ratio for c in reading.cpus] == [0.2, 0.6]
    # The next read measures from this one: cpu1 fully busy, cpu0 idle (iowait counts as idle).
    advance_stat(root, {"cpu": [100, 0, 0, 50, 50], "cpu0": [0, 0, 0, 50, 50], "cpu1": [100]})
    reading = source.read()
    assert reading.cpu_utilization_ratio == 0.5
    assert [c.utilization_ratio for c in reading.cpus] == [0.0, 1.0]
    # No tick since: nothing measured rather than a made-up zero.
    assert source.read().cpu_utilization_ratio is None


def test_guest_time_is_not_counted_twice(root: Path) -> None:
    source = HostSource(root)
    # user 100 (of which guest 100), idle 100: guest time is inside user already.
    advance_stat(root, {"cpu": [100, 0, 0, 100, 0, 0, 0, 0, 100, 0]})
    assert source.read().cpu_utilization_ratio == 0.5


def test_a_core_that_came_online_has_no_utilisation_yet(root: Path) -> None:
    source = HostSource(root)
    text = (root / "proc/stat").read_text()
    write(root, "proc/stat", text.replace("intr", "cpu2 10 0 10 80 0 0 0 0 0 0\nintr", 1))
    reading = source.read()
    assert [(c.cpu, c.utilization_ratio) for c in reading.cpus] == [(0, None), (1, None), (2, None)]
    assert source.read().cpus[2].utilization_ratio is None  # still no tick on cpu2


# -- missing files ---------------------------------------------------------------------------


def test_missing_files_leave_their_fields_unset(root: Path) -> None:
    for relative in (
        "proc/meminfo",
        "proc/loadavg",
        "proc/net/dev",
        "proc/sys/kernel/numa_balancing",
        "sys/kernel/mm/transparent_hugepage/enabled",
        CPUFREQ.format(1) + "/scaling_governor",
        f"{IB}/mlx5_0/ports/1/rate",
        f"{IB}/mlx5_0/ports/1/counters/symbol_error",
        f"{PCI}/0000:18:00.0/aer_dev_fatal",
    ):
        (root / relative).unlink()
    shutil.rmtree(root / f"{IB}/mlx5_2/ports/1/counters")
    source = HostSource(root)
    reading = source.read()
    assert source.last_errors() == []  # a missing file is normal (no IB, no cpufreq): not an error
    assert (reading.memory_total_bytes, reading.memory_used_bytes, reading.hugepages_total) == (None,) * 3
    assert (reading.load1, reading.load15) == (None, None)
    assert (reading.numa_balancing, reading.transparent_hugepage) == (None, None)
    assert reading.network == []
    assert reading.uptime_seconds == 8865.47  # the rest is read as before
    assert [(c.governor, c.frequency_hz) for c in reading.cpus] == [
        ("performance", 2596140000.0),
        ("", 3493110000.0),
    ]
    mlx5_0, _, mlx5_2 = reading.infiniband
    assert (mlx5_0.rate_gbps, mlx5_0.symbol_error_total, mlx5_0.link_downed_total) == (None, None, 1)
    assert mlx5_2.state == "active" and mlx5_2.port_rcv_data_bytes_total is None
    gpu = next(a for a in reading.pcie_aer if a.device == "0000:18:00.0")
    assert (gpu.correctable_total, gpu.fatal_total) == (3, None)


def test_without_cpufreq_the_frequency_is_cpuinfos(root: Path) -> None:
    shutil.rmtree(root / "sys/devices/system/cpu")  # a VM: no cpufreq driver
    reading = HostSource(root).read()
    assert [(c.cpu, c.frequency_hz, c.governor) for c in reading.cpus] == [
        (0, 2596138000.0, ""),
        (1, 2596138000.0, ""),
    ]
    assert reading.cpu_governor is None


def test_no_sys_at_all_keeps_the_proc_readings(root: Path) -> None:
    shutil.rmtree(root / "sys")
    source = HostSource(root)
    reading = source.read()
    assert reading.memory_total_bytes == 24684084 * KIB and reading.load1 == 1.23
    assert (reading.disks, reading.infiniband, reading.pcie_aer) == ([], [], [])
    assert (reading.transparent_hugepage, reading.cpu_governor) == (None, None)
    assert source.last_errors() == []


def test_only_uptime_is_enough_to_read(tmp_path: Path) -> None:
    write(tmp_path, "proc/uptime", "12.5 20.0\n")
    assert HostSource(tmp_path).read().uptime_seconds == 12.5


# -- text no kernel writes -------------------------------------------------------------------

GARBAGE = [
    (
        "proc/meminfo",
        "MemTotal:       lots kB\n",
        "proc/meminfo: MemTotal: 'lots kB' is not a number (of kB)",
    ),
    ("proc/loadavg", "high\n", "proc/loadavg: expected three load averages, got 'high'"),
    ("proc/uptime", "soon\n", "proc/uptime: 'soon' is not a number of seconds"),
    ("proc/sys/kernel/numa_balancing", "yes\n", "proc/sys/kernel/numa_balancing: 'yes' is not a number"),
    (
        "sys/kernel/mm/transparent_hugepage/enabled",
        "always madvise never\n",
        "sys/kernel/mm/transparent_hugepage/enabled: no [selected] choice in 'always madvise never'",
    ),
    (
        f"{IB}/mlx5_0/ports/1/rate",
        "fast\n",
        f"{IB}/mlx5_0/ports/1/rate: expected 'N Gb/sec (...)', got 'fast'",
    ),
    (
        f"{IB}/mlx5_0/ports/1/state",
        "ACTIVE\n",
        f"{IB}/mlx5_0/ports/1/state: expected 'N: NAME', got 'ACTIVE'",
    ),
    (
        f"{IB}/mlx5_0/ports/1/counters/symbol_error",
        "-1\n",
        f"{IB}/mlx5_0/ports/1/counters/symbol_error: '-1' is not a counter",
    ),
    (
        f"{PCI}/0000:18:00.0/aer_dev_correctable",
        "RxErr 0\nTOTAL_ERR_COR many\n",
        f"{PCI}/0000:18:00.0/aer_dev_correctable: TOTAL_ERR_COR: 'many' is not a count",
    ),
    (
        f"{PCI}/0000:18:00.0/aer_dev_nonfatal",
        "Undefined 0\n",
        f"{PCI}/0000:18:00.0/aer_dev_nonfatal: no TOTAL_ERR_NONFATAL line",
    ),
]


@pytest.mark.parametrize(("relative", "text", "message"), GARBAGE, ids=[g[0] for g in GARBAGE])
def test_garbage_leaves_the_field_unset_and_says_which_file(
    root: Path, relative: str, text: str, message: str
) -> None:
    good = HostSource(FIXTURE).read()
    write(root, relative, text)
    source = HostSource(root)
    reading = source.read()
    assert source.last_errors() == [message]
    # Exactly the fields of that file are unset; everything else reads as in the captured tree.
    differ = {
        name
        for name in type(good).__dataclass_fields__
        if name not in ("cpus", "infiniband", "pcie_aer") and getattr(reading, name) != getattr(good, name)
    }
    expected = {
        "proc/meminfo": {
            "memory_total_bytes",
            "memory_used_bytes",
            "memory_available_bytes",
            "swap_total_bytes",
            "swap_used_bytes",
            "hugepages_total",
            "hugepages_free",
            "hugepage_size_bytes",
        },
        "proc/loadavg": {"load1", "load5", "load15"},
        "proc/uptime": {"uptime_seconds"},
        "proc/sys/kernel/numa_balancing": {"numa_balancing"},
        "sys/kernel/mm/transparent_hugepage/enabled": {"transparent_hugepage"},
    }.get(relative, set())
    assert differ == expected
    if relative.startswith(IB):
        port = reading.infiniband[0]
        field = {"rate": "rate_gbps", "state": "state", "symbol_error": "symbol_error_total"}[
            relative.rsplit("/", maxsplit=1)[-1]
        ]
        assert getattr(port, field) in (None, "")
        assert port.port_rcv_data_bytes_total == good.infiniband[0].port_rcv_data_bytes_total
        assert reading.infiniband[1:] == good.infiniband[1:]
    if relative.startswith(PCI):
        gpu = next(a for a in reading.pcie_aer if a.device == "0000:18:00.0")
        assert (gpu.correctable_total is None) == relative.endswith("correctable")
        assert (gpu.nonfatal_total is None) == relative.endswith("nonfatal")


def test_a_bad_cpufreq_file_falls_back_to_cpuinfo_and_says_so(root: Path) -> None:
    write(root, CPUFREQ.format(0) + "/scaling_cur_freq", "2.6 GHz\n")
    source = HostSource(root)
    reading = source.read()
    assert source.last_errors() == [
        f"{CPUFREQ.format(0)}/scaling_cur_freq: '2.6 GHz' is not a frequency in kHz"
    ]
    assert reading.cpus[0].frequency_hz == 2596138000.0  # cpuinfo's "cpu MHz"
    assert reading.cpus[1].frequency_hz == 3493110000.0


def test_a_bad_proc_stat_keeps_the_cores_sysfs_knows(root: Path) -> None:
    good = (root / "proc/stat").read_text()
    source = HostSource(root)
    write(root, "proc/stat", "cpu  a b c d\n")
    reading = source.read()
    assert source.last_errors() == ["proc/stat: cpu: expected numbers, got 'a b c d'"]
    assert reading.cpu_utilization_ratio is None
    assert [(c.cpu, c.utilization_ratio, c.frequency_hz) for c in reading.cpus] == [
        (0, None, 2596140000.0),
        (1, None, 3493110000.0),
    ]
    # The next good read measures from the last good baseline, the constructor's.
    write(root, "proc/stat", good)
    advance_stat(root, {"cpu": [30, 0, 0, 70]})
    assert source.read().cpu_utilization_ratio == 0.3


def test_a_bad_net_dev_line_loses_that_interface_only(root: Path) -> None:
    text = (root / "proc/net/dev").read_text().replace("  ifb1:       0       0", "  ifb1:       x       0")
    write(root, "proc/net/dev", text)
    source = HostSource(root)
    assert [i.name for i in source.read().network] == ["eth0", "ifb0"]
    assert source.last_errors() == [
        "proc/net/dev: ifb1: expected numbers, got '" + " ".join(["x"] + ["0"] * 15) + "'"
    ]


def test_a_bad_diskstats_line_loses_that_disk_only(root: Path) -> None:
    with (root / "proc/diskstats").open("a") as f:
        f.write(" 259       0 nvme0n1 12 0\n")
    (root / "sys/block/nvme0n1").mkdir()
    source = HostSource(root)
    assert [d.name for d in source.read().disks] == ["vda"]
    assert source.last_errors() == ["proc/diskstats: nvme0n1: expected at least 11 counters, got 2"]


def test_the_host_collector_keeps_the_reading_and_names_the_bad_file(root: Path) -> None:
    write(root, "proc/loadavg", "high\n")
    ctx = CollectorContext(gpu=SimNode("n1", gpus=1), host=HostSource(root))
    snapshot = Snapshot(node="n1", time=0.0)
    with pytest.raises(PartialRead, match=r"^proc/loadavg: expected three load averages"):
        HostCollector(ctx).collect(snapshot)
    assert snapshot.host is not None and snapshot.host.load1 is None
    assert snapshot.host.memory_total_bytes == 24684084 * KIB

    healthy = CollectorContext(gpu=SimNode("n1", gpus=1), host=HostSource(FIXTURE))
    HostCollector(healthy).collect(snapshot)  # no problem: no exception
    assert snapshot.host is not None and snapshot.host.load1 == 1.23
