"""A small fake kube-apiserver (stdlib only) for the tests and `gpufleet demo --kubernetes fake`:
nodes (with /status), pods (graceful deletion, eviction under PodDisruptionBudgets), DaemonSets,
ReplicaSets, leases and namespaces, with the discovery documents kubectl needs."""

from controller.kube.fake.server import FakeApiServer

__all__ = ["FakeApiServer"]
