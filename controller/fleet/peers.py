"""Peer groups of nodes: the key detect/probe_outlier.py compares node-level results by (the GPU
model and the node's GPU count), shared with the breaker (controller/remediate/)."""

from __future__ import annotations

from collections import Counter

from controller.fleet.model import Fleet, NodeState


def node_peer_key(node: NodeState) -> tuple[str, str]:
    """(GPU model, GPU count): nodes whose node-level probe results are compared with each other."""
    return (node.gpu_model, str(len(node.hello.inventory.gpus)))


def node_group(node: NodeState) -> str:
    """The peer group as one name, e.g. "NVIDIA H100 80GB HBM3 x8"."""
    model, count = node_peer_key(node)
    return f"{model or 'unknown'} x{count}"


def group_sizes(fleet: Fleet) -> dict[str, int]:
    """Nodes per peer group in the fleet now."""
    return dict(Counter(node_group(n) for n in fleet.nodes.values()))
