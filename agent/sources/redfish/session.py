"""Redfish transport: the only module that imports `redfish` (DMTF's python-redfish-library).

A `RedfishSession` talks to one BMC from one thread: it reads the service root, logs in (a Redfish
session, else basic auth when the service's session creation is not compliant), GETs and PATCHes
resources, and logs out. Every failure leaves here as a `BmcError` whose `kind` says what went
wrong (unreachable, timeout, tls, auth, http, malformed), with a message an operator can act on.

Why not the library's defaults: it retries a failed request 10 times a second apart (a dead BMC
would hold a poll for minutes), and it skips TLS verification unless given a CA file, so TLS
verification is turned on here by handing it a CA bundle (the configured one, else the default
trust store) unless `insecure` was asked for.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redfish
import requests
import requests.utils
import urllib3
from redfish.rest.v1 import (
    InvalidCredentialsError,
    JsonDecodingError,
    RetriesExhaustedError,
    SessionCreationError,
)

from agent.sources.errors import SourceError
from agent.sources.redfish.deadline import Watch, watch_session

log = logging.getLogger("gpufleet.agent.bmc")
# The library logs every request and response time at INFO: far too much at the agent's level.
logging.getLogger("redfish").setLevel(logging.WARNING)
SERVICE_ROOT = "/redfish/v1/"
DEFAULT_SESSIONS = "/redfish/v1/SessionService/Sessions"
KINDS = ("unreachable", "timeout", "tls", "auth", "http", "malformed", "config")


class BmcError(SourceError):
    """A BMC request failed. `kind` is one of KINDS; `status` is the HTTP status where there was one."""

    def __init__(self, message: str, *, kind: str, status: int | None = None) -> None:
        super().__init__("bmc", message)
        self.message = message  # without the "bmc: " prefix, for places that already say it is the BMC
        self.kind = kind
        self.status = status


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str = field(repr=False)  # never in logs, reprs or errors


@dataclass(frozen=True, slots=True)
class BmcEndpoint:
    """Where a BMC is and how to reach it (built from the agent config or `gpufleet bmc` flags)."""

    url: str
    credentials: Credentials | None = None
    ca_bundle: str | None = None
    insecure: bool = False
    connect_timeout_seconds: float = 5.0
    read_timeout_seconds: float = 20.0  # per socket read
    # The whole request (connect, send, every read): a BMC that trickles its answer ends here.
    # None: connect + read timeout.
    request_timeout_seconds: float | None = None

    @property
    def request_budget(self) -> float:
        if self.request_timeout_seconds is not None:
            return self.request_timeout_seconds
        return self.connect_timeout_seconds + self.read_timeout_seconds

    @property
    def base(self) -> str:
        """scheme://host[:port], the part every resource path is appended to."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"


@dataclass(slots=True)
class Resource:
    """One GET answer: the JSON body and the ETag the service gave (header, else @odata.etag)."""

    path: str
    body: dict[str, Any]
    etag: str = ""


def resource_path(odata_id: str) -> str:
    """A resource path from an @odata.id: the fragment dropped, an absolute URL reduced to its path."""
    path = odata_id.split("#", 1)[0]
    if "://" in path:
        path = urlsplit(path).path
    return path


class RedfishSession:
    """One BMC, one thread. `open()` before requests; `close()` always (it never raises)."""

    def __init__(self, endpoint: BmcEndpoint) -> None:
        if not endpoint.url.startswith(("http://", "https://")):
            raise BmcError(
                f"BMC URL must start with http:// or https://, not {endpoint.url!r}", kind="config"
            )
        self.endpoint = endpoint
        self.auth = ""  # "session", "basic" or "" (no credentials)
        self.requests = 0
        self.root: dict[str, Any] = {}
        self._client: Any = None
        self._session_location = ""
        # The poll's deadline (time.monotonic()) and its length, set by the poller's source; a
        # request never runs past it.
        self.deadline: float | None = None
        self.deadline_seconds = 0.0
        self._watch: Watch | None = None

    def __enter__(self) -> RedfishSession:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def is_open(self) -> bool:
        return self._client is not None

    def open(self) -> None:
        """Read the service root (no credentials needed) and log in; BmcError if either fails."""
        ep = self.endpoint
        verify: str | None = None if ep.insecure else (ep.ca_bundle or requests.utils.DEFAULT_CA_BUNDLE_PATH)
        if ep.insecure:
            log.warning("BMC %s: TLS certificate verification is off (insecure was asked for)", ep.base)
            # Said once above; urllib3 would otherwise warn on every request.
            warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
        self._client = redfish.redfish_client(
            base_url=ep.base,
            cafile=verify,
            timeout=(ep.connect_timeout_seconds, ep.read_timeout_seconds),
            max_retry=0,  # one attempt per request: the poller owns retries and backs off
            check_connectivity=False,  # the root is read below, with errors translated
        )
        watch_session(self._client._session)  # every request ends by its deadline (deadline.py)
        try:
            self.root = self._read_root()
            self._login()
        except BmcError:
            self._drop_client()
            raise

    def _read_root(self) -> dict[str, Any]:
        """The service root, which the standard serves without credentials; some BMCs answer 401
        there anyway, so retry once with basic auth when credentials are known."""
        try:
            return self.get(SERVICE_ROOT).body
        except BmcError as exc:
            creds = self.endpoint.credentials
            if exc.status not in (401, 403) or creds is None:
                raise
        self._client.set_authorization_key(_basic(creds))
        return self.get(SERVICE_ROOT).body

    def _login(self) -> None:
        creds = self.endpoint.credentials
        if creds is None:
            self.auth = ""
            return
        links = self.root.get("Links")
        sessions = links.get("Sessions") if isinstance(links, dict) else None
        login_url = sessions.get("@odata.id") if isinstance(sessions, dict) else None
        login_path = resource_path(login_url) if isinstance(login_url, str) else DEFAULT_SESSIONS
        why = self._session_login(login_path, creds)
        if why is None:
            self.auth = "session"
            return
        # Seen in the wild: 204 with neither token nor Location, or no SessionService at all.
        log.info("BMC %s: session login not usable (%s); using basic auth", self.endpoint.base, why)
        self._client.set_authorization_key(_basic(creds))
        self.auth = "basic"

    def _session_login(self, login_path: str, creds: Credentials) -> str | None:
        """Create a Redfish session; None when it worked, else why it is not usable."""
        body = {"UserName": creds.username, "Password": creds.password}
        resp = self._request("POST", login_path, body=body)
        # Anything but success falls back to basic auth, 401 included: some BMCs guard the
        # session collection itself with basic auth. Wrong credentials then fail the first GET.
        if resp.status not in (200, 201, 202, 204):
            return f"HTTP {resp.status}"
        token = resp.getheader("X-Auth-Token")
        location = resp.getheader("Location")
        if not location:
            try:
                location = _json(resp).get("@odata.id")
            except BmcError:
                location = None
        if not token or not isinstance(location, str) or not location:
            return "no X-Auth-Token" if not token else "no session Location"
        self._client.set_session_key(token)
        self._session_location = resource_path(location)
        return None

    def get(self, path: str, *, expand: bool = False) -> Resource:
        """GET a resource; BmcError for anything but a 2xx with a JSON object body."""
        args = {"$expand": ".($levels=1)"} if expand else None
        resp = self._request("GET", path, args=args)
        if resp.status == 401 and self.auth == "session":
            # A BMC reboot or an idle timeout ends sessions: log in again once, then retry.
            self._client.set_session_key(None)
            self._login()
            resp = self._request("GET", path, args=args)
        self._check(resp, "GET", path)
        body = _json(resp)
        etag = resp.getheader("ETag") or body.get("@odata.etag") or ""
        return Resource(path, body, str(etag))

    def patch(self, path: str, body: dict[str, Any], *, etag: str = "") -> int:
        """PATCH `body` to `path` with If-Match when an ETag is known; return the HTTP status (2xx)."""
        headers = {"If-Match": etag} if etag else None
        resp = self._request("PATCH", path, body=body, headers=headers)
        if resp.status == 412:
            raise BmcError(
                f"PATCH {path}: the resource changed since it was read (ETag {etag} no longer matches)",
                kind="http",
                status=412,
            )
        self._check(resp, "PATCH", path)
        return int(resp.status)

    def _check(self, resp: Any, method: str, path: str) -> None:
        status = int(resp.status)
        if 200 <= status < 300:
            return
        if status == 401:
            what = "no credentials were given" if self.auth == "" else "the credentials were refused"
            raise BmcError(f"{method} {path}: HTTP {status} ({what})", kind="auth", status=status)
        detail = _error_message(resp)
        if status == 403:
            # Logged in, but this user may not touch this resource (a read-only role and the BIOS,
            # say): that costs this resource, not the poll, so it is no "auth" (fatal) error.
            who = "anonymous access" if self.auth == "" else "the BMC user lacks the privilege"
            detail = f"forbidden: {who}" + (f"; {detail}" if detail else "")
        raise BmcError(
            f"{method} {path}: HTTP {status}{': ' + detail if detail else ''}", kind="http", status=status
        )

    def _request(
        self,
        method: str,
        path: str,
        *,
        args: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        if self._client is None:
            raise BmcError(f"BMC {self.endpoint.base}: not connected", kind="unreachable")
        if not path.startswith("/"):
            # Appended to the base URL, "redfish/v1/x" or "@host/x" would name another host (and
            # carry the session token there): a malformed link from the BMC, not sent anywhere.
            raise BmcError(f"{method} {path!r}: a link that is not an absolute path", kind="malformed")
        ep = self.endpoint
        budget, by_poll = ep.request_budget, False
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise BmcError(self._late(method, path, by_poll=True), kind="timeout")
            budget, by_poll = min(budget, left), left < budget
        self.requests += 1
        watch = self._watch = Watch().start(budget)
        try:
            resp = self._send(method, path, args, body, headers)
        except BmcError as exc:
            if watch.expired:
                raise BmcError(self._late(method, path, by_poll=by_poll), kind="timeout") from exc
            raise
        finally:
            watch.done()
            self._watch = None
        if watch.expired:  # a cut answer may have read as a short one: a timeout all the same
            raise BmcError(self._late(method, path, by_poll=by_poll), kind="timeout")
        return resp

    def _late(self, method: str, path: str, *, by_poll: bool) -> str:
        where = f"{method} {self.endpoint.base}{path}"
        if by_poll:
            return f"{where}: the poll ran past its deadline of {self.deadline_seconds:g} s"
        return f"{where}: no complete answer within {self.endpoint.request_budget:g} s"

    def interrupt(self) -> None:
        """From another thread: end the request in flight now and refuse further ones (the poll
        was abandoned); the next `open()` or poll deadline starts afresh."""
        self.deadline, watch = time.monotonic(), self._watch
        if watch is not None:
            watch.cut()

    def _send(
        self,
        method: str,
        path: str,
        args: dict[str, str] | None,
        body: dict[str, Any] | None,
        headers: dict[str, str] | None,
    ) -> Any:
        ep = self.endpoint
        try:
            if method == "GET":
                return self._client.get(path, args=args, headers=headers)
            if method == "POST":
                return self._client.post(path, body=body, headers=headers)
            if method == "PATCH":
                return self._client.patch(path, body=body, headers=headers)
            return self._client.delete(path, headers=headers)
        except RetriesExhaustedError as exc:
            raise _transport_error(exc.__cause__, method, path, ep) from exc
        except JsonDecodingError as exc:
            raise BmcError(f"{method} {path}: the BMC answered with invalid JSON", kind="malformed") from exc
        except (InvalidCredentialsError, SessionCreationError) as exc:
            raise BmcError(f"{method} {path}: {exc}", kind="auth") from exc

    def close(self) -> None:
        """Log out of the session (if any) and drop connections; failures are logged, never raised."""
        if self._client is None:
            return
        self.deadline = None  # the logout gets its own request deadline, whatever the poll's was
        if self.auth == "session" and self._session_location:
            try:
                resp = self._request("DELETE", self._session_location)
                if resp.status not in (200, 202, 204):
                    log.info("BMC %s: logout answered HTTP %s", self.endpoint.base, resp.status)
            except BmcError as exc:
                log.info("BMC %s: logout failed: %s", self.endpoint.base, exc)
        self._drop_client()

    def abandon(self) -> None:
        """Drop the connection without logging out (the BMC is not answering; its session expires)."""
        self._drop_client()

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        self._session_location = ""
        self.auth = ""
        if client is not None:
            client._session.close()  # the library's requests.Session; its own logout() would DELETE again


def _parse(resp: Any) -> Any:
    """The response body as JSON ({} when empty). Parsed here rather than by `resp.dict`, which
    logs the whole body at error level when it is not JSON."""
    raw = resp.text
    return json.loads(raw) if raw.strip() else {}


def _basic(creds: Credentials) -> str:
    return "Basic " + base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()


def _json(resp: Any) -> dict[str, Any]:
    try:
        body = _parse(resp)
    except ValueError as exc:
        raise BmcError(f"{resp.request.path}: the BMC answered with invalid JSON", kind="malformed") from exc
    if not isinstance(body, dict):
        raise BmcError(
            f"{resp.request.path}: expected a JSON object, got {type(body).__name__}", kind="malformed"
        )
    return body


def _error_message(resp: Any) -> str:
    """The Redfish error message of a failed response, if it carries one."""
    try:
        body = _parse(resp)
    except ValueError:
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return ""
    info = error.get("@Message.ExtendedInfo")
    if isinstance(info, list) and info and isinstance(info[0], dict) and info[0].get("Message"):
        return str(info[0]["Message"])[:200]
    return str(error.get("message", ""))[:200]


def _transport_error(cause: BaseException | None, method: str, path: str, ep: BmcEndpoint) -> BmcError:
    where = f"{method} {ep.base}{path}"
    if isinstance(cause, requests.exceptions.SSLError):
        hint = "; give bmc.ca_bundle (--ca-bundle) for a private CA" if not ep.ca_bundle else ""
        return BmcError(f"{where}: TLS verification failed{hint}: {_short(cause)}", kind="tls")
    if isinstance(cause, requests.exceptions.ConnectTimeout):
        return BmcError(f"{where}: no connection within {ep.connect_timeout_seconds:g} s", kind="timeout")
    if isinstance(cause, requests.exceptions.ReadTimeout):
        return BmcError(f"{where}: no answer within {ep.read_timeout_seconds:g} s", kind="timeout")
    if isinstance(cause, requests.exceptions.ConnectionError):
        return BmcError(f"{where}: cannot connect: {_short(cause)}", kind="unreachable")
    return BmcError(f"{where}: {_short(cause) or 'request failed'}", kind="unreachable")


def _short(exc: BaseException | None) -> str:
    """The useful part of a requests/urllib3 error, without the connection pool's wrapping."""
    text = str(exc or "")
    for marker in ("[SSL", "[Errno", "Read timed out", "timed out"):
        if marker in text:
            text = text[text.index(marker) :]
            break
    return text.split(" (_ssl.c")[0].strip(" ()'\"")[:200]
