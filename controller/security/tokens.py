"""Operator bearer tokens: the `--operator-tokens` file, hashed at rest, re-read when it changes.

The file is YAML:

    tokens:
      - name: alice          # who the token speaks for (audited as "alice (operator) from PEER")
        role: operator       # viewer < operator < admin: each has the rights of those before it
        sha256: 9f86d0...    # hex SHA-256 of the token; the token itself is never stored

Names and hashes are unique. `gpufleet token create` makes a token and its entry.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from controller.config import ConfigError
from protos.transport import files_signature

log = logging.getLogger("gpufleet.controller.security")

ROLES = ("viewer", "operator", "admin")  # in order: each role has the rights of those before it
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
FIELDS = ("name", "role", "sha256")


class TokenFileError(ConfigError):
    """The tokens file is missing, unreadable or invalid; one line naming the file and the entry."""


def role_rank(role: str) -> int:
    return ROLES.index(role)


def token_sha256(token: str) -> str:
    """Hex SHA-256 of a token, as the tokens file stores it."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class TokenEntry:
    name: str
    role: str
    sha256: str  # lower-case hex

    def as_yaml(self) -> dict[str, str]:
        return {"name": self.name, "role": self.role, "sha256": self.sha256}


def check_name(name: str) -> str:
    """The name if it is a valid token name, else ValueError saying what a name may hold."""
    if not NAME_RE.fullmatch(name):
        raise ValueError(
            f"token name {name!r} must be 1-64 letters, digits, '.', '_', '@' or '-' (not first)"
        )
    return name


def _entry(item: Any, where: str) -> TokenEntry:
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be a mapping with name, role and sha256")
    unknown = sorted(str(k) for k in item if k not in FIELDS)
    missing = [k for k in FIELDS if k not in item]
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (name, role, sha256 only)")
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    name, role, digest = item["name"], item["role"], item["sha256"]
    if not isinstance(name, str):
        raise ValueError(f"{where}: name must be a string")
    check_name(name)
    if role not in ROLES:
        raise ValueError(f"{where} ({name}): role must be one of {', '.join(ROLES)}, not {role!r}")
    if not isinstance(digest, str) or not SHA256_RE.fullmatch(digest.lower()):
        raise ValueError(f"{where} ({name}): sha256 must be 64 hex digits (the token's SHA-256)")
    return TokenEntry(name, role, digest.lower())


def parse_tokens(text: str) -> tuple[TokenEntry, ...]:
    """The entries of a tokens document; ValueError (one line) when it is not valid."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"not valid YAML{at}") from None
    if not isinstance(doc, dict) or set(doc) != {"tokens"}:
        raise ValueError("must be a mapping with one key, tokens: a list of {name, role, sha256}")
    items = doc["tokens"] or []
    if not isinstance(items, list):
        raise ValueError("tokens must be a list of {name, role, sha256}")
    entries = tuple(_entry(item, f"tokens[{i}]") for i, item in enumerate(items))
    names = [e.name for e in entries]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"token name(s) {', '.join(dup)} appear more than once")
    hashes = [e.sha256 for e in entries]
    if len(set(hashes)) != len(hashes):
        owners = sorted(e.name for e in entries if hashes.count(e.sha256) > 1)
        raise ValueError(f"tokens {', '.join(owners)} have the same sha256 (one token, two names)")
    return entries


def load_tokens(path: str | Path) -> tuple[TokenEntry, ...]:
    """The entries of a tokens file; TokenFileError (one line, naming the file) when unusable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TokenFileError(f"cannot read operator tokens file {path}: {why}") from None
    try:
        return parse_tokens(text)
    except ValueError as exc:
        raise TokenFileError(f"operator tokens file {path}: {exc}") from None


class TokenStore:
    """The tokens of one file, re-read when it changes: a bad new version is logged and the last good
    one kept. Lookups compare hashes in constant time against every entry."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._signature = files_signature([path])
        self._entries = load_tokens(path)  # TokenFileError at start: the controller does not start

    @property
    def entries(self) -> tuple[TokenEntry, ...]:
        self._refresh()
        return self._entries

    def lookup(self, token: str) -> TokenEntry | None:
        """The entry whose sha256 is the token's, or None."""
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for entry in self.entries:  # no early exit: the time taken does not depend on which matched
            if hmac.compare_digest(digest, bytes.fromhex(entry.sha256)):
                found = entry
        return found

    def _refresh(self) -> None:
        signature = files_signature([self.path])
        if signature == self._signature:
            return
        with self._lock:
            if signature == self._signature:
                return
            self._signature = signature
            try:
                entries = load_tokens(self.path)
            except TokenFileError as exc:
                log.error("%s; keeping the %d token(s) read before", exc, len(self._entries))
                return
            self._entries = entries
            log.info("operator tokens re-read from %s: %d token(s)", self.path, len(entries))
