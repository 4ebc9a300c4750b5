"""The chart's transport security: mutual TLS unless plaintext is chosen explicitly (nothing renders
without certificates, saying what to set), each agent's own node files, cert-manager's certificate
for the name the agents dial, operator tokens and the /metrics web config as mounted Secrets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import config as agent_config
from controller import config as controller_config
from tests.deploy.chart import (
    CHART,
    RELEASE,
    TLS_DIR,
    Doc,
    agent_container,
    agent_pod,
    config_file,
    helm,
    host_mounts,
    mount_of,
    one,
    render,
    rendered,
    values_args,
)

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
