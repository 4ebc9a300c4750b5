"""Basic auth and TLS on both /metrics servers, through real servers on 127.0.0.1 and a web-config file."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest
import trustme

from tests.security.metrics_servers import KINDS, Pki, bcrypt_hash, get, serve


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki.make(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_basic_auth_right_wrong_and_missing(kind: str, tmp_path: Path) -> None:
    config = _write(tmp_path / "web.yml", f"basic_auth_users:\n  prom: '{bcrypt_hash('s3cret')}'\n")
    with serve(kind, config) as running:
        missing = get(running)
        assert missing.status == 401
        assert missing.headers["WWW-Authenticate"].startswith("Basic")
        assert b"up 1" not in missing.body
        for user, password in (("prom", "wrong"), ("nobody", "s3cret"), ("prom", "")):
            answer = get(running, auth=(user, password))
            assert answer.status == 401, (user, password)
            assert answer.headers["WWW-Authenticate"].startswith("Basic")
        ok = get(running, auth=("prom", "s3cret"))
        assert ok.status == 200 and b"up 1" in ok.body
        # Cached success: the next scrape too; a wrong password after a right one is still wrong.
        assert get(running, auth=("prom", "s3cret")).status == 200
        assert get(running, auth=("prom", "s3cret!")).status == 401
        assert get(running, "/", auth=None).status == 401  # the index too


@pytest.mark.parametrize("kind", KINDS)
def test_tls_scrape_with_the_servers_ca(kind: str, pki: Pki) -> None:
    config = _write(pki.dir / "web.yml", pki.tls_block())
    with serve(kind, config) as running:
        assert running.scheme == "https"
        answer = get(running, context=pki.client_context())
        assert answer.status == 200 and b"up 1" in answer.body
        with pytest.raises(ssl.SSLCertVerificationError):
            get(running, context=pki.client_context(ca=trustme.CA()))  # a CA that did not sign it
        with pytest.raises(ConnectionError):  # plaintext to the TLS port: no answer
            get(running)


@pytest.mark.parametrize("kind", KINDS)
def test_client_certificate_required(kind: str, pki: Pki) -> None:
    config = _write(pki.dir / "web.yml", pki.tls_block("RequireAndVerifyClientCert"))
    with serve(kind, config) as running:
        answer = get(running, context=pki.client_context(cert=pki.client))
        assert answer.status == 200 and b"up 1" in answer.body
        stranger = trustme.CA().issue_cert("prometheus")
        for context in (pki.client_context(), pki.client_context(cert=stranger)):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                get(running, context=context)
        assert get(running, context=pki.client_context(cert=pki.client)).status == 200  # it lives on


@pytest.mark.parametrize("kind", KINDS)
def test_tls_and_basic_auth_together(kind: str, pki: Pki) -> None:
    text = pki.tls_block() + f"basic_auth_users:\n  prom: '{bcrypt_hash('pw')}'\n"
    config = _write(pki.dir / "web.yml", text)
    with serve(kind, config) as running:
        assert get(running, context=pki.client_context()).status == 401
        answer = get(running, context=pki.client_context(), auth=("prom", "pw"))
        assert answer.status == 200 and b"up 1" in answer.body


@pytest.mark.parametrize("kind", KINDS)
def test_rotated_certificate_and_users_apply_to_the_next_connection(kind: str, pki: Pki) -> None:
    web = pki.dir / "web.yml"
    _write(web, pki.tls_block() + f"basic_auth_users:\n  prom: '{bcrypt_hash('old')}'\n")
    with serve(kind, str(web)) as running:
        assert get(running, context=pki.client_context(), auth=("prom", "old")).status == 200
        new_ca = trustme.CA()
        pki.issue_server(new_ca)
        _bump(pki.dir / "server.pem", pki.dir / "server.key")
        assert get(running, context=pki.client_context(ca=new_ca), auth=("prom", "old")).status == 200
        with pytest.raises(ssl.SSLCertVerificationError):
            get(running, context=pki.client_context(), auth=("prom", "old"))
        _write(web, pki.tls_block() + f"basic_auth_users:\n  prom: '{bcrypt_hash('new')}'\n")
        _bump(web)
        context = pki.client_context(ca=new_ca)
        assert get(running, context=context, auth=("prom", "old")).status == 401  # the cache went too
        assert get(running, context=context, auth=("prom", "new")).status == 200
        # A broken edit keeps what was in force.
        _write(web, "basic_auth_users:\n  prom: not-a-hash\n")
        _bump(web)
        assert get(running, context=context, auth=("prom", "new")).status == 200


def _bump(*paths: Path) -> None:
    """Move the files' mtime on, so a rewrite within the clock's granularity still shows."""
    for path in paths:
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
