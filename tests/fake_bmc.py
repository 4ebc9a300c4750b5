"""FakeBmcServer: our own small Redfish server, for the shapes and faults sushy-tools cannot give.

It serves a fixture tree the way sushy-static does (GET /redfish/v1/<path> answers
<tree>/<path>/index.json; the query string is recorded but ignored for the lookup), over threaded
HTTP/1.1 on 127.0.0.1, port 0. Knobs a test may set at any time, before or between requests:

- `delay_seconds`: a float for every path, or {pattern: seconds}; sleeps before answering.
- `status_for`: {pattern: status}; matching requests answer that status with a Redfish error body.
- `malformed`: {pattern}; matching GETs answer 200 with invalid JSON.
- `require_auth`: (user, password); then everything but GET of the service root and the session
  login answers 401 unless it carries that basic auth or a live X-Auth-Token.
- `noncompliant_sessions`: session login answers 204 with neither token nor Location.
- `reject_apply_time`: a PATCH carrying @Redfish.SettingsApplyTime answers 400 (PropertyUnknown)
  and writes nothing, as some vendors' BMCs do although they list SupportedApplyTimes.

Patterns are fnmatch globs matched against the path without query or trailing slash, e.g.
"/redfish/v1/Chassis/*/Sensors*" ('*' also crosses '/'). Faults win over everything else.

Every GET answers an ETag (a quoted hash of the resource); a PATCH whose If-Match differs answers
412, otherwise the body is deep-merged into the file (so a Bios/Settings PATCH merges Attributes)
and answers 204. PATCH writes into the tree: serve a copy (the `fake_bmc` fixture does).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fnmatch
import hashlib
import itertools
import json
import secrets
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, cast
from urllib.parse import unquote, urlsplit

ROOT = "/redfish/v1"
SESSIONS = f"{ROOT}/SessionService/Sessions"

# MessageIds from the DMTF Base registry, so clients that surface them print something real.
_MESSAGE_IDS = {
    400: "Base.1.8.MalformedJSON",
    401: "Base.1.8.NoValidSession",
    404: "Base.1.8.ResourceMissingAtURI",
    405: "Base.1.8.OperationNotAllowed",
    412: "Base.1.8.PreconditionFailed",
    500: "Base.1.8.InternalError",
    503: "Base.1.8.ServiceTemporarilyUnavailable",
}


class RecordedRequest(NamedTuple):
    """One request as received: path without query or trailing slash, query percent-decoded,
    header names lower-cased (HTTP clients disagree on their case)."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    token: str
    user: str

    @property
    def path(self) -> str:
        return f"{SESSIONS}/{self.id}"


def redfish_error(status: int, message: str, message_id: str = "") -> bytes:
    """A Redfish error body (DSP0266 "error" object) for `status`."""
    message_id = message_id or _MESSAGE_IDS.get(status, "Base.1.8.GeneralError")
    info = {"@odata.type": "#Message.v1_1_1.Message", "MessageId": message_id, "Message": message}
    error = {"code": message_id, "message": message, "@Message.ExtendedInfo": [info]}
    return json.dumps({"error": error}).encode()


def resource_etag(content: bytes) -> tuple[Any, str]:
    """Parse a resource file and return (document, quoted ETag).

    The hash leaves out "@odata.etag" so the served annotation can carry the same value as the
    header, as the spec wants; a file that is not JSON is hashed as raw bytes.
    """
    try:
        doc = json.loads(content)
    except ValueError:
        return None, '"' + hashlib.sha256(content).hexdigest()[:20] + '"'
    hashed = {k: v for k, v in doc.items() if k != "@odata.etag"} if isinstance(doc, dict) else doc
    canonical = json.dumps(hashed, sort_keys=True).encode()
    return doc, '"' + hashlib.sha256(canonical).hexdigest()[:20] + '"'


def deep_merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """Redfish PATCH semantics: nested objects merge, anything else replaces."""
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), dict):
            deep_merge(target[key], value)
        else:
            target[key] = value


def _matches(path: str, patterns: Mapping[str, Any] | set[str]) -> list[str]:
    return [p for p in patterns if fnmatch.fnmatchcase(path, p)]


class FakeBmcServer:
    """A threaded Redfish server over `tree`; use as a context manager or start()/stop()."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree
        self.delay_seconds: float | dict[str, float] = 0.0
        self.status_for: dict[str, int] = {}
        self.malformed: set[str] = set()
        self.require_auth: tuple[str, str] | None = None
        self.noncompliant_sessions = False
        self.root_requires_auth = False  # against the standard, as some BMCs do
        self.reject_apply_time = False
        self.requests: list[RecordedRequest] = []
        self.sessions: dict[str, Session] = {}
        self.logouts: list[str] = []  # session paths deleted, in order
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._ids = itertools.count(1)
        self._http: _HttpServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._http is not None, "FakeBmcServer is not started"
        return int(self._http.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeBmcServer:
        self._http = http = _HttpServer(self)
        # A short poll interval: shutdown() waits for it, and every test stops a server.
        self._thread = threading.Thread(
            target=http.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-bmc", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listener and every open connection, so the port is free and clients see EOF."""
        if self._http is None:
            return
        self.stopping.set()  # wakes handlers sleeping in a delay
        self._http.shutdown()
        self._http.server_close()
        self._http.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeBmcServer:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def paths(self, method: str | None = None) -> list[str]:
        """Paths requested so far (of one method if given), for terse assertions."""
        return [r.path for r in self.requests if method is None or r.method == method]

    def resource_file(self, path: str) -> Path | None:
        if path != ROOT and not path.startswith(ROOT + "/"):
            return None
        file = self.tree / path[len(ROOT) :].lstrip("/") / "index.json"
        return file if file.is_file() else None

    def delay_for(self, path: str) -> float:
        if isinstance(self.delay_seconds, Mapping):
            return max((self.delay_seconds[p] for p in _matches(path, self.delay_seconds)), default=0.0)
        return self.delay_seconds

    def authorized(self, headers: Mapping[str, str]) -> bool:
        if self.require_auth is None:
            return True
        token = headers.get("x-auth-token")
        if token and any(s.token == token for s in list(self.sessions.values())):
            return True
        scheme, _, encoded = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return (user, password) == self.require_auth

    def login(self, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        if self.noncompliant_sessions:
            return 204, b"", {}
        try:
            creds = json.loads(body)
            user, password = str(creds["UserName"]), str(creds["Password"])
        except (ValueError, KeyError, TypeError):
            return 400, redfish_error(400, "UserName and Password are required"), {}
        if self.require_auth is not None and (user, password) != self.require_auth:
            return 401, redfish_error(401, "Invalid credentials"), {}
        with self.lock:
            session = Session(str(next(self._ids)), secrets.token_hex(16), user)
            self.sessions[session.id] = session
        headers = {"X-Auth-Token": session.token, "Location": session.path}
        return 201, json.dumps(self.session_doc(session)).encode(), headers

    def logout(self, path: str) -> tuple[int, bytes]:
        session_id = path.rsplit("/", 1)[-1]
        with self.lock:
            if self.sessions.pop(session_id, None) is None:
                return 404, redfish_error(404, f"no session at {path}")
            self.logouts.append(path)
        return 204, b""

    def session_doc(self, session: Session) -> dict[str, Any]:
        return {
            "@odata.id": session.path,
            "@odata.type": "#Session.v1_6_0.Session",
            "Id": session.id,
            "Name": f"Session {session.id}",
            "UserName": session.user,
        }

    def sessions_doc(self) -> dict[str, Any]:
        members = [{"@odata.id": s.path} for s in self.sessions.values()]
        return {
            "@odata.id": SESSIONS,
            "@odata.type": "#SessionCollection.SessionCollection",
            "Name": "Session Collection",
            "Members": members,
            "Members@odata.count": len(members),
        }

    def patch(self, path: str, body: bytes, if_match: str | None) -> tuple[int, bytes, dict[str, str]]:
        file = self.resource_file(path)
        if file is None:
            return 404, redfish_error(404, f"{path} not found"), {}
        try:
            change = json.loads(body)
        except ValueError:
            change = None
        if not isinstance(change, dict):
            return 400, redfish_error(400, "PATCH body must be a JSON object"), {}
        if self.reject_apply_time and "@Redfish.SettingsApplyTime" in change:
            unknown = "The property @Redfish.SettingsApplyTime is not in the list of valid properties"
            return 400, redfish_error(400, unknown, "Base.1.8.PropertyUnknown"), {}
        with self.lock:  # check-then-write must not interleave with another PATCH
            doc, etag = resource_etag(file.read_bytes())
            accepted = {tag.strip() for tag in (if_match or "").split(",")}
            if if_match is not None and not accepted & {etag, "*"}:
                return 412, redfish_error(412, f"If-Match {if_match} does not match {etag}"), {}
            deep_merge(doc, change)
            content = (json.dumps(doc, indent=4) + "\n").encode()
            file.write_bytes(content)
        return 204, b"", {"ETag": resource_etag(content)[1]}


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, bmc: FakeBmcServer) -> None:
        self.bmc = bmc
        self.connections: set[socket.socket] = set()
        super().__init__(("127.0.0.1", 0), _Handler)

    def close_connections(self) -> None:
        with self.bmc.lock:
            open_now = list(self.connections)
        for conn in open_now:
            with contextlib.suppress(OSError):  # already closed by the client
                conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out and hung up is what the slow tests are for; stay quiet.
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like a real BMC; every answer sets Content-Length
    timeout = 10  # idle keep-alive connections must not outlive a test for long
    # Headers and body go out in separate writes; with Nagle's algorithm on, each answer then
    # waits for the client's delayed ACK (~40 ms), which made every poll take seconds.
    disable_nagle_algorithm = True

    @property
    def bmc(self) -> FakeBmcServer:
        return cast(_HttpServer, self.server).bmc

    def setup(self) -> None:
        super().setup()
        with self.bmc.lock:
            cast(_HttpServer, self.server).connections.add(self.connection)

    def finish(self) -> None:
        with self.bmc.lock:
            cast(_HttpServer, self.server).connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # `requests` is the log

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        bmc = self.bmc
        split = urlsplit(self.path)
        path = split.path.rstrip("/") or "/"
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with bmc.lock:
            bmc.requests.append(RecordedRequest(method, path, unquote(split.query), headers, body))
        if bmc.stopping.wait(bmc.delay_for(path)):
            return  # stopped while sleeping: the connection is being torn down
        faults = _matches(path, bmc.status_for)
        if faults:
            status = bmc.status_for[faults[0]]
            self._send(status, redfish_error(status, f"injected {status} for {path}"))
        elif method == "GET" and _matches(path, bmc.malformed):
            self._send(200, b'{"@odata.id": "' + path.encode() + b'", "Name": ')
        elif method == "POST" and path == SESSIONS:
            self._send(*bmc.login(body))
        elif (bmc.root_requires_auth or not (method == "GET" and path == ROOT)) and not bmc.authorized(
            headers
        ):
            challenge = {"WWW-Authenticate": 'Basic realm="fake-bmc"'}
            self._send(401, redfish_error(401, "authentication required"), challenge)
        elif method == "GET":
            self._get(path)
        elif method == "PATCH":
            self._send(*bmc.patch(path, body, headers.get("if-match")))
        elif method == "DELETE" and path.startswith(SESSIONS + "/"):
            self._send(*bmc.logout(path))
        elif method == "POST":
            self._send(204)  # an action: accepted, and `requests` shows what was asked
        else:
            self._send(405, redfish_error(405, f"{method} not allowed on {path}"))

    def _get(self, path: str) -> None:
        bmc = self.bmc
        session = bmc.sessions.get(path.rsplit("/", 1)[-1]) if path.startswith(SESSIONS + "/") else None
        if path == SESSIONS or session is not None:
            doc = bmc.sessions_doc() if session is None else bmc.session_doc(session)
            self._send(200, json.dumps(doc).encode())
            return
        file = bmc.resource_file(path)
        if file is None:
            self._send(404, redfish_error(404, f"{path} not found"))
            return
        content = file.read_bytes()
        doc, etag = resource_etag(content)
        if isinstance(doc, dict) and "@odata.etag" in doc:
            doc["@odata.etag"] = etag  # header and annotation agree, as DSP0266 asks
            content = json.dumps(doc, indent=4).encode()
        self._send(200, content, {"ETag": etag})

    def _send(self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("OData-Version", "4.0")
        if status != 204:  # RFC 9110: no Content-Length on 204
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if body and status != 204:
            self.wfile.write(body)
