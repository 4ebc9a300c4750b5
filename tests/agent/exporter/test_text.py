"""The page writer against prometheus_client's own exposition of the same families.

Exporter.render writes the page itself (agent.exporter.text); Exporter.collect is the Collector
contract. Both must say the same thing, byte for byte, including for label values that need
escaping and values that need Go's float formatting.
"""

from __future__ import annotations

import re

import pytest
from prometheus_client.exposition import generate_latest

from agent.exporter import Exporter
from tests.agent.exporter.simnode import build

# A node name with every character the text format escapes in a label value.
AWKWARD_NODE = 'rack "7"\\slot\nb'


def _bare_dcgm_counters(page: bytes, exporter: Exporter) -> bytes:
    """generate_latest names a counter's HELP and TYPE NAME_total; dcgm-exporter's have no _total."""
    for spec in exporter.catalogue.dcgm:
        if spec.type == "counter":
            for kind in (b"HELP", b"TYPE"):
                page = page.replace(
                    b"# %s %s_total " % (kind, spec.name.encode()), b"# %s %s " % (kind, spec.name.encode())
                )
    return page


@pytest.mark.parametrize("dcgm_compat", [False, True])
@pytest.mark.parametrize("node", ["sim-node-1", AWKWARD_NODE])
def test_the_written_page_is_what_prometheus_client_writes(node: str, dcgm_compat: bool) -> None:
    sim = build(node=node, seed=7, dcgm_compat=dcgm_compat, faults=["thermal_throttle:1"])
    try:
        sim.sample()
        sim.run_probes()
        snapshot = sim.sample()
        for gpu in snapshot.gpus[:2]:  # large, tiny and integral values exercise Go's float format
            gpu.energy_joules_total = 123456789012.5
            gpu.power_watts = 1e-7
        sim.exporter.observe(snapshot)
        ours = sim.exporter.render()
        theirs = generate_latest(sim.exporter.registry)
        if dcgm_compat:
            theirs = _bare_dcgm_counters(theirs, sim.exporter)
        assert ours == theirs
        if node == AWKWARD_NODE:
            assert b'node="rack \\"7\\"\\\\slot\\nb"' in ours
        assert re.search(rb"e\+\d\d\n", ours), "a value in exponent form was exercised"
    finally:
        sim.close()
