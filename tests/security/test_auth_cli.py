"""The operator CLI's credentials against a real controller on 127.0.0.1: --token-file (and
$GPUFLEET_TOKEN_FILE), the one-line answers to a missing, unknown or too small token, unusable
credential files (exit 2), TLS with --tls-ca/--tls-cert/--tls-key, and `gpufleet token create`
whose output is a working tokens file."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
import yaml

from controller.config import TlsConfig
from controller.main import main
from controller.security.auth import NO_TOKEN
from tests.controller.harness import ControllerThread, config

Capture = pytest.CaptureFixture[str]
ENV = (
    "GPUFLEET_TOKEN_FILE",
    "GPUFLEET_TLS_CA",
    "GPUFLEET_TLS_CERT",
    "GPUFLEET_TLS_KEY",
    "GPUFLEET_CONTROLLER",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def run(capsys: Capture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def create(capsys: Capture, tokens: Path, name: str, role: str, token_dir: Path) -> Path:
    """`gpufleet token create` into `tokens`; the printed token saved as NAME.token (a --token-file)."""
    code, out, err = run(capsys, "token", "create", name, "--role", role, "--tokens-file", str(tokens))
    assert (code, err) == (0, f"added {name} ({role}) to {tokens}\n")
    path = token_dir / f"{name}.token"
    path.write_text(out)
    return path


@pytest.fixture
def team(tmp_path: Path, capsys: Capture) -> Iterator[tuple[ControllerThread, dict[str, Path]]]:
    """A controller reading tokens.yaml, made by `token create` for a viewer, an operator and an admin."""
    tokens = tmp_path / "tokens.yaml"
    files = {role: create(capsys, tokens, f"{role}-1", role, tmp_path) for role in ("viewer", "operator")}
    with ControllerThread(config(operator_tokens=str(tokens))) as c:
        # made while the controller runs: the file is re-read, no restart
        files["admin"] = create(capsys, tokens, "admin-1", "admin", tmp_path)
        yield c, files


def test_token_create_writes_only_the_hash_0600(tmp_path: Path, capsys: Capture) -> None:
    tokens = tmp_path / "tokens.yaml"
    token = create(capsys, tokens, "alice", "viewer", tmp_path).read_text().strip()
    assert len(token) >= 43 and token not in tokens.read_text()
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    create(capsys, tokens, "bob", "admin", tmp_path)
    doc = yaml.safe_load(tokens.read_text())
    assert [(e["name"], e["role"]) for e in doc["tokens"]] == [("alice", "viewer"), ("bob", "admin")]
    assert tokens.read_text().startswith("# gpufleet operator tokens")  # the comment kept on append

    code, out, err = run(capsys, "token", "create", "alice", "--role", "admin", "--tokens-file", str(tokens))
    assert (code, out) == (2, "")
    assert err == f"gpufleet token: operator tokens file {tokens} has a token named alice already\n"
    code, out, err = run(capsys, "token", "create", "a b", "--role", "admin")
    assert (code, out) == (2, "") and err.startswith("gpufleet token: token name 'a b' must be")
    code, _, err = run(capsys, "token", "create", "x", "--role", "admin", "--tokens-file", str(tmp_path))
    assert code == 2 and err.startswith(f"gpufleet token: cannot read operator tokens file {tmp_path}")


def test_token_create_without_a_file_prints_the_entry(tmp_path: Path, capsys: Capture) -> None:
    code, out, err = run(capsys, "token", "create", "carol", "--role", "operator")
    assert code == 0 and out.count("\n") == 1
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens:\n" + err)  # the entry, pasted under tokens:
    (tmp_path / "carol.token").write_text(out)
    with ControllerThread(config(operator_tokens=str(tokens))) as c:
        code, out, err = run(
            capsys, "history", "--controller", c.address, "--token-file", str(tmp_path / "carol.token")
        )
        assert (code, err) == (0, "")


def test_the_cli_says_in_one_line_who_may_not(
    team: tuple[ControllerThread, dict[str, Path]], capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, files = team
    code, out, err = run(capsys, "nodes", "--controller", c.address)
    assert (code, out, err) == (1, "", f"gpufleet: not authenticated: {NO_TOKEN}\n")

    unknown = files["viewer"].with_name("unknown.token")
    unknown.write_text("not-a-token\n")
    code, out, err = run(capsys, "findings", "--controller", c.address, "--token-file", str(unknown))
    assert (code, out, err) == (1, "", "gpufleet: not authenticated: unknown operator token\n")

    viewer = ("--controller", c.address, "--token-file", str(files["viewer"]))
    code, out, err = run(capsys, "nodes", *viewer, "-o", "json")
    assert (code, json.loads(out)["nodes"]) == (0, [])  # (stderr: the plaintext warning)
    code, out, err = run(capsys, "breaker", "reset", "--reason", "r", "--yes", *viewer)
    assert (code, out, err) == (
        1,
        "",
        "gpufleet: permission denied: token viewer-1 has role viewer; ResetBreaker needs admin\n",
    )
    code, out, err = run(capsys, "cordon", "n1", *viewer)
    assert (code, out) == (1, "")
    assert (
        err == "gpufleet cordon: permission denied: token viewer-1 has role viewer; Cordon needs operator\n"
    )

    monkeypatch.setenv("GPUFLEET_TOKEN_FILE", str(files["operator"]))  # the default --token-file
    code, out, err = run(capsys, "breaker", "reset", "--reason", "r", "--yes", "--controller", c.address)
    assert (code, err) == (
        1,
        "gpufleet: permission denied: token operator-1 has role operator; ResetBreaker needs admin\n",
    )

    admin = ("--controller", c.address, "--token-file", str(files["admin"]))
    code, _, err = run(capsys, "breaker", "reset", "--reason", "cable fixed", "--yes", *admin)
    assert (code, err) == (0, "")
    code, out, err = run(capsys, "history", *admin, "-o", "json")
    [entry] = json.loads(out)["entries"]
    assert entry["action"] == "breaker_reset"
    assert entry["requester"].startswith("admin-1 (admin) from ipv4:127.0.0.1:")


def test_unusable_credential_files_are_one_line_exit_2(tmp_path: Path, capsys: Capture) -> None:
    target = ("--controller", "127.0.0.1:9")  # never reached: the files are read first
    missing = tmp_path / "missing.token"
    code, out, err = run(capsys, "nodes", *target, "--token-file", str(missing))
    assert (code, out, err) == (
        2,
        "",
        f"gpufleet: cannot read token file {missing}: No such file or directory\n",
    )
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    code, _, err = run(capsys, "nodes", *target, "--token-file", str(empty))
    assert (code, err) == (2, f"gpufleet: token file {empty} is empty\n")
    two = tmp_path / "two.token"
    two.write_text("one two\n")
    code, _, err = run(capsys, "nodes", *target, "--token-file", str(two))
    assert (code, err) == (
        2,
        f"gpufleet: token file {two} must hold one token (printable ASCII, no spaces)\n",
    )
    code, _, err = run(capsys, "nodes", *target, "--tls-ca", str(tmp_path / "ca.pem"))
    assert (
        code == 2
        and err.startswith(f"gpufleet: cannot read CA file {tmp_path / 'ca.pem'}")
        and err.count("\n") == 1
    )
    code, _, err = run(capsys, "nodes", *target, "--tls-cert", str(empty))
    assert (code, err) == (2, "gpufleet: --tls-cert and --tls-key go together\n")


def test_tls_with_a_client_certificate_and_a_token(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = trustme.CA()
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key", "op-cert", "op-key")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    server = ca.issue_cert("127.0.0.1")
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    operator = ca.issue_cert("operator-alice")
    operator.cert_chain_pems[0].write_to_path(str(files["op-cert"]))
    operator.private_key_pem.write_to_path(str(files["op-key"]))
    tokens = tmp_path / "tokens.yaml"
    token = create(capsys, tokens, "alice", "viewer", tmp_path)
    tls = TlsConfig(cert=str(files["cert"]), key=str(files["key"]), client_ca=str(files["ca"]))
    with ControllerThread(config(tls=tls, operator_tokens=str(tokens))) as c:
        creds = (
            "--tls-ca",
            str(files["ca"]),
            "--tls-cert",
            str(files["op-cert"]),
            "--tls-key",
            str(files["op-key"]),
        )
        code, out, err = run(capsys, "nodes", "--controller", c.address, *creds, "--token-file", str(token))
        assert (code, err) == (0, "") and out.startswith("Nodes (0)")  # TLS: no plaintext warning
        # the same, from the environment
        for name, key in (("CA", "ca"), ("CERT", "op-cert"), ("KEY", "op-key")):
            monkeypatch.setenv(f"GPUFLEET_TLS_{name}", str(files[key]))
        monkeypatch.setenv("GPUFLEET_TOKEN_FILE", str(token))
        code, _, err = run(capsys, "nodes", "--controller", c.address, "-o", "json")
        assert (code, err) == (0, "")
        # TLS without the token still needs one
        code, _, err = run(capsys, "nodes", "--controller", c.address, "--token-file", "")
        assert (code, err) == (1, f"gpufleet: not authenticated: {NO_TOKEN}\n")


def test_a_token_is_never_sent_in_plaintext_off_host(tmp_path: Path, capsys: Capture) -> None:
    token = tmp_path / "alice.token"
    token.write_text("s3cret-token\n")
    code, out, err = run(capsys, "nodes", "--controller", "10.0.0.9:50051", "--token-file", str(token))
    assert (code, out) == (2, "")
    assert err == (
        "gpufleet: refusing to send an operator token in plaintext to 10.0.0.9:50051: give --tls-ca "
        "(or $GPUFLEET_TLS_CA) with the controller's CA\n"
    )
