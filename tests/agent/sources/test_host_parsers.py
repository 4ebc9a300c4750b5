"""The host parsers on the variants real kernels write that the captured tree does not show."""

from __future__ import annotations

import pytest

from agent.sources.linux.proc import (
    CpuTimes,
    parse_bracketed,
    parse_meminfo,
    parse_net_dev,
    parse_numa_balancing,
    parse_stat,
    utilization,
)
from agent.sources.linux.sysfs import natural_key, parse_ib_phys_state, parse_ib_rate, parse_ib_state

NET_DEV_HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|"
    "bytes    packets errs drop fifo colls carrier compressed\n"
)


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("5: LinkUp\n", "link_up"),
        ("2: Polling\n", "polling"),
        ("3: Disabled\n", "disabled"),
        ("4: PortConfigurationTraining\n", "port_configuration_training"),
        ("6: LinkErrorRecovery\n", "link_error_recovery"),
        ("7: Phy Test\n", "phy_test"),
    ],
)
def test_physical_states_as_snake_case(text: str, state: str) -> None:
    assert parse_ib_phys_state(text) == state


@pytest.mark.parametrize(
    ("text", "state"),
    [("4: ACTIVE\n", "active"), ("1: DOWN\n", "down"), ("5: ACTIVE_DEFER\n", "active_defer")],
)
def test_port_states_in_lower_case(text: str, state: str) -> None:
    assert parse_ib_state(text) == state


@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("400 Gb/sec (4X NDR)\n", 400.0),
        ("200 Gb/sec (2X NDR)\n", 200.0),
        ("2.5 Gb/sec (1X SDR)\n", 2.5),
        ("100 Gb/sec (4X EDR)\n", 100.0),
    ],
)
def test_rates(text: str, gbps: float) -> None:
    assert parse_ib_rate(text) == gbps


def test_hca_names_sort_by_number() -> None:
    names = ["mlx5_10", "mlx5_2", "mlx5_1", "mlx5_bond_0", "ibp24s0"]
    assert sorted(names, key=natural_key) == ["ibp24s0", "mlx5_1", "mlx5_2", "mlx5_10", "mlx5_bond_0"]


def test_the_selected_choice() -> None:
    assert parse_bracketed("[always] madvise never\n") == "always"
    assert parse_bracketed("always defer defer+madvise [madvise] never\n") == "madvise"
    with pytest.raises(ValueError, match="no \\[selected\\] choice"):
        parse_bracketed("[]\n")


@pytest.mark.parametrize(("text", "on"), [("0\n", False), ("1\n", True), ("2\n", True), ("3\n", True)])
def test_numa_balancing_modes(text: str, on: bool) -> None:
    assert parse_numa_balancing(text) is on


def test_meminfo_checks_only_the_keys_asked_for() -> None:
    text = "MemTotal:       1000 kB\nNewThing:       a lot\nHugePages_Total:       4\n"
    assert parse_meminfo(text, ("MemTotal", "HugePages_Total")) == {"MemTotal": 1024000, "HugePages_Total": 4}
    with pytest.raises(ValueError, match="NewThing"):
        parse_meminfo(text, ("NewThing",))


def test_net_dev_counters_can_run_into_the_colon() -> None:
    line = " eth0:1234567890123 9 0 0 0 0 0 0 987654321 8 0 1 0 0 0 0\n"
    (eth0,), problems = parse_net_dev(NET_DEV_HEADER + line)
    assert problems == []
    assert (eth0.name, eth0.rx_bytes, eth0.rx_packets, eth0.tx_bytes, eth0.tx_dropped) == (
        "eth0",
        1234567890123,
        9,
        987654321,
        1,
    )


def test_stat_needs_the_total_line_and_four_counters() -> None:
    with pytest.raises(ValueError, match="no 'cpu' line"):
        parse_stat("cpu0 1 2 3 4\n")
    with pytest.raises(ValueError, match="at least 4 counters"):
        parse_stat("cpu  1 2 3\n")
    # Kernels before 2.6.33 wrote fewer columns: still enough.
    assert parse_stat("cpu  10 0 10 80\n")["cpu"] == CpuTimes(busy=20, total=100)


def test_utilisation_of_counters_that_went_back_is_unknown() -> None:
    assert utilization(CpuTimes(50, 100), CpuTimes(10, 20)) is None
    assert utilization(CpuTimes(50, 100), CpuTimes(50, 100)) is None
    assert utilization(CpuTimes(50, 100), CpuTimes(75, 150)) == 0.5
