"""The controller's certificates follow their files: a new CA's files take effect without a restart; a
broken or half-done rotation keeps the certificates in use; unusable files at start stop it in one line."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

import grpc
import pytest

from controller.security.tls import ServerTls
from protos.transport import TransportError
from tests.controller.harness import frame, hello
from tests.security.tls_files import (
    Pki,
    Refused,
    ServerFiles,
    controller_config,
    stream_one_frame,
    tls_controller,
)

START_TIMEOUT_SECONDS = 20.0


def install(source: str, target: str) -> None:
    """Replace `target` with a copy of `source` in one step, as a Secret update does."""
    shutil.copyfile(source, f"{target}.new")
    os.replace(f"{target}.new", target)


def live_files(tmp_path: Path, files: ServerFiles) -> ServerFiles:
    live = ServerFiles(*(str(tmp_path / f"live-{leaf}") for leaf in ("cert.pem", "key.pem", "client-ca.pem")))
    rotate(files, live)
    return live


def rotate(source: ServerFiles, live: ServerFiles) -> None:
    install(source.key, live.key)
    install(source.cert, live.cert)
    install(source.client_ca, live.client_ca)


def test_new_files_take_effect_without_a_restart(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old, new = Pki(tmp_path, "old"), Pki(tmp_path, "new")
    live = live_files(tmp_path, old.server())
    old_client, new_client = old.client("n1"), new.client("n1")

    async def scenario() -> None:
        async with tls_controller(controller_config(live)) as ctl:
            assert (await stream_one_frame(ctl.address, old_client, hello("n1"), frame(1))).ack.seq == 1
            with pytest.raises(Refused):
                await stream_one_frame(ctl.address, new_client, hello("n1"), frame(2))
            rotate(new.server(), live)
            assert (await stream_one_frame(ctl.address, new_client, hello("n1"), frame(2))).ack.seq == 2
            with pytest.raises(Refused) as refused:  # the old CA is trusted no more
                await stream_one_frame(ctl.address, old_client, hello("n1"), frame(3))
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE

    with caplog.at_level(logging.INFO, logger="gpufleet.controller.tls"):
        asyncio.run(scenario())
    assert any("TLS certificates reloaded" in r.getMessage() for r in caplog.records)


def test_a_broken_or_half_done_rotation_keeps_the_certificates_in_use(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = Pki(tmp_path, "old"), Pki(tmp_path, "new")
    live = live_files(tmp_path, old.server())
    client = old.client("n1")
    upcoming = new.server()

    async def scenario() -> None:
        async with tls_controller(controller_config(live)) as ctl:
            Path(live.cert).write_text("not a certificate\n")
            assert (await stream_one_frame(ctl.address, client, hello("n1"), frame(1))).ack.seq == 1
            install(upcoming.cert, live.cert)  # the new certificate has come, its key not yet
            assert (await stream_one_frame(ctl.address, client, hello("n1"), frame(2))).ack.seq == 2
            install(upcoming.key, live.key)
            install(upcoming.client_ca, live.client_ca)
            assert (await stream_one_frame(ctl.address, new.client("n1"), hello("n1"), frame(3))).ack.seq == 3

    asyncio.run(scenario())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("is not a PEM file" in e and "keeping the certificates in use" in e for e in errors), errors
    assert any("is not the key of tls.cert" in e for e in errors), errors


def test_unusable_files_at_start_name_the_file(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    good = pki.server()
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(TransportError, match=f"cannot read tls.cert {missing}"):
        ServerTls(ServerFiles(missing, good.key, good.client_ca).config())
    other_key = pki.leaf("other", "127.0.0.1")[1]
    with pytest.raises(TransportError, match=r"is not the key of tls\.cert"):
        ServerTls(ServerFiles(good.cert, other_key, good.client_ca).config())
    with pytest.raises(TransportError, match=r"tls\.client_ca .* holds no usable certificate"):
        Path(tmp_path / "bad-ca.pem").write_text(
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
        )
        ServerTls(ServerFiles(good.cert, good.key, str(tmp_path / "bad-ca.pem")).config())
