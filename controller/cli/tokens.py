"""`gpufleet token create NAME --role ROLE [--tokens-file FILE]`: a new operator token.

The token is printed once, alone on stdout (`> alice.token` makes the operator's --token-file).
Its entry for the controller's --operator-tokens file (name, role, sha256: never the token) is
added to FILE (created 0600; the controller re-reads it, no restart), or without FILE printed on
stderr to paste under `tokens:`.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
from pathlib import Path

import yaml

from controller.security.tokens import (
    ROLES,
    TokenEntry,
    TokenFileError,
    check_name,
    load_tokens,
    parse_tokens,
    token_sha256,
)

TOKEN_BYTES = 32  # 256 random bits, URL-safe base64 (43 characters)


def add_token_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = sub.add_parser(
        "token",
        help="operator tokens: create one (its hash goes to the controller's --operator-tokens file)",
        description="Create an operator token: printed once on stdout; the controller's tokens file "
        "gets only its SHA-256 (name, role, sha256). Roles: viewer (read), operator (probe, cordon, "
        "drain, retune, approve), admin (breaker reset, token management). Exit status 2 for a bad "
        "name, a name already in FILE or a FILE that cannot be used.",
    )
    token.add_argument("action", choices=["create"], help="create: a new random token")
    token.add_argument("name", help="who the token is for (audited as its requester)")
    token.add_argument("--role", required=True, choices=ROLES, help="what the token may do")
    token.add_argument(
        "--tokens-file",
        metavar="FILE",
        help="add the entry to this tokens file (created 0600 if missing); default: print it on stderr",
    )


def create(name: str, role: str, tokens_file: str | None) -> int:
    try:
        check_name(name)
    except ValueError as exc:
        print(f"gpufleet token: {exc}", file=sys.stderr)
        return 2
    token = secrets.token_urlsafe(TOKEN_BYTES)
    entry = TokenEntry(name, role, token_sha256(token))
    if tokens_file is not None:
        try:
            add_entry(Path(tokens_file), entry)
        except TokenFileError as exc:  # no token shown: it would not be accepted
            print(f"gpufleet token: {exc}", file=sys.stderr)
            return 2
    print(token, flush=True)  # on its own line, the one time anyone sees it
    if tokens_file is None:
        entry_text = _entry_yaml(entry)
        print(
            f"# for the controller's --operator-tokens file, under tokens:\n{entry_text}",
            end="",
            file=sys.stderr,
        )
    else:
        print(f"added {name} ({role}) to {tokens_file}", file=sys.stderr)
    return 0


def _entry_yaml(entry: TokenEntry) -> str:
    return yaml.safe_dump([entry.as_yaml()], sort_keys=False)


def add_entry(path: Path, entry: TokenEntry) -> None:
    """Append `entry` to the tokens file at `path`, its comments kept (created 0600 if missing).
    Written atomically: the controller never reads half a file."""
    if not path.exists():
        text = "# gpufleet operator tokens: name, role, sha256 of the token (the token is never stored)\n"
        _write(path, text + yaml.safe_dump({"tokens": [entry.as_yaml()]}, sort_keys=False), 0o600)
        return
    entries = load_tokens(path)
    if any(e.name == entry.name for e in entries):
        raise TokenFileError(f"operator tokens file {path} has a token named {entry.name} already")
    _write(path, _appended(path.read_text(encoding="utf-8"), entries, entry), path.stat().st_mode & 0o777)


def _appended(text: str, entries: tuple[TokenEntry, ...], entry: TokenEntry) -> str:
    """`text` with `entry` appended to its tokens list: as text when that parses to the same list
    plus the entry (comments kept), else the document written anew."""
    item = _entry_yaml(entry)
    body = text if text.endswith("\n") else text + "\n"
    for indent in ("", "  ", "    "):
        candidate = body + "".join(indent + line for line in item.splitlines(keepends=True))
        try:
            if parse_tokens(candidate) == (*entries, entry):
                return candidate
        except ValueError:
            continue
    return yaml.safe_dump({"tokens": [e.as_yaml() for e in (*entries, entry)]}, sort_keys=False)


def _write(path: Path, text: str, mode: int) -> None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise TokenFileError(f"cannot write operator tokens file {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise TokenFileError(f"cannot write operator tokens file {path}: {exc.strerror}") from None
