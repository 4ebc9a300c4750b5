"""Network faults: an InfiniBand port of the compute fabric down or degraded. Each changes the
simulated host's condition (sim/host.py), whose port model turns it into state, rate and counters."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from agent.sources.sim.faults.registry import Target, pick, register
from agent.sources.sim.host_profile import DGX_H100_HOST

if TYPE_CHECKING:
    from agent.sources.sim.host import SimHost

PORT = Target("PORT", tuple(nic.device for nic in DGX_H100_HOST.compute))


def _port(host: SimHost, target: str | None, rng: random.Random, fault: str) -> str:
    ports = tuple(nic.device for nic in host.profile.compute)
    port = pick(target, ports, rng)
    if port not in ports:
        raise ValueError(f"fault {fault}: no compute port {port!r} on this host ({', '.join(ports)})")
    return port


@register(
    "ib_port_down",
    "network",
    cause="ib_link_degraded",
    description="an InfiniBand compute port down (state down, polling): no traffic, link-downed counted",
    shows_in=(
        "infiniband.state",
        "infiniband.physical_state",
        "infiniband.rate_gbps",
        "infiniband.link_downed_total",
    ),
    target=PORT,
)
def _ib_port_down(host: SimHost, target: str | None, rng: random.Random) -> None:
    host.condition.down_ib_ports.add(_port(host, target, rng, "ib_port_down"))


@register(
    "ib_port_degraded",
    "network",
    cause="ib_link_degraded",
    description="an InfiniBand compute port up at half rate, symbol errors and link recoveries rising",
    shows_in=(
        "infiniband.rate_gbps",
        "infiniband.symbol_error_total",
        "infiniband.link_error_recovery_total",
        "infiniband.link_downed_total",
    ),
    target=PORT,
)
def _ib_port_degraded(host: SimHost, target: str | None, rng: random.Random) -> None:
    host.condition.degraded_ib_ports.add(_port(host, target, rng, "ib_port_degraded"))
