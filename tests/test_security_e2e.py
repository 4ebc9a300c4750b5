"""End to end with TLS on, real processes only: a lab PKI from `gpufleet certs`, tokens from
`gpufleet token create`, a controller with mutual TLS and operator tokens, and agents.

What the issue asks to be refused is refused: a forged node (an agent whose Hello names another
node), a replayed certificate of another node (the same thing seen from the certificate's side),
plaintext, and an operator call without a token or with too small a role; the rightful agent and
operator get through, and the node shows as mutually authenticated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.processes import ready_address, spawn, stop

pytestmark = pytest.mark.slow
TIMEOUT = 60.0


def gpufleet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


@dataclass
class Lab:
    address: str
    pki: Path
    tokens: dict[str, Path]  # name -> token file
    tmp: Path

    def operator(self, *args: str, token: str | None = "alice") -> subprocess.CompletedProcess[str]:
        """An operator command over TLS with alice's client certificate and, if given, a token."""
        creds = [
            "--controller",
            self.address,
            "--tls-ca",
            str(self.pki / "ca.crt"),
            "--tls-cert",
            str(self.pki / "operators" / "alice.crt"),
            "--tls-key",
            str(self.pki / "operators" / "alice.key"),
        ]
        if token is not None:
            creds += ["--token-file", str(self.tokens[token])]
        return gpufleet(*args, *creds, env={"GPUFLEET_TOKEN_FILE": ""})

    def agent(self, node: str, cert_of: str) -> subprocess.Popen[bytes]:
        """An agent that says it is `node`, holding the certificate and key of `cert_of`."""
        cfg = self.tmp / f"agent-{node}-{cert_of}.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "node": node,
                    "source": "sim",
                    "interval_seconds": 0.5,
                    "sim": {"gpus": 1},
                    "stream": {
                        "controller": self.address,
                        "backoff_initial_seconds": 0.1,
                        "backoff_max_seconds": 0.5,
                        "tls_ca": str(self.pki / "ca.crt"),
                        "tls_cert": str(self.pki / "nodes" / f"{cert_of}.crt"),
                        "tls_key": str(self.pki / "nodes" / f"{cert_of}.key"),
                    },
                    "metrics": {"address": None},
                }
            )
        )
        return spawn(["agent", "--config", str(cfg)], self.tmp / f"agent-{node}-{cert_of}.log")

    def nodes(self) -> list[dict[str, object]]:
        listed = self.operator("nodes", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        return list(json.loads(listed.stdout)["nodes"])


def run_ok(*args: str) -> subprocess.CompletedProcess[str]:
    done = gpufleet(*args)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("security-e2e")
    pki = tmp / "pki"
    run_ok("certs", "ca", "--dir", str(pki))
    run_ok("certs", "controller", "--dir", str(pki))
    run_ok("certs", "node", "node-a", "node-b", "--dir", str(pki))
    run_ok("certs", "operator", "alice", "--dir", str(pki))
    tokens_file = tmp / "tokens.yaml"
    tokens: dict[str, Path] = {}
    for name, role in (("alice", "operator"), ("victor", "viewer")):
        made = run_ok("token", "create", name, "--role", role, "--tokens-file", str(tokens_file))
        tokens[name] = tmp / f"{name}.token"
        tokens[name].write_text(made.stdout)
    assert "sha256" in tokens_file.read_text() and tokens["alice"].read_text().strip() not in (
        tokens_file.read_text()
    )  # only the hash is kept at rest
    cfg = tmp / "controller.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"metrics_address": None, "db": str(tmp / "db.sqlite"), "probes": {"on_connect": False}}
        )
    )
    ready = tmp / "ready.json"
    controller = spawn(
        [
            "controller",
            "controller",
            "--config",
            str(cfg),
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            str(pki / "controller.crt"),
            "--tls-key",
            str(pki / "controller.key"),
            "--tls-client-ca",
            str(pki / "ca.crt"),
            "--operator-tokens",
            str(tokens_file),
            "--ready-file",
            str(ready),
        ],
        tmp / "controller.log",
    )
    agents: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + TIMEOUT
        started = ready_address(controller, ready, tmp / "controller.log")
        lab = Lab(started["address"], pki, tokens, tmp)
        agents.append(lab.agent("node-a", cert_of="node-a"))  # the rightful agent
        agents.append(lab.agent("node-b", cert_of="node-a"))  # forged: names node-b, holds node-a's cert
        while not any(n["name"] == "node-a" and n["connected"] for n in lab.nodes()):
            assert time.monotonic() < deadline, (tmp / "controller.log").read_text()[-3000:]
            time.sleep(0.2)
        yield lab
    finally:
        for agent in agents:
            stop(agent)
        stop(controller)


def test_the_rightful_agent_is_listed_as_mutually_authenticated(lab: Lab) -> None:
    [node] = [n for n in lab.nodes() if n["name"] == "node-a"]
    assert node["transport"] == "mtls" and node["connected"] is True


def test_a_forged_node_with_another_nodes_certificate_is_refused(lab: Lab) -> None:
    log = lab.tmp / "agent-node-b-node-a.log"
    deadline = time.monotonic() + TIMEOUT
    while "PERMISSION_DENIED" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    assert "certificate is for node(s) node-a" in log.read_text()
    assert all(n["name"] != "node-b" for n in lab.nodes())  # never registered, never listed
    controller_log = (lab.tmp / "controller.log").read_text()
    assert "refused a stream" in controller_log and "Hello says 'node-b'" in controller_log


def test_operator_calls_need_a_token_and_the_role(lab: Lab) -> None:
    bare = lab.operator("nodes", token=None)
    assert bare.returncode == 1 and bare.stdout == ""
    assert bare.stderr.count("\n") == 1 and "not authenticated" in bare.stderr
    viewer = lab.operator("cordon", "node-a", "--reason", "test", token="victor")
    assert viewer.returncode == 1 and "permission denied" in viewer.stderr
    assert "role viewer" in viewer.stderr and viewer.stderr.count("\n") == 1


def test_plaintext_and_a_client_without_a_certificate_are_refused(lab: Lab) -> None:
    plain = gpufleet("nodes", "--controller", lab.address, "--token-file", str(lab.tokens["alice"]))
    assert plain.returncode == 1 and plain.stdout == ""
    assert "if the controller uses TLS, give --tls-ca" in plain.stderr and plain.stderr.count("\n") == 1
    no_cert = gpufleet(
        "nodes",
        "--controller",
        lab.address,
        "--tls-ca",
        str(lab.pki / "ca.crt"),
        "--token-file",
        str(lab.tokens["alice"]),
    )
    assert no_cert.returncode == 1 and no_cert.stdout == ""
