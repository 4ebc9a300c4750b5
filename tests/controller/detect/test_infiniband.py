"""InfiniBand ports down, slow or erroring, against the peer group's same port (or the node's own
ports, alone): simulated nodes with hosts through the real wire (hostsim.py), and crafted counters."""

from __future__ import annotations

from agent.sources.sim import FaultSpec
from controller.config import DetectConfig
from controller.detect.infiniband_ports import PeerRates, Port, PortPeers, read_ports
from controller.fleet.finding import Finding
from controller.fleet.model import NodeState
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.detect.hostsim import HostSimFleet, digested


def ib(fleet: HostSimFleet, config: DetectConfig | None = None) -> dict[str, Finding]:
    findings = fleet.detect("infiniband", config)
    assert all(f.cause == "ib_link_degraded" and f.gpu is None for f in findings)
    return {f.node: f for f in findings}


def test_a_port_down_is_critical_with_its_device_and_port_and_clears_when_repaired() -> None:
    fleet = HostSimFleet(8, {"node-02": [FaultSpec.parse("ib_port_down:mlx5_1")]})
    fleet.run(30)
    findings = ib(fleet)
    assert list(findings) == ["node-02"]
    f = findings["node-02"]
    assert (f.severity, f.detectors, f.supporting) == ("critical", ["infiniband"], [])
    assert f.evidence.metric == "infiniband.state"
    assert f.evidence.reasons == ("mlx5_1/1", "down", "polling")
    assert (f.evidence.peers, f.evidence.baseline_source) == (7, "peers")
    assert f.summary == "mlx5_1/1 down (polling), active on 7 of 7 peers"
    fleet.add("node-02", [])
    fleet.run(20)
    assert ib(fleet) == {}


def test_a_degraded_port_shows_its_rate_against_peers_and_its_error_rates() -> None:
    fleet = HostSimFleet(8, {"node-05": [FaultSpec.parse("ib_port_degraded:mlx5_0")]})
    fleet.run(40)  # under a minute of counter readings: the rate alone so far
    early = ib(fleet)["node-05"]
    assert [e.metric for e in (early.evidence, *early.supporting)] == ["infiniband.rate_gbps"]
    fleet.run(300)
    f = ib(fleet)["node-05"]
    assert f.severity == "warning"
    rate = f.evidence
    assert (rate.value, rate.baseline, rate.deviation, rate.unit) == (200.0, 400.0, -0.5, "Gb/s")
    assert (rate.reasons[0], rate.baseline_source, rate.peers) == ("mlx5_0/1", "peers", 7)
    assert rate.detail == "mlx5_0/1 at 200 Gb/s, peers 400"
    counters = {e.metric: e for e in f.supporting}
    symbols = counters["infiniband.symbol_error_total"]
    assert symbols.reasons == ("mlx5_0/1", "symbol_error_total") and symbols.unit == "/min"
    assert symbols.value is not None and 20 < symbols.value < 80  # the sim's 0.8 per second
    assert "symbol errors/min" in symbols.detail and symbols.baseline_source == "expected"
    assert f.summary.startswith("mlx5_0/1 at 200 Gb/s, peers 400; mlx5_0/1: ")
    fleet.add("node-05", [])  # a new cable: full rate, and the counters stop climbing
    fleet.run(20)
    assert ib(fleet) == {}


def test_a_port_down_across_the_group_is_unused_not_a_fault() -> None:
    fleet = HostSimFleet(6)
    for i, (_, host, _) in enumerate(fleet.sims.values()):
        if i < 4:  # most of the group never cabled mlx5_9
            host.condition.down_ib_ports.add("mlx5_9")
    fleet.run(30)
    assert ib(fleet) == {}


def test_a_node_alone_is_held_to_its_own_ports() -> None:
    down = HostSimFleet(1, {"node-00": [FaultSpec.parse("ib_port_down:mlx5_3")]})
    down.run(20)
    f = ib(down)["node-00"]
    assert f.evidence.reasons[0] == "mlx5_3/1" and f.evidence.baseline_source == "expected"
    assert "the node's other 7 infiniband ports active" in f.evidence.detail
    slow = HostSimFleet(1, {"node-00": [FaultSpec.parse("ib_port_degraded:mlx5_6")]})
    slow.run(20)
    rate = ib(slow)["node-00"].evidence
    assert (rate.reasons[0], rate.value, rate.baseline) == ("mlx5_6/1", 200.0, 400.0)
    assert rate.detail == "mlx5_6/1 at 200 Gb/s, the node's other ports 400"
    healthy = HostSimFleet(1)
    healthy.run(20)
    assert ib(healthy) == {}


def bump(node: NodeState, time: float, counter: str, by: int, device: str = "mlx5_2") -> None:
    """The node's latest host reading again at `time`, with one counter of `device` raised."""
    assert node.host is not None
    host = type(node.host)()
    host.CopyFrom(node.host)
    for port in host.infiniband:
        if port.device == device:
            setattr(port, counter, getattr(port, counter) + by)
    node.host, node.host_time = digested(host), time
    node.trends.observe_host(host, time)


def test_error_counters_rising_at_full_rate_are_found_above_the_threshold() -> None:
    fleet = HostSimFleet(4)
    fleet.run(10)
    node, start = fleet.fleet.nodes["node-01"], fleet.now
    for minute in range(1, 6):  # two symbol errors a minute
        bump(node, start + 60 * minute, "symbol_error_total", 2)
    f = ib(fleet)["node-01"]
    assert f.severity == "warning" and f.supporting == []
    assert (f.evidence.metric, f.evidence.value, f.evidence.baseline) == (
        "infiniband.symbol_error_total",
        2.0,
        1.0,
    )
    assert f.evidence.detail == "mlx5_2/1: 2 symbol errors/min over 300 s"
    assert ib(fleet, DetectConfig(ib_errors_per_minute=3.0)) == {}


def test_error_counters_need_a_minute_of_readings() -> None:
    fleet = HostSimFleet(4)
    fleet.run(10)
    node, start = fleet.fleet.nodes["node-01"], fleet.now
    bump(node, start + 20, "link_error_recovery_total", 5)  # a burst right after the first reading
    assert ib(fleet) == {}
    bump(node, start + 70, "link_error_recovery_total", 0)
    assert ib(fleet)["node-01"].evidence.metric == "infiniband.link_error_recovery_total"


def test_a_flapping_link_is_found_and_one_link_down_is_not() -> None:
    fleet = HostSimFleet(4)
    fleet.run(10)
    node, start = fleet.fleet.nodes["node-03"], fleet.now
    bump(node, start + 60, "link_downed_total", 1)
    assert ib(fleet) == {}  # one link-down (a switch reboot, a re-seat): no finding
    bump(node, start + 120, "link_downed_total", 1)
    f = ib(fleet)["node-03"]
    assert (f.evidence.metric, f.evidence.value) == ("infiniband.link_downed_total", 2.0)
    assert f.evidence.detail == "mlx5_2/1: link went down 2 times in 120 s"


def port(**fields: object) -> Port:
    """mlx5_0/1 as a host reporting it alone is read."""
    host = pb.HostSample()
    host.infiniband.add(device="mlx5_0", port=1, **fields)
    (read,) = read_ports(host)
    return read


def test_a_ports_peers_are_the_group_less_the_port_itself() -> None:
    """The group's ports are gathered once per pass; each port's peers are that less itself."""
    up = [port(state="active", rate_gbps=r) for r in (400, 200, 400)]
    down = port(state="down")
    peers = PortPeers(total=4, active=3, rates=[200.0, 400.0, 400.0])
    assert peers.without(up[1]) == (3, 2, PeerRates(400.0, 2))  # the slow one sees two 400s
    assert peers.without(up[0]) == (3, 2, PeerRates(300.0, 2))  # one of two equal rates goes
    assert peers.without(down) == (3, 3, PeerRates(400.0, 3))
    assert PortPeers(total=1, active=1, rates=[400.0]).without(up[0])[2] == PeerRates(None, 0)
    assert peers.rates == [200.0, 400.0, 400.0]  # unchanged
