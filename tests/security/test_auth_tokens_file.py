"""The --operator-tokens file: every way it can be wrong is one line naming the file (and `gpufleet
controller` exits 2 on it before it starts); a good one maps tokens to names and roles by hash."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from controller.main import main
from controller.security.tokens import TokenFileError, TokenStore, load_tokens, token_sha256

GOOD = hashlib.sha256(b"s3cret").hexdigest()
OTHER = hashlib.sha256(b"other").hexdigest()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tokens: [\n", "not valid YAML at line"),
        ("- name: a\n", "must be a mapping with one key, tokens"),
        ("tokens: {}\nextra: 1\n", "must be a mapping with one key, tokens"),
        ("tokens: {name: a}\n", "tokens must be a list"),
        ("tokens: [alice]\n", "tokens[0] must be a mapping with name, role and sha256"),
        (f"tokens: [{{name: a, role: viewer, sha256: {GOOD}, token: x}}]\n", "unknown field(s) token"),
        ("tokens: [{name: a, role: viewer}]\n", "tokens[0]: missing sha256"),
        (f"tokens: [{{name: 'a b', role: viewer, sha256: {GOOD}}}]\n", "token name 'a b' must be"),
        (f"tokens: [{{name: 7, role: viewer, sha256: {GOOD}}}]\n", "name must be a string"),
        (
            f"tokens: [{{name: a, role: root, sha256: {GOOD}}}]\n",
            "role must be one of viewer, operator, admin",
        ),
        ("tokens: [{name: a, role: viewer, sha256: s3cret}]\n", "sha256 must be 64 hex digits"),
        (
            f"tokens: [{{name: a, role: viewer, sha256: {GOOD}}},\n"
            f" {{name: a, role: admin, sha256: {OTHER}}}]",
            "token name(s) a appear more than once",
        ),
        (
            f"tokens: [{{name: a, role: viewer, sha256: {GOOD}}},\n"
            f" {{name: b, role: admin, sha256: {GOOD}}}]",
            "tokens a, b have the same sha256",
        ),
    ],
)
def test_a_bad_tokens_file_is_one_line_naming_it(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TokenFileError) as info:
        load_tokens(path)
    assert str(info.value).startswith(f"operator tokens file {path}: ")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_missing_tokens_file(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match=r"cannot read operator tokens file .*nope\.yaml: No such file"):
        load_tokens(tmp_path / "nope.yaml")


def test_lookup_by_hash(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"tokens:\n  - {{name: alice, role: viewer, sha256: {GOOD.upper()}}}\n"
        f"  - {{name: bob, role: admin, sha256: {OTHER}}}\n",
    )
    store = TokenStore(str(path))
    assert token_sha256("s3cret") == GOOD
    found = store.lookup("s3cret")
    assert found is not None and (found.name, found.role) == ("alice", "viewer")  # hex in any case
    found = store.lookup("other")
    assert found is not None and (found.name, found.role) == ("bob", "admin")
    assert store.lookup("S3CRET") is None and store.lookup("") is None
    assert store.lookup(GOOD) is None  # the hash itself is not a token


def test_an_empty_list_locks_everyone_out(tmp_path: Path) -> None:
    store = TokenStore(str(write(tmp_path, "tokens: []\n")))
    assert store.entries == () and store.lookup("s3cret") is None


def test_the_controller_does_not_start_on_a_bad_tokens_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "tokens: [{name: a, role: root, sha256: 00}]\n")
    code = main(["controller", "--listen", "127.0.0.1:0", "--db", ":memory:", "--operator-tokens", str(path)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert (
        err == f"gpufleet controller: operator tokens file {path}: tokens[0] (a): role must be one of "
        "viewer, operator, admin, not 'root'\n"
    )
