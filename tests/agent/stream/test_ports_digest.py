"""HostSample.infiniband_digest: the agent's digest of its InfiniBand ports, which lets the controller
skip reading ten or so ports a host while they stay put. It must change with anything the controller
reads of a port (its names, state, rate and error totals) or with a port gone, added or moved, and
not with what it does not read (traffic, discards)."""

from __future__ import annotations

import dataclasses

from agent.snapshot import Snapshot
from agent.sources.host import HostReading, InfinibandPortReading
from agent.stream import frames

PORTS = [
    InfinibandPortReading(
        f"mlx5_{n}", 1, "infiniband", "active", "link_up", 400.0, 1, 0, 0, 2, 9, 10**15, 10**15
    )
    for n in range(8)
]
READ = (
    "device",
    "port",
    "link_layer",
    "state",
    "physical_state",
    "rate_gbps",
    "link_downed_total",
    "symbol_error_total",
    "port_rcv_errors_total",
    "link_error_recovery_total",
)


def changed(port: InfinibandPortReading, name: str) -> InfinibandPortReading:
    value = getattr(port, name)
    new = dataclasses.replace(port)
    setattr(new, name, value + "x" if isinstance(value, str) else (value or 0) + 1)
    return new


def test_it_changes_with_whatever_the_controller_reads_and_not_with_traffic() -> None:
    base = frames.infiniband_digest(PORTS)
    assert base != 0 and frames.infiniband_digest(list(PORTS)) == base
    for n in (0, 5, 7):
        for name in READ:
            ports = list(PORTS)
            ports[n] = changed(PORTS[n], name)
            assert frames.infiniband_digest(ports) != base, (n, name)
    # An unread rate is not a rate of 0; an unread total reads as 0, as the controller reads it.
    unread = [dataclasses.replace(PORTS[0], rate_gbps=None), *PORTS[1:]]
    zero = [dataclasses.replace(PORTS[0], rate_gbps=0.0), *PORTS[1:]]
    assert len({base, frames.infiniband_digest(unread), frames.infiniband_digest(zero)}) == 3
    counted = [dataclasses.replace(PORTS[0], symbol_error_total=None), *PORTS[1:]]
    assert frames.infiniband_digest(counted) == base  # PORTS[0] counts 0 symbol errors
    assert frames.infiniband_digest(PORTS[:-1]) != base  # a port gone
    assert frames.infiniband_digest(PORTS[1:] + PORTS[:1]) != base  # listed in another order
    busy = [
        dataclasses.replace(
            p, port_rcv_data_bytes_total=5, port_xmit_data_bytes_total=7, port_xmit_discards_total=99
        )
        for p in PORTS
    ]
    assert frames.infiniband_digest(busy) == base  # traffic and discards: not read
    # The strings are delimited: moving a character from one to the next is a change.
    a = [dataclasses.replace(PORTS[0], device="mlx5_0", link_layer="infiniband")]
    b = [dataclasses.replace(PORTS[0], device="mlx5_0i", link_layer="nfiniband")]
    assert frames.infiniband_digest(a) != frames.infiniband_digest(b)


def test_a_frame_carries_it_for_a_host_with_ports_only() -> None:
    with_ports = frames.frame(
        Snapshot("n1", 1_800_000_000.0, host=HostReading(infiniband=list(PORTS))), "b", 1
    )
    assert with_ports.host.infiniband_digest == frames.infiniband_digest(PORTS)
    assert len(with_ports.host.infiniband) == len(PORTS)  # the ports still go, whole
    assert with_ports.host.infiniband[3].port_rcv_data_bytes_total == 10**15
    without = frames.frame(Snapshot("n1", 1_800_000_000.0, host=HostReading()), "b", 1)
    assert not without.host.HasField("infiniband_digest")
