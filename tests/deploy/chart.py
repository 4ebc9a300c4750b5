"""What the Helm chart's tests share (tests/deploy/test_chart_*.py): Helm itself, the chart rendered
with a value set (cached), and the rendered objects' parts the tests read.

Helm is the one `make test` installs (tests/install-helm.sh, into the venv's bin); without it the
tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.support import require

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpufleet"
DASHBOARDS = ROOT / "dashboards"
INSTALL_HELM = ROOT / "tests" / "install-helm.sh"
CRD_SCHEMAS = [Path(__file__).with_name(f"{n}-crd-schemas.json") for n in ("monitoring", "cert-manager")]

KUBE_VERSION = "1.35.0"  # a current Kubernetes, for `helm template` and kubernetes-validate alike
OLDEST_KUBE_VERSION = "1.28.0"  # Chart.yaml's kubeVersion
RELEASE, NAMESPACE = "gf", "gpufleet"
FULLNAME = f"{RELEASE}-gpufleet"
VALUE_SETS = ["default", *sorted(p.name.removesuffix("-values.yaml") for p in CHART.glob("ci/*-values.yaml"))]
# The Prometheus Operator's kinds: CRDs, for which kubernetes-validate has no schema.
MONITORING_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
CUSTOM_KINDS = {
    **dict.fromkeys(MONITORING_KINDS, "monitoring.coreos.com/v1"),
    "Certificate": "cert-manager.io/v1",
}
# The chart renders nothing without the controller's and the agents' certificates (or plaintext,
# chosen): "default" is its defaults plus these two Secrets.
TLS_SECRETS = ["--set", "tls.controllerSecret=gf-controller-tls", "--set", "tls.agentSecret=gf-agent-tls"]
TLS_DIR = "/var/run/secrets/gpufleet/tls"
UNHEALTHY_TAINT = {"key": "gpufleet.io/unhealthy", "effect": "NoSchedule"}
SQLITE_REPLICAS = (
    "controller.replicas > 1 needs postgresql.url or postgresql.existingSecret:"
    " an SQLite file cannot be shared by several controllers"
)
SQLITE_REPLICA_INGEST = (
    "controller.replicaIngest needs postgresql.url or postgresql.existingSecret:"
    " the replicas record in the shared store which of them owns each node"
)
# controller.replicaIngest: the agents' Service, every controller pod's gRPC port.
AGENTS_SERVICE = f"{FULLNAME}-controller-agents"

Doc = dict[str, Any]


def helm_binary() -> str | None:
    """The Helm `make test` installs beside this interpreter, else one on PATH."""
    installed = Path(sys.prefix) / "bin" / "helm"
    return str(installed) if os.access(installed, os.X_OK) else shutil.which("helm")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    binary = helm_binary()
    require(binary is not None, "helm missing: `make helm` installs it (tests/install-helm.sh)")
    assert binary is not None
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120, check=False)


def values_args(value_set: str) -> list[str]:
    return (
        TLS_SECRETS
        if value_set == "default"
        else ["--values", str(CHART / "ci" / f"{value_set}-values.yaml")]
    )


@cache
def template(*args: str, kube: str = KUBE_VERSION) -> str:
    """`helm template` of the chart with `args`; fails the test with Helm's message if it fails."""
    done = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def kubernetes_validate(manifests: str, kube: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`kubernetes-validate --strict` of `manifests` against Kubernetes `kube`'s schemas."""
    path = tmp_path / "manifests.yaml"
    path.write_text(manifests)
    return subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", kube, "--quiet", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def render(*args: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(template(*args)) if doc]


def rendered(value_set: str) -> list[Doc]:
    return render(*values_args(value_set))


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} rendered"
    return found[0]


def agent_pod(docs: list[Doc]) -> Doc:
    spec: Doc = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def agent_container(docs: list[Doc]) -> Doc:
    container: Doc = agent_pod(docs)["containers"][0]
    return container


def config_file(docs: list[Doc], component: str, tmp_path: Path, fullname: str = FULLNAME) -> Path:
    """The component's rendered config file, written where its loader can read it."""
    configmap = one(docs, "ConfigMap", f"{fullname}-{component}")
    path = tmp_path / f"{component}.yaml"
    path.write_text(configmap["data"][f"{component}.yaml"])
    return path


def host_mounts(docs: list[Doc]) -> dict[str, Doc]:
    """mountPath -> volumeMount, for the agent's hostPath volumes, each with its `hostPath` added."""
    volumes = {v["name"]: v for v in agent_pod(docs)["volumes"]}
    return {
        m["mountPath"]: {**m, "hostPath": volumes[m["name"]]["hostPath"]["path"]}
        for m in agent_container(docs)["volumeMounts"]
        if "hostPath" in volumes[m["name"]]
    }


def mount_of(container: Doc, path: str) -> Doc:
    """The container's volumeMount that holds `path` (the deepest one)."""
    holding = [m for m in container["volumeMounts"] if Path(path).is_relative_to(m["mountPath"])]
    assert holding, f"{path} is on no volume: the root filesystem is read-only"
    return max(holding, key=lambda m: len(m["mountPath"]))


def tolerates(tolerations: list[Doc], taint: Doc) -> bool:
    """Kubernetes' matching: an empty effect matches every effect, Exists matches every value."""
    for t in tolerations:
        key_ok = t.get("key", "") == taint["key"] or (not t.get("key") and t.get("operator") == "Exists")
        effect_ok = not t.get("effect") or t["effect"] == taint["effect"]
        value_ok = t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", "")
        if key_ok and effect_ok and value_ok:
            return True
    return False


PASSWORD = "s3cret-Pa55word"
DB_URL = f"postgresql://gpufleet:{PASSWORD}@postgres.databases.svc:5432/gpufleet"


def controller_pod(docs: list[Doc]) -> Doc:
    pod: Doc = one(docs, "Deployment")["spec"]["template"]["spec"]
    return pod


def controller_env(docs: list[Doc]) -> dict[str, Doc]:
    return {e["name"]: e for e in controller_pod(docs)["containers"][0].get("env", [])}


def install_notes(*args: str) -> str:
    done = helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\nNOTES:\n", 1)[1]


RECORD_ON_VOLUME = "controller.config.record=/var/lib/gpufleet/frames.jsonl"


# Several controllers: one leads (a lease in PostgreSQL), the others wait as standbys that do not
# listen, so are never Ready. A rollout cannot wait for a new pod to be Ready before stopping an old
# one (maxUnavailable 0 never ends): it starts the new pod and stops the old ones at once.
ROLLING_UPDATE = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": "100%"}}
