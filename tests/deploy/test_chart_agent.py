"""The chart's agent DaemonSet: on GPU nodes, tolerating gpufleet's own taint, unprivileged and
reading the host read-only unless tuning is on, its config accepted by the agent's own loader, BMC
credentials from a mounted Secret.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent import config as agent_config
from tests.deploy.chart import (
    AGENTS_SERVICE,
    FULLNAME,
    NAMESPACE,
    UNHEALTHY_TAINT,
    VALUE_SETS,
    agent_container,
    agent_pod,
    config_file,
    host_mounts,
    mount_of,
    one,
    rendered,
    tolerates,
)

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
