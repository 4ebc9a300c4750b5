"""Operator tokens and roles against a real controller on 127.0.0.1: who may call what, what the
audit log says about who called, a tokens file rotated under a running controller, and the open API
(no tokens file) every caller uses as anonymous admin."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import pytest

from controller.security.auth import METHOD_ROLES, NO_TOKEN, UNKNOWN_TOKEN
from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc, telemetry_pb2_grpc
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import Running, as_frame, as_hello, config, frame, hello, running_controller

if TYPE_CHECKING:
    Stub: TypeAlias = operator_pb2_grpc.OperatorAsyncStub

TOKENS = {"alice": ("viewer", "alice-secret"), "bob": ("operator", "bob-secret"), "root": ("admin", "r00t")}


def tokens_yaml(tokens: dict[str, tuple[str, str]]) -> str:
    lines = ["tokens:"]
    for name, (role, token) in tokens.items():
        digest = hashlib.sha256(token.encode()).hexdigest()
        lines += [f"  - name: {name}", f"    role: {role}", f"    sha256: {digest}"]
    return "\n".join(lines) + "\n"


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


Body = Callable[[Running, "Stub"], Awaitable[None]]


def serve(tokens_file: Path | None, body: Body) -> None:
    async def go() -> None:
        cfg = config(operator_tokens=None if tokens_file is None else str(tokens_file))
        async with (
            running_controller(cfg) as running,
            grpc.aio.insecure_channel(running.address) as channel,
        ):
            await body(running, operator_pb2_grpc.OperatorStub(channel))

    asyncio.run(go())


async def refused(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.yaml"
    path.write_text(tokens_yaml(TOKENS))
    return path


def test_every_operator_method_has_a_role() -> None:
    methods = {m.name for m in operator_pb2.DESCRIPTOR.services_by_name["Operator"].methods}
    assert set(METHOD_ROLES) == methods
    assert {m for m, role in METHOD_ROLES.items() if role == "admin"} == {"ResetBreaker"}


def test_no_token_or_an_unknown_one_is_unauthenticated(tokens_file: Path) -> None:
    async def body(running: Running, stub: Stub) -> None:
        request = operator_pb2.ListNodesRequest()
        assert await refused(stub.ListNodes(request)) == (grpc.StatusCode.UNAUTHENTICATED, NO_TOKEN)
        assert await refused(stub.ListNodes(request, metadata=bearer("guess"))) == (
            grpc.StatusCode.UNAUTHENTICATED,
            UNKNOWN_TOKEN,
        )
        code, details = await refused(stub.ListNodes(request, metadata=(("authorization", "Basic eDp5"),)))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "Bearer" in details
        # A refused mutating call acts on nothing and writes nothing to the audit log.
        reset = operator_pb2.ResetBreakerRequest(reason="x")
        assert (await refused(stub.ResetBreaker(reset)))[0] == grpc.StatusCode.UNAUTHENTICATED
        assert await running.app.store.list_audit("", None, 100) == []

    serve(tokens_file, body)


def test_viewer_reads_but_may_not_act(tokens_file: Path) -> None:
    async def body(running: Running, stub: Stub) -> None:
        await running.app.ingest.hello(hello("n1"))
        alice = bearer("alice-secret")
        nodes = await stub.ListNodes(operator_pb2.ListNodesRequest(), metadata=alice)
        assert [n.name for n in nodes.nodes] == ["n1"]
        assert (
            await stub.GetNode(operator_pb2.GetNodeRequest(name="n1"), metadata=alice)
        ).summary.name == "n1"
        await stub.ListFindings(operator_pb2.ListFindingsRequest(), metadata=alice)
        await stub.ListCommands(operator_pb2.ListCommandsRequest(), metadata=alice)
        assert not (await stub.GetBreaker(operator_pb2.GetBreakerRequest(), metadata=alice)).tripped
        await stub.ListAudit(operator_pb2.ListAuditRequest(), metadata=alice)
        await stub.ListRecommendations(operator_pb2.ListRecommendationsRequest(), metadata=alice)

        cordon = stub.Cordon(operator_pb2.CordonRequest(node="n1"), metadata=alice)
        assert await refused(cordon) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "token alice has role viewer; Cordon needs operator",
        )
        probe = stub.ProbeNode(operator_pb2.ProbeNodeRequest(node="n1"), metadata=alice)
        assert await refused(probe) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "token alice has role viewer; ProbeNode needs operator",
        )
        assert await running.app.store.list_audit("", None, 100) == []

    serve(tokens_file, body)


def test_operator_acts_as_itself_but_may_not_reset_the_breaker(tokens_file: Path) -> None:
    async def body(running: Running, stub: Stub) -> None:
        bob = bearer("bob-secret")
        # Past the role check: the controller itself answers (n1 is not connected) and audits bob.
        probe = stub.ProbeNode(operator_pb2.ProbeNodeRequest(node="n1"), metadata=bob)
        assert (await refused(probe))[0] not in (
            grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.PERMISSION_DENIED,
        )
        [entry] = await running.app.store.list_audit("n1", None, 10)
        assert (entry.action, entry.outcome) == ("probe_node", "refused")
        assert entry.requester.startswith("bob (operator) from ipv4:127.0.0.1:")

        reset = stub.ResetBreaker(operator_pb2.ResetBreakerRequest(reason="fixed"), metadata=bob)
        assert await refused(reset) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "token bob has role operator; ResetBreaker needs admin",
        )

    serve(tokens_file, body)


def test_admin_resets_the_breaker_audited_under_its_name(tokens_file: Path) -> None:
    async def body(running: Running, stub: Stub) -> None:
        root = bearer("r00t")
        await stub.ResetBreaker(operator_pb2.ResetBreakerRequest(reason="cable fixed"), metadata=root)
        audit = await stub.ListAudit(operator_pb2.ListAuditRequest(), metadata=root)
        [entry] = audit.entries
        assert (entry.action, entry.reason, entry.outcome) == ("breaker_reset", "cable fixed", "succeeded")
        assert entry.requester.startswith("root (admin) from ipv4:127.0.0.1:")

    serve(tokens_file, body)


def test_a_rotated_tokens_file_takes_effect_without_restart(
    tokens_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(running: Running, stub: Stub) -> None:
        request = operator_pb2.ListNodesRequest()
        await stub.ListNodes(request, metadata=bearer("alice-secret"))

        # alice's token is replaced by a new one, and carol joins as viewer (a rename over the file)
        rotated = {"alice": ("viewer", "alice-new"), "carol": ("viewer", "carol-secret")}
        tmp = tokens_file.with_suffix(".new")
        tmp.write_text(tokens_yaml(rotated))
        os.replace(tmp, tokens_file)
        assert (await refused(stub.ListNodes(request, metadata=bearer("alice-secret"))))[1] == UNKNOWN_TOKEN
        await stub.ListNodes(request, metadata=bearer("alice-new"))
        await stub.ListNodes(request, metadata=bearer("carol-secret"))

        # rewritten in place: carol becomes an admin
        tokens_file.write_text(tokens_yaml({"carol": ("admin", "carol-secret")}))
        await stub.ResetBreaker(operator_pb2.ResetBreakerRequest(reason="r"), metadata=bearer("carol-secret"))

        # a broken new version is logged, and the last good one kept
        with caplog.at_level(logging.ERROR, logger="gpufleet.controller.security"):
            tokens_file.write_text("tokens:\n  - name: carol\n    role: superuser\n    sha256: 00\n")
            await stub.ListNodes(request, metadata=bearer("carol-secret"))
        assert "role must be one of viewer, operator, admin" in caplog.text
        assert "keeping the 1 token(s) read before" in caplog.text

    serve(tokens_file, body)


def test_telemetry_is_not_token_checked(tokens_file: Path) -> None:
    """Agents stream without an operator token (they use certificates, not tokens)."""

    async def go() -> None:
        async with running_controller(config(operator_tokens=str(tokens_file))) as running:
            async with grpc.aio.insecure_channel(running.address) as channel:
                call = telemetry_pb2_grpc.TelemetryStub(channel).Stream(None)
                await call.write(as_hello(hello("n7")))
                await call.write(as_frame(frame(1, "n7")))
                assert await call.read() == pb.ControllerMessage(ack=pb.Ack(boot_id="b1", seq=1))
                await call.done_writing()
            assert "n7" in running.app.fleet.nodes

    asyncio.run(go())


def test_without_a_tokens_file_the_api_is_open_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    async def body(running: Running, stub: Stub) -> None:
        await stub.ResetBreaker(operator_pb2.ResetBreakerRequest(reason="open api"))
        [entry] = (await stub.ListAudit(operator_pb2.ListAuditRequest())).entries
        assert entry.requester.startswith("anonymous from ipv4:127.0.0.1:")

    with caplog.at_level(logging.WARNING, logger="gpufleet.controller.security"):
        serve(None, body)
    assert "operator API is open" in caplog.text
