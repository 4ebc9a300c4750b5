"""The infiniband detector judges each distinct port set of a peer group once, from ports read once
per host sample (controller/detect/infiniband_ports.py): its verdicts must be the ones of judging
every node's every port against all its peers one by one."""

from __future__ import annotations

import random
import statistics

import pytest

from controller.detect import infiniband_ports
from controller.detect.infiniband import RATE_TOLERANCE
from controller.fleet.model import NodeState
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.detect.hostsim import HostSimFleet, digested


def replace_host(node: NodeState, change: dict[str, dict[str, object]]) -> None:
    """A new host sample for the node: its latest with the named devices' ports changed."""
    assert node.host is not None
    host = pb.HostSample()
    host.CopyFrom(node.host)
    for port in host.infiniband:
        for attribute, value in change.get(port.device, {}).items():
            if value is None:
                assert attribute == "rate_gbps"
                port.ClearField("rate_gbps")
            else:
                setattr(port, attribute, value)
    node.host = digested(host)


def host_of(holder: NodeState | pb.HostSample | None) -> pb.HostSample:
    sample = holder.host if isinstance(holder, NodeState) else holder
    assert sample is not None
    return sample


def one_by_one(fleet: HostSimFleet) -> dict[str, list[tuple[str, tuple[str, ...], str]]]:
    """node -> (metric, reasons, detail) of each bad port by state, every port against every peer."""
    nodes = list(fleet.fleet.nodes.values())

    def ports(node: NodeState) -> dict[tuple[str, int], pb.InfinibandPortSample]:
        assert node.host is not None
        return {(p.device, p.port): p for p in node.host.infiniband}

    def up(p: pb.InfinibandPortSample) -> bool:
        return p.state == "active" and p.physical_state in ("link_up", "")

    out: dict[str, list[tuple[str, tuple[str, ...], str]]] = {}
    for node in nodes:
        bad: list[tuple[str, tuple[str, ...], str]] = []
        for key, port in sorted(ports(node).items()):
            peers = [ports(n)[key] for n in nodes if n is not node and key in ports(n)]
            active = [p for p in peers if up(p)]
            name = f"{port.device}/{port.port}"
            if not up(port):
                if 2 * len(active) > len(peers):
                    state = f"{port.state or 'unknown'} ({port.physical_state or 'unknown'})"
                    detail = f"{name} {state}, active on {len(active)} of {len(peers)} peers"
                    bad.append(("infiniband.state", (name, port.state, port.physical_state), detail))
                continue
            rates = [p.rate_gbps for p in active if p.HasField("rate_gbps")]
            if port.HasField("rate_gbps") and rates:
                usual = statistics.median(rates)
                if port.rate_gbps < RATE_TOLERANCE * usual:
                    detail = f"{name} at {port.rate_gbps:g} Gb/s, peers {usual:g}"
                    bad.append(("infiniband.rate_gbps", (name, "rate_below_usual"), detail))
        if bad:
            bad.sort(key=lambda b: b[0] != "infiniband.state")  # down ports (critical) first
            out[node.name] = bad
    return out


@pytest.mark.parametrize("seed", range(1, 9))
def test_each_distinct_port_set_judged_once_reads_as_every_port_judged_against_every_peer(seed: int) -> None:
    fleet = HostSimFleet(16)
    fleet.run(20)
    draw = random.Random(seed)
    devices = sorted({p.device for p in fleet.fleet.nodes["node-00"].host.infiniband})  # type: ignore[union-attr]
    variants: list[dict[str, object]] = [
        {"state": "down", "physical_state": "disabled"},
        {"state": "active", "physical_state": "polling"},
        {"rate_gbps": 200.0},
        {"rate_gbps": 100.0},
        {"rate_gbps": None},
        {"state": "init"},
    ]
    # A few shared shapes (nodes alike share a port set) and some of their own; one device down on
    # most nodes (unused, not a fault) and one at a lower rate on half of them (the median moves).
    shapes = [{draw.choice(devices): draw.choice(variants)} for _ in range(3)]
    for i, node in enumerate(fleet.fleet.nodes.values()):
        change: dict[str, dict[str, object]] = {devices[-1]: {"state": "down"}} if i % 8 else {}
        if i % 2:
            change.setdefault(devices[0], {})["rate_gbps"] = 200.0
        if draw.random() < 0.5:
            for device, what in draw.choice(shapes).items():
                change.setdefault(device, {}).update(what)
        replace_host(node, change)
    expected = one_by_one(fleet)
    assert expected, "the case must hold bad ports"
    found = {
        f.node: [(e.metric, e.reasons, e.detail) for e in (f.evidence, *f.supporting)]
        for f in fleet.detect("infiniband")
    }
    assert found == expected


def test_ports_are_read_again_only_from_a_new_host_sample_and_a_forgotten_node_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet = HostSimFleet(4)
    fleet.run(20)
    assert fleet.detect("infiniband") == []
    read: list[pb.HostSample | None] = []
    real = infiniband_ports.read_ports

    def counted(host: pb.HostSample | None) -> infiniband_ports.Ports:
        read.append(host)
        return real(host)

    monkeypatch.setattr(infiniband_ports, "read_ports", counted)
    assert fleet.detect("infiniband") == []
    assert read == []  # no host sample is new
    node = fleet.fleet.nodes["node-02"]
    replace_host(node, {"mlx5_1": {"state": "down", "physical_state": "disabled"}})
    [finding] = fleet.detect("infiniband")
    assert (finding.node, finding.severity, finding.evidence.reasons[0]) == (
        "node-02",
        "critical",
        "mlx5_1/1",
    )
    assert read == [node.host]
    del fleet.fleet.nodes["node-02"]
    assert fleet.detect("infiniband") == []
    _, kept = fleet.fleet.derived[infiniband_ports.KEPT]
    assert sorted(kept) == ["node-00", "node-01", "node-03"]  # type: ignore[call-overload]


def test_a_new_host_sample_is_read_only_when_its_ports_digest_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet = HostSimFleet(4)
    fleet.run(20)
    assert fleet.detect("infiniband") == []
    read: list[str] = []
    real = infiniband_ports.read_ports

    def counted(host: pb.HostSample | None) -> infiniband_ports.Ports:
        read.append(next(n.name for n in fleet.fleet.nodes.values() if n.host is host))
        return real(host)

    monkeypatch.setattr(infiniband_ports, "read_ports", counted)
    before = {n.name: host_of(n) for n in fleet.fleet.nodes.values()}
    fleet.run(20)  # every node's next frames: new host samples, the ports' state and errors as they were
    for node in fleet.fleet.nodes.values():
        assert node.host is not before[node.name]
        assert host_of(node).infiniband_digest == host_of(before[node.name]).infiniband_digest != 0
    assert fleet.detect("infiniband") == [] and read == []
    # The agent's digest is what says so: a new sample sent under the same digest is the same ports.
    node = fleet.fleet.nodes["node-02"]
    digest = host_of(node).infiniband_digest
    replace_host(node, {"mlx5_1": {"state": "down", "physical_state": "disabled"}})
    host_of(node).infiniband_digest = digest
    assert fleet.detect("infiniband") == [] and read == []
    replace_host(node, {})  # the digest of the ports as they now read: read
    [finding] = fleet.detect("infiniband")
    assert (finding.node, finding.evidence.reasons[0]) == ("node-02", "mlx5_1/1") and read == ["node-02"]
    old = pb.HostSample()  # an older agent's sample, without a digest: read each time
    old.CopyFrom(host_of(node))
    old.ClearField("infiniband_digest")
    node.host = old
    assert len(fleet.detect("infiniband")) == 1 and read == ["node-02", "node-02"]


def test_equal_port_states_read_from_different_samples_are_one_port() -> None:
    """A fleet reports a handful of distinct port states: each is built once and read again as the
    same object (equal port sets then count together by identity), a port listed twice reads as its
    last, and any state that differs is a port of its own."""

    def port(
        number: int = 1, state: str = "active", rate: float | None = 400.0, errors: int = 0
    ) -> pb.InfinibandPortSample:
        sample = pb.InfinibandPortSample(
            device="mlx5_0", port=number, state=state, physical_state="link_up", link_layer="infiniband"
        )
        sample.symbol_error_total = errors
        if rate is not None:
            sample.rate_gbps = rate
        return sample

    def read(*ports: pb.InfinibandPortSample) -> infiniband_ports.Ports:
        return infiniband_ports.read_ports(pb.HostSample(infiniband=list(ports)))

    a, b = read(port(errors=3)), read(port(errors=9))
    assert a[0] is b[0] and a[0].up and a[0].rate == 400.0 and a[0].group == "ib.mlx5_0/1"
    [slower], [unrated] = read(port(rate=200.0)), read(port(rate=None))
    assert slower.rate == 200.0 and unrated.rate is None and slower is not a[0]
    [last] = read(port(), port(state="down"))
    assert last.state == "down" and not last.up
    assert [p.key for p in read(port(2), port(1))] == [("mlx5_0", 1), ("mlx5_0", 2)]
