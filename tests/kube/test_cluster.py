"""Finding the cluster: --kubeconfig (kubernetes.kubeconfig) first, then the in-cluster service
account, then $KUBECONFIG; turned off, absent or unusable: no cluster, and one line saying why.
And the kubernetes section of the controller config, with its clear errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.config import ConfigError, KubernetesConfig, load
from controller.errors import FailedPrecondition
from controller.kube.cluster import NO_CLUSTER, TURNED_OFF, find_cluster
from controller.kube.fake import FakeApiServer
from controller.kube.fake.objects import node
from tests.kube.harness import kubeconfig


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        s.add(node("n1"))
        yield s


def test_kubeconfig_from_the_config_beats_the_environment(tmp_path: Path, server: FakeApiServer) -> None:
    path = kubeconfig(tmp_path, server)
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBECONFIG": "/nonexistent"}
    found = find_cluster(KubernetesConfig(kubeconfig=str(path)), environ=env)
    assert found.source == f"kubeconfig {path}"
    assert found.require().get_node("n1")["metadata"]["name"] == "n1"
    found.close()


def test_kubeconfig_env_is_the_last_resort(tmp_path: Path, server: FakeApiServer) -> None:
    path = kubeconfig(tmp_path, server)
    found = find_cluster(KubernetesConfig(), environ={"KUBECONFIG": str(path)})
    assert found.source == f"$KUBECONFIG {path}"
    assert found.require().get_node("n1")["metadata"]["name"] == "n1"


def test_in_cluster_service_account_before_kubeconfig_env(tmp_path: Path, server: FakeApiServer) -> None:
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("token-of-the-pod")
    (account / "ca.crt").write_text("not used over http")
    env = {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBECONFIG": str(kubeconfig(tmp_path, server)),
    }
    found = find_cluster(KubernetesConfig(), environ=env, service_account=account)
    assert found.source == "in-cluster service account"
    assert found.api is not None and found.api.where == "https://10.96.0.1:443"


def test_in_cluster_without_a_token_is_no_cluster_saying_why(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    found = find_cluster(KubernetesConfig(), environ=env, service_account=tmp_path / "none")
    assert found.api is None and "in-cluster service account cannot be used" in found.why


def test_nothing_configured_is_one_clear_line() -> None:
    found = find_cluster(KubernetesConfig(), environ={})
    assert found.api is None and found.why == NO_CLUSTER
    with pytest.raises(FailedPrecondition) as err:
        found.require()
    assert str(err.value) == NO_CLUSTER and "\n" not in NO_CLUSTER
    assert "no Kubernetes cluster is configured" in NO_CLUSTER


def test_turned_off_and_unusable_kubeconfig(tmp_path: Path, server: FakeApiServer) -> None:
    off = KubernetesConfig(enabled=False, kubeconfig=str(kubeconfig(tmp_path, server)))
    assert find_cluster(off, environ={}).why == TURNED_OFF
    bad = tmp_path / "bad"
    bad.write_text("apiVersion: v1\nkind: Config\n")
    found = find_cluster(KubernetesConfig(kubeconfig=str(bad)), environ={})
    assert found.api is None and found.why.startswith(
        f"no Kubernetes cluster: kubeconfig {bad} cannot be used"
    )


def test_the_config_section_and_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(
        """
kubernetes:
  kubeconfig: /etc/gpufleet/kubeconfig
  drain: {delete_emptydir_data: true, force: true, timeout_seconds: 30, grace_seconds: 5}
  maintenance: {annotations: [example.com/maintenance], labels: ["maintenance=true"]}
  taint_unhealthy: true
  policy: {nvlink_down: auto}
"""
    )
    k = load(str(path)).kubernetes
    assert (k.enabled, k.kubeconfig, k.taint_unhealthy) == (True, "/etc/gpufleet/kubeconfig", True)
    assert (k.drain.delete_emptydir_data, k.drain.force, k.drain.timeout_seconds, k.drain.grace_seconds) == (
        True,
        True,
        30.0,
        5,
    )
    assert k.maintenance.labels == ["maintenance=true"]
    assert (k.mode("nvlink_down"), k.mode("thermal_throttle")) == ("auto", "recommend")
    assert load(None).kubernetes == KubernetesConfig()
    for text, says in (
        ("kubernetes: {drain: {timeout_seconds: 0}}", "kubernetes.drain.timeout_seconds must be > 0"),
        ("kubernetes: {drain: {grace_seconds: -1}}", "kubernetes.drain.grace_seconds must be >= 0"),
        ("kubernetes: {policy: {nope: auto}}", "kubernetes.policy: 'nope' is not a finding cause"),
        (
            "kubernetes: {policy: {nvlink_down: always}}",
            "kubernetes.policy.nvlink_down: 'always' is not one of",
        ),
        ("kubernetes: {default_policy: sometimes}", "kubernetes.default_policy: 'sometimes'"),
        ("kubernetes: {maintenance: {labels: ['=x']}}", "kubernetes.maintenance.labels: '=x' is not KEY"),
        ("kubernetes: {enabeld: false}", "unknown field `enabeld`"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError, match="invalid controller config") as err:
            load(str(path))
        assert says in str(err.value), (text, str(err.value))
