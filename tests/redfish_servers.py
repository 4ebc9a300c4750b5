"""Redfish servers for the BMC tests: sushy-tools processes, our FakeBmcServer, TLS files.

Every fixture here is function-scoped, binds 127.0.0.1 only, and is registered for all tests by
tests/conftest.py. Server processes log stdout and stderr to a file under tmp_path
(`RunningServer.log_text()`): sushy-static prints each request's headers and body there, which is
the only way to see what a client sent it, since it answers POST and PATCH with 204 and keeps
nothing.

    def test_x(sushy_static_server, tls_files):
        server = sushy_static_server(HGX_NODE, tls=tls_files)   # https, CA in tls_files.ca_pem
    def test_y(dmtf_mockup): ...                                 # DMTF public-rackmount1
    def test_z(sushy_emulator):
        server = sushy_emulator(users={"admin": "secret"})       # 401 without basic auth
    def test_w(fake_bmc):
        bmc = fake_bmc(HGX_NODE); bmc.status_for["*/Sensors*"] = 503
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import itertools
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from tests.fake_bmc import FakeBmcServer, RecordedRequest
from tests.support import free_port, require

__all__ = [
    "DMTF_RACKMOUNT",
    "HGX_NODE",
    "LEGACY_ONLY",
    "FakeBmcServer",
    "RecordedRequest",
    "RunningServer",
    "TlsFiles",
    "make_tls_files",
    "serve_emulator",
    "serve_static",
]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "redfish"
HGX_NODE = FIXTURES / "hgx-node"
LEGACY_ONLY = FIXTURES / "legacy-only"
# shared/ sits beside the repository (CI clones main with shared/ next to it).
MOCKUPS = Path(__file__).resolve().parents[1].parent / "shared" / "redfish-mockups"
DMTF_RACKMOUNT = MOCKUPS / "public-rackmount1"

START_TIMEOUT_SECONDS = 20.0
SLOW_DELAY_SECONDS = 2.0  # `slow_bmc`: point a client with a shorter timeout at it

_copies = itertools.count(1)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A throwaway CA and a server certificate for 127.0.0.1 (IP SAN), as PEM files."""

    ca_pem: Path
    cert_pem: Path
    key_pem: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """Write a fresh CA and a 127.0.0.1 server certificate (with its chain) under `directory`."""
    # Imported here so a missing install stops only the TLS tests (skip locally, fail in CI).
    require(importlib.util.find_spec("trustme") is not None, "trustme missing: pip install -e '.[test]'")
    import trustme

    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")  # trustme makes an IP SAN for an address
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    ca.cert_pem.write_to_path(str(files.ca_pem))
    cert.private_key_pem.write_to_path(str(files.key_pem))
    cert.cert_chain_pems[0].write_to_path(str(files.cert_pem))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(files.cert_pem), append=True)
    return files


@dataclass(slots=True)
class RunningServer:
    """A server process on 127.0.0.1; `tree` is what sushy-static serves (None for the emulator)."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    tree: Path | None = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Terminate, then kill if it lingers; the port is free once this returns."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def copy_tree(tree: Path, into: Path) -> Path:
    """Copy a fixture tree under `into`, since servers may write PATCHes into what they serve."""
    dest = into / f"{tree.name}-{next(_copies)}"
    shutil.copytree(tree, dest)
    return dest


def binary(name: str) -> Path:
    """A console script of the venv running the tests (sys.executable is not resolved on purpose:
    resolving a venv's python leads to the base interpreter's bin)."""
    path = Path(sys.executable).parent / name
    require(path.exists(), f"{name} not found beside {sys.executable}: pip install -e '.[test]'")
    return path


def _answers(url: str, context: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/redfish/v1/", timeout=2, context=context) as reply:
            return int(reply.status) == 200
    except (OSError, http.client.HTTPException):  # not up yet, or up but still starting
        return False


@contextlib.contextmanager
def _serve(argv: list[str], name: str, log_dir: Path, tls: TlsFiles | None) -> Iterator[RunningServer]:
    """Start `argv` + ["-i", "127.0.0.1", "-p", port], wait for GET /redfish/v1/, stop on exit."""
    scheme = "https" if tls else "http"
    context = ssl.create_default_context(cafile=str(tls.ca_pem)) if tls else None
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # else request logs sit in a buffer until exit
    for _attempt in range(3):  # free_port() can race with another process taking the port
        port = free_port()
        log_path = log_dir / f"{name}-{port}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [*argv, "-i", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        server = RunningServer(f"{scheme}://127.0.0.1:{port}", port, process, log_path)
        try:
            deadline = time.monotonic() + START_TIMEOUT_SECONDS
            while process.poll() is None and not _answers(server.url, context):
                if time.monotonic() > deadline:
                    pytest.fail(f"{name} did not answer in {START_TIMEOUT_SECONDS}s:\n{server.log_text()}")
                time.sleep(0.05)
            if process.poll() is None:
                yield server
                return
            if "Address already in use" not in server.log_text():
                pytest.fail(f"{name} exited with {process.returncode}:\n{server.log_text()}")
        finally:
            server.stop()
    pytest.fail(f"{name}: no free port after 3 attempts")


@contextlib.contextmanager
def serve_static(tree: Path, log_dir: Path, tls: TlsFiles | None = None) -> Iterator[RunningServer]:
    """sushy-static over `tree` (served in place: it never writes); https when `tls` is given."""
    argv = [str(binary("sushy-static")), "-m", str(tree)]
    if tls:
        argv += ["-c", str(tls.cert_pem), "-k", str(tls.key_pem)]
    with _serve(argv, "sushy-static", log_dir, tls) as server:
        server.tree = tree
        yield server


@contextlib.contextmanager
def serve_emulator(work_dir: Path, users: Mapping[str, str] | None = None) -> Iterator[RunningServer]:
    """sushy-emulator with its fake driver, its own state dir and, given `users`, basic auth."""
    import bcrypt  # a sushy-tools dependency; it checks only bcrypt hashes

    work_dir.mkdir(parents=True, exist_ok=True)
    settings = [f"SUSHY_EMULATOR_STATE_DIR = {str(work_dir / 'state')!r}"]
    if users:
        # rounds=4, the minimum: sushy checks the hash on every request, and speed is all we need.
        salt = bcrypt.gensalt(rounds=4)
        lines = [f"{user}:{bcrypt.hashpw(pw.encode(), salt).decode()}" for user, pw in users.items()]
        htpasswd = work_dir / "htpasswd"
        htpasswd.write_text("\n".join(lines) + "\n")
        settings.append(f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}")
    config = work_dir / "emulator.conf"
    config.write_text("\n".join(settings) + "\n")
    argv = [str(binary("sushy-emulator")), "--fake", "--config", str(config)]
    with _serve(argv, "sushy-emulator", work_dir, None) as server:
        yield server


class StaticServerFactory(Protocol):
    def __call__(self, tree: Path, tls: TlsFiles | None = None) -> RunningServer: ...


class EmulatorFactory(Protocol):
    def __call__(self, users: Mapping[str, str] | None = None) -> RunningServer: ...


class FakeBmcFactory(Protocol):
    def __call__(self, tree: Path = HGX_NODE) -> FakeBmcServer: ...


@pytest.fixture
def sushy_static_server(tmp_path: Path) -> Iterator[StaticServerFactory]:
    """Factory: `sushy_static_server(tree, tls=None)` starts sushy-static over `tree` (in place)."""
    with contextlib.ExitStack() as stack:

        def start(tree: Path, tls: TlsFiles | None = None) -> RunningServer:
            return stack.enter_context(serve_static(tree, tmp_path, tls))

        yield start


@pytest.fixture
def dmtf_mockup(sushy_static_server: StaticServerFactory, tmp_path: Path) -> RunningServer:
    """sushy-static over a copy of DMTF's public-rackmount1 mockup (from ../shared)."""
    require(DMTF_RACKMOUNT.is_dir(), f"DMTF mockup missing: {DMTF_RACKMOUNT}")
    return sushy_static_server(copy_tree(DMTF_RACKMOUNT, tmp_path))


@pytest.fixture
def sushy_emulator(tmp_path: Path) -> Iterator[EmulatorFactory]:
    """Factory: `sushy_emulator(users={"admin": "pw"})`; no users means no auth at all."""
    with contextlib.ExitStack() as stack:

        def start(users: Mapping[str, str] | None = None) -> RunningServer:
            work_dir = tmp_path / f"emulator-{next(_copies)}"
            return stack.enter_context(serve_emulator(work_dir, users))

        yield start


@pytest.fixture
def tls_files(tmp_path: Path) -> TlsFiles:
    return make_tls_files(tmp_path / "tls")


@pytest.fixture
def fake_bmc(tmp_path: Path) -> Iterator[FakeBmcFactory]:
    """Factory: `fake_bmc(tree=HGX_NODE)` serves a copy of `tree`; set its knobs after starting."""
    with contextlib.ExitStack() as stack:

        def start(tree: Path = HGX_NODE) -> FakeBmcServer:
            return stack.enter_context(FakeBmcServer(copy_tree(tree, tmp_path)))

        yield start


@pytest.fixture
def hgx_bmc(fake_bmc: FakeBmcFactory) -> FakeBmcServer:
    """FakeBmcServer over a copy of the 8-GPU HGX node tree."""
    return fake_bmc(HGX_NODE)


@pytest.fixture
def slow_bmc(fake_bmc: FakeBmcFactory) -> FakeBmcServer:
    """The HGX node answering every request after SLOW_DELAY_SECONDS; teardown does not wait."""
    bmc = fake_bmc(HGX_NODE)
    bmc.delay_seconds = SLOW_DELAY_SECONDS
    return bmc


@pytest.fixture
def unreachable_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens: connections are refused at once."""
    return f"http://127.0.0.1:{free_port()}"
