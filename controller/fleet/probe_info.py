"""What a node says about its probes: the ProbeInfos of its Hello. Pure.

The controller knows no probe kind by name: whether a probe is node-level (scheduled on the node as a
whole), which way is better (compared with peers) and its unit (shown) come from the ProbeInfo the
agent sent, declared once in the probe's file under agent/probes/. A probe kind the controller has
never heard of is scheduled, stored, shown and compared like the others.
"""

from __future__ import annotations

from protos.gpufleet.v1 import telemetry_pb2 as pb

# Agents older than ProbeInfo name their probes only (Hello.probes). Their one node-level probe was
# nccl, and all of their probes were higher-is-better: this is what they would have declared.
LEGACY_NODE_LEVEL = frozenset({"nccl"})


def probe_infos(hello: pb.Hello) -> dict[str, pb.ProbeInfo]:
    """The node's offered probes by name, with their facts (in the Hello's order). A name in
    `probes` without a ProbeInfo (an older agent) gets the facts such agents had: higher is better,
    per GPU except nccl."""
    out = {i.name: i for i in hello.probe_infos if i.name}
    for name in hello.probes:
        if name not in out:
            out[name] = pb.ProbeInfo(name=name, higher_is_better=True, node_level=name in LEGACY_NODE_LEVEL)
    return out


def same_probe_facts(before: pb.Hello, after: pb.Hello) -> bool:
    """Whether two Hellos of a node say the same of everything the probe results' readers read from
    one (the GPUs of its inventory: their models, indices and count; its probes and their facts), as
    an agent restarted or reconnected on an unchanged machine does: what was worked out from the
    results (fleet/derived.py) then stands. The whole inventory is compared, not only what the
    readers read, so any change of it counts."""
    return (
        before.inventory == after.inventory
        and before.probe_infos == after.probe_infos
        and before.probes == after.probes
    )


def node_level_probes(hello: pb.Hello) -> frozenset[str]:
    """The node's probes that give one result per node, using every GPU at once."""
    return frozenset(name for name, info in probe_infos(hello).items() if info.node_level)


def higher_is_better(hello: pb.Hello, probe: str) -> bool:
    """Which way `probe` is better on this node; a probe the node never described: higher."""
    info = probe_infos(hello).get(probe)
    return True if info is None else info.higher_is_better


def unit_of(hello: pb.Hello, probe: str) -> str:
    info = probe_infos(hello).get(probe)
    return "" if info is None else info.unit
