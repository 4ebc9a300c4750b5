"""protos/transport.py: the PEM files a TLS set-up reads, how a rotation is seen, and which node a
certificate speaks for (its DNS subjectAltNames, never its common name)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trustme

from protos.transport import ClientTls, TransportError, files_signature, node_names, read_pem


def test_node_names_are_the_dns_sans_in_lower_case() -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("GPU-Node-07", "node-07.example", "10.0.0.7", common_name="someone-else")
    assert node_names(cert.cert_chain_pems[0].bytes()) == ["gpu-node-07", "node-07.example"]


def test_a_certificate_without_dns_sans_speaks_for_no_node() -> None:
    cert = trustme.CA().issue_cert("10.0.0.7", common_name="node-07")
    assert node_names(cert.cert_chain_pems[0].bytes()) == []


def test_unusable_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(TransportError, match=r"cannot read CA file .*missing\.pem"):
        read_pem(str(tmp_path / "missing.pem"), "CA file")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(TransportError, match=r"CA file .*junk\.pem is not a PEM file"):
        ClientTls(ca=str(junk), cert=str(junk), key=str(junk)).credentials()
    ca = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca))
    with pytest.raises(TransportError, match=r"certificate .*junk\.pem is not a PEM file"):
        ClientTls(ca=str(ca), cert=str(junk), key=str(junk)).credentials()
    assert ClientTls(ca=str(ca)).credentials() is not None


def test_a_rotation_changes_the_signature(tmp_path: Path) -> None:
    path = tmp_path / "cert.pem"
    path.write_text("one")
    before = files_signature([str(path), None])
    assert before[1] == (0, 0, 0)
    path.write_text("two, longer")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert files_signature([str(path), None]) != before
    assert files_signature([str(tmp_path / "gone.pem")]) == ((0, 0, 0),)


def test_a_rename_over_the_file_is_seen_with_the_same_time_and_size(tmp_path: Path) -> None:
    """How a Kubernetes Secret volume updates: a new file moved over the old one."""
    path, new = tmp_path / "tokens.yaml", tmp_path / "tokens.yaml.new"
    path.write_text("same size 1")
    new.write_text("same size 2")
    st = path.stat()
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    keep = new.stat().st_ino  # the new file stays alive under its new name: a fresh inode for sure
    before = files_signature([str(path)])
    os.replace(new, path)
    assert path.stat().st_ino == keep
    assert files_signature([str(path)]) != before
