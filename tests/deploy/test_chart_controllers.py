"""Several controllers (a leader and standbys on PostgreSQL, or one on SQLite), what routes to them
(the leader's Service, every pod with replicaIngest, a port of the operators' own with ingest
fronts), least-privilege RBAC, monitoring (rules, dashboards, monitors) and network policies.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent import config as agent_config
from controller import config as controller_config
from controller.kube.role import LEADER, POD_NAME_ENV, POD_NAMESPACE_ENV, ROLE_LABEL
from tests.deploy.chart import (
    AGENTS_SERVICE,
    CHART,
    DASHBOARDS,
    DB_URL,
    FULLNAME,
    KUBE_VERSION,
    MONITORING_KINDS,
    NAMESPACE,
    OLDEST_KUBE_VERSION,
    RECORD_ON_VOLUME,
    RELEASE,
    ROLLING_UPDATE,
    SQLITE_REPLICAS,
    TLS_SECRETS,
    VALUE_SETS,
    Doc,
    agent_pod,
    config_file,
    controller_env,
    controller_pod,
    helm,
    install_notes,
    kubernetes_validate,
    one,
    render,
    rendered,
    template,
    values_args,
)


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
