"""The kinds the fake API server holds: group, version, plural, scope, subresources, the field
selectors each accepts and the list fields merged by key in a strategic merge patch."""

from __future__ import annotations

from dataclasses import dataclass, field

_COMMON_FIELDS = ("metadata.name", "metadata.namespace")


@dataclass(frozen=True, slots=True)
class Resource:
    kind: str
    group: str  # "" for the core group
    version: str
    plural: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()  # "status", "eviction"
    field_labels: tuple[str, ...] = ()  # beyond metadata.name / metadata.namespace
    categories: tuple[str, ...] = ()
    # strategic merge: list field path -> merge key ("" for a list of scalars merged as a set)
    merge_keys: dict[tuple[str, ...], str] = field(default_factory=dict)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def fields(self) -> tuple[str, ...]:
        return _COMMON_FIELDS + self.field_labels


_META_KEYS: dict[tuple[str, ...], str] = {
    ("metadata", "ownerReferences"): "uid",
    ("metadata", "finalizers"): "",
}
_POD_SPEC_KEYS: dict[tuple[str, ...], str] = {
    ("containers",): "name",
    ("initContainers",): "name",
    ("volumes",): "name",
    ("containers", "env"): "name",
    ("containers", "ports"): "containerPort",
    ("containers", "volumeMounts"): "mountPath",
}


def _under(prefix: tuple[str, ...], keys: dict[tuple[str, ...], str]) -> dict[tuple[str, ...], str]:
    return {prefix + path: key for path, key in keys.items()}


NODE = Resource(
    "Node",
    "",
    "v1",
    "nodes",
    namespaced=False,
    short_names=("no",),
    subresources=("status",),
    field_labels=("spec.unschedulable",),
    merge_keys={
        **_META_KEYS,
        ("status", "conditions"): "type",
        ("status", "addresses"): "type",
        ("spec", "podCIDRs"): "",
    },
)
POD = Resource(
    "Pod",
    "",
    "v1",
    "pods",
    namespaced=True,
    short_names=("po",),
    subresources=("status", "eviction"),
    field_labels=(
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    categories=("all",),
    merge_keys={**_META_KEYS, ("status", "conditions"): "type", **_under(("spec",), _POD_SPEC_KEYS)},
)
NAMESPACE = Resource(
    "Namespace", "", "v1", "namespaces", namespaced=False, short_names=("ns",), field_labels=("status.phase",)
)
_TEMPLATE = ("spec", "template", "spec")
DAEMON_SET = Resource(
    "DaemonSet",
    "apps",
    "v1",
    "daemonsets",
    namespaced=True,
    short_names=("ds",),
    subresources=("status",),
    categories=("all",),
    merge_keys={**_META_KEYS, ("status", "conditions"): "type", **_under(_TEMPLATE, _POD_SPEC_KEYS)},
)
REPLICA_SET = Resource(
    "ReplicaSet",
    "apps",
    "v1",
    "replicasets",
    namespaced=True,
    short_names=("rs",),
    subresources=("status",),
    categories=("all",),
    merge_keys={**_META_KEYS, ("status", "conditions"): "type", **_under(_TEMPLATE, _POD_SPEC_KEYS)},
)
PDB = Resource(
    "PodDisruptionBudget",
    "policy",
    "v1",
    "poddisruptionbudgets",
    namespaced=True,
    short_names=("pdb",),
    subresources=("status",),
    merge_keys={**_META_KEYS, ("status", "conditions"): "type"},
)
LEASE = Resource("Lease", "coordination.k8s.io", "v1", "leases", namespaced=True, merge_keys=dict(_META_KEYS))

RESOURCES = (NODE, POD, NAMESPACE, DAEMON_SET, REPLICA_SET, PDB, LEASE)
BY_KIND = {r.kind: r for r in RESOURCES}
GROUP_VERSIONS = tuple(dict.fromkeys(r.api_version for r in RESOURCES))


def by_path(api_version: str, plural: str) -> Resource | None:
    for r in RESOURCES:
        if r.api_version == api_version and r.plural == plural:
            return r
    return None


def by_kind(kind: str, api_version: str | None = None) -> Resource:
    r = BY_KIND.get(kind)
    if r is None or (api_version is not None and r.api_version != api_version):
        where = f" in {api_version}" if api_version else ""
        raise ValueError(f"the fake API server holds no kind {kind!r}{where}")
    return r
