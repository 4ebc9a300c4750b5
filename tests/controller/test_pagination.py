"""Pages of ListNodes and ListFindings over real gRPC, and `gpufleet nodes|findings` fetching every
page (with the controller's security warning on stderr only)."""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import pytest

from controller.cli import operator
from controller.config import LimitsConfig
from controller.fleet.findings import StoredFinding
from controller.fleet.silencing import Ack, Maintenance
from controller.paging import PAGE_BYTES
from controller.security.warning import security_warning
from protos.gpufleet.v1 import findings_pb2, operator_pb2, operator_pb2_grpc
from protos.names import cause_name, severity_name
from tests.controller.harness import (
    Clock,
    ControllerThread,
    Running,
    add_findings,
    config,
    hello,
    running_controller,
    stored_finding,
)

if TYPE_CHECKING:  # the async stub exists only in the generated type stubs
    Stub: TypeAlias = operator_pb2_grpc.OperatorAsyncStub

PAGE_LIMIT = 4  # limits.page_size (findings) in these tests
NODE_PAGE_LIMIT = 5  # limits.node_page_size
NAMES = [f"node-{i:03d}" for i in range(11)]
RANK = {"critical": 0, "warning": 1, "info": 2}


def serve(body: Callable[[Running, Stub], Awaitable[None]]) -> None:
    async def go() -> None:
        cfg = config(limits=LimitsConfig(page_size=PAGE_LIMIT, node_page_size=NODE_PAGE_LIMIT))
        async with (
            running_controller(cfg, Clock()) as running,
            grpc.aio.insecure_channel(running.address) as channel,
        ):
            await body(running, operator_pb2_grpc.OperatorStub(channel))

    asyncio.run(go())


async def add_nodes(running: Running, names: list[str]) -> None:
    shuffled = list(names)
    random.Random(7).shuffle(shuffled)  # joining order is not the answer's order
    for name in shuffled:
        await running.app.ingest.hello(hello(name))


def findings() -> list[StoredFinding]:
    """Findings of every severity over three nodes, node-level ones among them; two resolved."""
    out = []
    for i, (severity, cause) in enumerate(
        [("info", "hbm_degraded"), ("critical", "nvlink_down"), ("warning", "power_cap")] * 3
    ):
        node = NAMES[i % 3]
        gpu = None if cause == "nvlink_down" and i % 2 else i % 4
        out.append(stored_finding(node, gpu, cause, severity, first_seen=1000.0 + i, active=i not in (2, 7)))
    return out


def order(found: list[StoredFinding]) -> list[tuple[str, str, int, str]]:
    """The API's order, worked out here: worst first, then node, GPU (node-level first), cause."""
    keys = [
        (s.finding.severity, s.finding.node, -1 if s.finding.gpu is None else s.finding.gpu, s.finding.cause)
        for s in found
    ]
    return sorted(keys, key=lambda k: (RANK[k[0]], k[1], k[2], k[3]))


def wire_keys(found: list[findings_pb2.Finding]) -> list[tuple[str, str, int, str]]:
    return [
        (severity_name(f.severity), f.node, f.gpu if f.HasField("gpu") else -1, cause_name(f.cause))
        for f in found
    ]


@pytest.mark.parametrize("asked", [0, 1, 3, NODE_PAGE_LIMIT, NODE_PAGE_LIMIT + 1, 1000])
def test_node_pages_list_every_node_once_in_name_order(asked: int) -> None:
    async def body(running: Running, stub: Stub) -> None:
        await add_nodes(running, NAMES)
        size = asked if 0 < asked <= NODE_PAGE_LIMIT else NODE_PAGE_LIMIT
        listed: list[str] = []
        token = ""
        while True:
            page = await stub.ListNodes(operator_pb2.ListNodesRequest(page_size=asked, page_token=token))
            assert len(page.nodes) <= size
            assert page.total == len(NAMES)
            assert page.warning == security_warning(running.app.config) != ""
            listed += [n.name for n in page.nodes]
            token = page.next_page_token
            if not token:
                break
            assert len(page.nodes) == size  # only the last page is short
        assert listed == NAMES

    serve(body)


def test_a_node_joining_between_pages_shifts_nothing() -> None:
    async def body(running: Running, stub: Stub) -> None:
        await add_nodes(running, NAMES)
        first = await stub.ListNodes(operator_pb2.ListNodesRequest(page_size=3))
        await running.app.ingest.hello(hello("node-000a"))  # sorts before the token: not listed now
        await running.app.ingest.hello(hello("node-005a"))  # after it: listed in its place
        rest: list[str] = []
        token = first.next_page_token
        while token:
            page = await stub.ListNodes(operator_pb2.ListNodesRequest(page_size=3, page_token=token))
            rest += [n.name for n in page.nodes]
            token = page.next_page_token
        assert [n.name for n in first.nodes] + rest == sorted([*NAMES, "node-005a"])
        assert page.total == len(NAMES) + 2

    serve(body)


def test_a_node_page_ends_before_a_client_would_refuse_it() -> None:
    """Five nodes under maintenance with 1 MiB comments: one page of five (5 MiB) would pass the
    4 MiB a gRPC client takes by default; pages end before PAGE_BYTES, and nothing is lost. (The API
    takes 1,024 characters now, controller/operator_text.py; a store written before holds longer.)"""
    comment = "é" * (512 * 1024)  # 1 MiB in UTF-8: bytes, not characters, are counted

    async def body(running: Running, stub: Stub) -> None:
        await add_nodes(running, NAMES[:5])
        for name in NAMES[:5]:
            running.app.silencing.maintenance[name] = Maintenance(name, "before", comment, 0.0)
        sizes: list[int] = []
        listed: list[str] = []
        token = ""
        while True:
            page = await stub.ListNodes(operator_pb2.ListNodesRequest(page_token=token))
            assert page.ByteSize() <= PAGE_BYTES
            assert all(n.maintenance_comment == comment for n in page.nodes)
            sizes.append(len(page.nodes))
            listed += [n.name for n in page.nodes]
            token = page.next_page_token
            if not token:
                break
        assert sizes == [2, 2, 1]
        assert listed == NAMES[:5]

    serve(body)


def test_an_empty_fleet_is_one_empty_page() -> None:
    async def body(running: Running, stub: Stub) -> None:
        page = await stub.ListNodes(operator_pb2.ListNodesRequest())
        assert (list(page.nodes), page.next_page_token, page.total) == ([], "", 0)
        found = await stub.ListFindings(operator_pb2.ListFindingsRequest(include_resolved=True))
        assert (list(found.findings), found.next_page_token) == ([], "")

    serve(body)


def token_of(*body: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(body)).encode()).decode()


@pytest.mark.parametrize(
    "token",
    [
        "!!not base64!!",
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
        token_of("nodes"),
        token_of("nodes", 7),
        token_of("findings", 0, "node-000", -1, "nvlink_down", "abc"),  # another list's token
        token_of("nodes", "node-001", "extra"),
    ],
)
def test_a_page_token_the_controller_did_not_give_is_invalid_argument(token: str) -> None:
    async def body(running: Running, stub: Stub) -> None:
        await add_nodes(running, NAMES)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ListNodes(operator_pb2.ListNodesRequest(page_token=token))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == "page_token is not one this controller gave for its list of nodes"
        bad = token_of("nodes", "node-001")  # a nodes token, given to ListFindings
        with pytest.raises(grpc.aio.AioRpcError) as other:
            await stub.ListFindings(operator_pb2.ListFindingsRequest(page_token=bad))
        assert other.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    serve(body)


@pytest.mark.parametrize("include_resolved", [False, True], ids=["active", "with-resolved"])
@pytest.mark.parametrize("asked", [0, 1, 2, 1000])
@pytest.mark.parametrize("min_severity", [0, findings_pb2.SEVERITY_WARNING])
def test_finding_pages_list_every_finding_once_worst_first(
    include_resolved: bool, asked: int, min_severity: int
) -> None:
    async def body(running: Running, stub: Stub) -> None:
        await add_nodes(running, NAMES)
        stored = findings()
        await add_findings(running.app, stored)
        wanted = [s for s in stored if include_resolved or s.active]
        if min_severity:
            wanted = [s for s in wanted if s.finding.severity != "info"]
        size = asked if 0 < asked <= PAGE_LIMIT else PAGE_LIMIT
        listed: list[findings_pb2.Finding] = []
        token = ""
        while True:
            request = operator_pb2.ListFindingsRequest(
                include_resolved=include_resolved,
                min_severity=min_severity,  # type: ignore[arg-type]
                page_size=asked,
                page_token=token,
            )
            page = await stub.ListFindings(request)
            assert len(page.findings) <= size
            listed += page.findings
            token = page.next_page_token
            if not token:
                break
        assert wire_keys(listed) == order(wanted)
        assert len({f.id for f in listed}) == len(listed)

    serve(body)


def test_a_finding_page_ends_before_a_client_would_refuse_it() -> None:
    """Every active finding acked with a 1 MiB comment: four a page (the limit) would pass the
    4 MiB a gRPC client takes by default; pages end before PAGE_BYTES, and nothing is lost. (The API
    takes 1,024 characters now, controller/operator_text.py; a store written before holds longer.)"""
    comment = "é" * (512 * 1024)  # 1 MiB in UTF-8

    async def body(running: Running, stub: Stub) -> None:
        await add_nodes(running, NAMES)
        stored = findings()
        await add_findings(running.app, stored)
        wanted = [s for s in stored if s.active]
        for s in wanted:
            running.app.silencing.acks[s.id] = Ack(s.id, s.finding.node, "before", comment, 0.0)
        sizes: list[int] = []
        listed: list[findings_pb2.Finding] = []
        token = ""
        while True:
            page = await stub.ListFindings(operator_pb2.ListFindingsRequest(page_token=token))
            assert page.ByteSize() <= PAGE_BYTES
            assert all(f.ack.comment == comment for f in page.findings)
            sizes.append(len(page.findings))
            listed += page.findings
            token = page.next_page_token
            if not token:
                break
        assert sizes == [2, 2, 2, 1]
        assert wire_keys(listed) == order(wanted)

    serve(body)


@pytest.fixture(scope="module")
def small_pages() -> Any:
    """A controller answering two entries a page, with 5 nodes and their findings."""
    with ControllerThread(config(limits=LimitsConfig(page_size=2, node_page_size=2)), Clock()) as c:

        async def setup(app: Any) -> None:
            for name in NAMES[:5]:
                await app.ingest.hello(hello(name))
            await add_findings(app, findings())

        c.call(setup)
        yield c


def test_cli_nodes_json_fetches_every_page_and_warns_on_stderr_only(
    small_pages: ControllerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    assert operator.nodes(small_pages.address, "json") == 0
    out, err = capsys.readouterr()
    assert sorted(n["name"] for n in json.loads(out)["nodes"]) == NAMES[:5]
    assert err == f"WARNING: {security_warning(small_pages.app.config)}\n"
    assert err.count("\n") == 1


def test_cli_findings_fetches_every_page_and_warns(
    small_pages: ControllerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    assert operator.findings(small_pages.address, "json", include_resolved=True) == 0
    out, err = capsys.readouterr()
    listed = json.loads(out)["findings"]
    assert len(listed) == len(findings()) and len({f["id"] for f in listed}) == len(listed)
    assert err.startswith("WARNING: plaintext gRPC") and err.count("\n") == 1
    assert operator.nodes(small_pages.address, "table") == 0
    out, err = capsys.readouterr()
    assert "Nodes (5)" in out and err.startswith("WARNING: ")
