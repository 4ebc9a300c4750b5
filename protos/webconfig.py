"""The /metrics web-config file of the agent and the controller, in the Prometheus exporter-toolkit
format (the `--web.config.file` of node_exporter and friends), the subset that matters here:

    tls_server_config:
      cert_file: server.crt            # with key_file: the endpoint speaks HTTPS
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default), VerifyClientCertIfGiven
      client_ca_file: scrapers-ca.crt  # the CA that signed the scrapers' certificates
      min_version: TLS12               # TLS12 (default) or TLS13; max_version likewise
    basic_auth_users:                  # user: bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')
      prometheus: $2y$10$...

Any other key is refused at start, in one line, as is a hash that is not bcrypt. The file and the
TLS files are looked at again on every connection (a stat of each): a change is picked up by the
next connection, so certificates rotate without a restart; a change that does not load is logged
and the previous settings stay.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import bcrypt
import yaml

from protos.transport import files_signature

log = logging.getLogger("gpufleet.webconfig")

_BCRYPT = re.compile(r"^\$2[abxy]\$\d\d\$[./A-Za-z0-9]{53}$")
_TOP_KEYS = {"tls_server_config", "basic_auth_users"}
_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"}
# Go's tls.ClientAuthType names; RequestClientCert and RequireAnyClientCert accept a certificate
# without verifying it, which Python's ssl cannot do (and which proves nothing).
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


class WebConfigError(ValueError):
    """The web-config file cannot be used; the one-line message names the file and the fault."""


@dataclass(frozen=True, slots=True)
class TlsServerConfig:
    cert_file: str
    key_file: str
    client_auth_type: str = "NoClientCert"
    client_ca_file: str | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"

    def files(self) -> list[str | None]:
        return [self.cert_file, self.key_file, self.client_ca_file]

    def context(self) -> ssl.SSLContext:
        """A server context read from the files now; WebConfigError when one cannot be used."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_VERSIONS[self.min_version]
        ctx.maximum_version = TLS_VERSIONS[self.max_version]
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(
                f"cannot load cert_file {self.cert_file} with key_file {self.key_file}: {_why(exc)}"
            ) from None
        if self.client_ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise WebConfigError(
                    f"cannot load client_ca_file {self.client_ca_file}: {_why(exc)}"
                ) from None
        ctx.verify_mode = CLIENT_AUTH[self.client_auth_type]
        return ctx


@dataclass(frozen=True, slots=True)
class WebConfig:
    tls: TlsServerConfig | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash


def parse_web_config(text: str, where: str = "web config") -> WebConfig:
    """The settings in `text` (YAML); WebConfigError (one line, starting with `where`) when wrong."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise WebConfigError(f"{where}: not valid YAML{at}") from None
    data = {} if data is None else data
    _mapping(data, where)
    _known(data, _TOP_KEYS, where)
    tls = None
    if data.get("tls_server_config") is not None:
        tls = _tls(_mapping(data["tls_server_config"], f"{where}: tls_server_config"), where)
    users: dict[str, bytes] = {}
    raw_users = data.get("basic_auth_users") or {}
    for user, hashed in _mapping(raw_users, f"{where}: basic_auth_users").items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"{where}: basic_auth_users: {user!r} is not a user name (text without ':')")
        if not isinstance(hashed, str) or not _BCRYPT.match(hashed):
            raise WebConfigError(
                f'{where}: basic_auth_users.{user}: not a bcrypt hash (make one with htpasswd -nBC 10 "")'
            )
        users[user] = hashed.encode()
    return WebConfig(tls=tls, users=users)


def load_web_config(path: str) -> WebConfig:
    """parse_web_config of the file at `path`, its TLS files checked by loading them."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise WebConfigError(f"cannot read web config {path}: {_why(exc)}") from None
    config = parse_web_config(text, f"web config {path}")
    if config.tls is not None:
        try:
            config.tls.context()
        except WebConfigError as exc:
            raise WebConfigError(f"web config {path}: {exc}") from None
    return config


def _tls(data: dict[str, Any], where: str) -> TlsServerConfig:
    where = f"{where}: tls_server_config"
    _known(data, _TLS_KEYS, where)
    for key, value in data.items():
        if not isinstance(value, str) or not value:
            raise WebConfigError(f"{where}.{key} must be a non-empty string")
    if "cert_file" not in data or "key_file" not in data:
        raise WebConfigError(f"{where}: cert_file and key_file are required")
    auth = data.get("client_auth_type", "NoClientCert")
    if auth not in CLIENT_AUTH:
        raise WebConfigError(
            f"{where}.client_auth_type {auth!r} is not supported; use one of {', '.join(CLIENT_AUTH)}"
        )
    if auth != "NoClientCert" and "client_ca_file" not in data:
        raise WebConfigError(f"{where}: client_auth_type {auth} needs client_ca_file")
    for key in ("min_version", "max_version"):
        if data.get(key, "TLS12") not in TLS_VERSIONS:
            raise WebConfigError(f"{where}.{key} {data[key]!r} is not supported; use TLS12 or TLS13")
    config = TlsServerConfig(**data)
    if TLS_VERSIONS[config.min_version] > TLS_VERSIONS[config.max_version]:
        raise WebConfigError(f"{where}: min_version {config.min_version} is above max_version")
    return config


def _mapping(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WebConfigError(f"{where} must be a mapping")
    return value


def _known(data: dict[str, Any], keys: set[str], where: str) -> None:
    unknown = sorted(str(key) for key in data if key not in keys)
    if unknown:
        raise WebConfigError(
            f"{where}: unknown or unsupported key {unknown[0]!r} (known: {', '.join(sorted(keys))})"
        )


def _why(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
    return str(text).splitlines()[0] if str(text) else type(exc).__name__


class BasicAuth:
    """Checks `Authorization: Basic ...` headers against bcrypt hashes, remembering successes.

    bcrypt is slow on purpose (~70 ms at cost 10): a user's last password that matched is kept as
    an HMAC under a key made at start, so the next scrape costs a hash, not a bcrypt. Failures are
    never remembered, and a user unknown costs a bcrypt too (no timing tells which users exist).
    """

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self.users = dict(users)
        self._key = os.urandom(32)
        self._good: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._dummy = bcrypt.hashpw(b"not a password", bcrypt.gensalt(4))

    def _credentials(self, header: str | None) -> tuple[str, bytes] | None:
        if not header:
            return None
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        user, sep, password = decoded.partition(b":")
        if not sep:
            return None
        return user.decode("utf-8", "replace"), password

    def _digest(self, user: str, password: bytes) -> bytes:
        return hmac.new(self._key, user.encode() + b"\0" + password, hashlib.sha256).digest()

    def cached(self, header: str | None) -> bool:
        """Whether these credentials matched before (cheap: no bcrypt)."""
        found = self._credentials(header)
        if found is None:
            return False
        user, password = found
        with self._lock:
            good = self._good.get(user)
        return good is not None and hmac.compare_digest(good, self._digest(user, password))

    def check(self, header: str | None) -> bool:
        """Whether the header carries a user's right password (slow: a bcrypt unless cached)."""
        found = self._credentials(header)
        if found is None:
            return False
        if self.cached(header):
            return True
        user, password = found
        hashed = self.users.get(user)
        if hashed is None:
            bcrypt.checkpw(password, self._dummy)
            return False
        if not bcrypt.checkpw(password, hashed):
            return False
        with self._lock:
            self._good[user] = self._digest(user, password)
        return True


@dataclass(frozen=True, slots=True)
class _State:
    config: WebConfig
    ssl_context: ssl.SSLContext | None
    auth: BasicAuth | None


class WebGuard:
    """A web-config file in force: the TLS context and basic auth for the next connection.

    Loaded (and checked) by the constructor: WebConfigError. `current()` looks at the file and the
    TLS files (a stat each) and reloads them when they changed; a reload that fails is logged once
    and the previous settings stay in force.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._state = self._load(None)
        self._signature = self._files_signature(self._state.config)
        self._failed: tuple[tuple[int, int, int], ...] | None = None

    @property
    def tls(self) -> bool:
        """Whether the endpoint speaks HTTPS now."""
        return self._state.ssl_context is not None

    def _files_signature(self, config: WebConfig) -> tuple[tuple[int, int, int], ...]:
        return files_signature([self.path, *(config.tls.files() if config.tls else [])])

    def _load(self, previous: _State | None) -> _State:
        config = load_web_config(self.path)
        ssl_context = config.tls.context() if config.tls is not None else None
        auth = None
        if config.users:
            same = previous is not None and previous.auth is not None and previous.auth.users == config.users
            auth = previous.auth if same and previous is not None else BasicAuth(config.users)
        return _State(config, ssl_context, auth)

    def current(self) -> _State:
        with self._lock:
            signature = self._files_signature(self._state.config)
            if signature in (self._signature, self._failed):
                return self._state
            try:
                state = self._load(self._state)
            except WebConfigError as exc:
                self._failed = signature
                log.warning("%s; keeping the settings loaded before", exc)
                return self._state
            # The files as they were before this load: a change made during it shows next time.
            if state.config.tls != self._state.config.tls:
                signature = self._files_signature(state.config)
            self._state, self._signature, self._failed = state, signature, None
            log.info("web config %s reloaded", self.path)
            return state
