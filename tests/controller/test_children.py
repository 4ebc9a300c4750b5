"""The controller's own processes (controller/children.py): started by subprocess.Popen on either
event loop, so that no at-fork handler runs in the controller (uvloop's own spawn runs Python's
and gRPC's: a child crashed that way at a failover); their pipes are pipes, widened; a protocol
sees their data, ends and exit in the order the loop's own transport gives them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from controller import children, event_loop
from controller.pipe_sizes import widen
from tests.controller.loops import FORKS, LOOPS, pipe_capacity

ECHO = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()); sys.exit(3)"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_child_reads_what_is_sent_through_a_widened_pipe_and_its_status_is_seen(loop: str) -> None:
    async def go() -> tuple[int, bytes, int | None]:
        child = await children.create_subprocess_exec(sys.executable, "-c", ECHO)
        assert child.stdin is not None and child.stdout is not None
        writer = event_loop.write_transport(child.stdin.transport)
        got = widen(writer)
        sent = bytes(range(256)) * 8192  # 2 MiB: more than the pipe holds
        writer.write(sent)
        child.stdin.close()
        echoed = await child.stdout.read()
        assert echoed == sent
        return got, echoed, await asyncio.wait_for(child.wait(), 10)

    got, _, status = event_loop.run(go(), loop)
    assert got == pipe_capacity() and status == 3


@pytest.mark.parametrize("loop", LOOPS)
def test_no_at_fork_handler_runs_when_a_child_starts(loop: str) -> None:
    """subprocess.Popen (vfork) runs none. (uvloop's own spawn, libuv's fork, runs them: what a
    busy gRPC's handler crashed a child with. Not run here: it runs them in this test process, and
    CI's first run with it had every later PostgreSQL start in that process crash, initdb -11.)"""

    async def go() -> None:
        before = len(FORKS)
        child = await children.create_subprocess_exec(sys.executable, "-c", "pass", stdin=None, stdout=None)
        assert await asyncio.wait_for(child.wait(), 10) == 0
        assert len(FORKS) == before, "an at-fork handler ran"

    event_loop.run(go(), loop)


class Recorder(asyncio.SubprocessProtocol):
    def __init__(self) -> None:
        self.events: list[str] = []
        self.data = b""
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.events.append("made")

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        assert isinstance(data, bytes)
        self.data += data

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.events.append(f"pipe {fd} lost")

    def process_exited(self) -> None:
        self.events.append("exited")

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")
        self.lost.set_result(None)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "thread"])
def test_a_killed_child_is_seen_ended_and_its_protocol_told_in_order(
    loop: str, pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)  # a thread waits for it instead

    async def go() -> tuple[list[str], bytes, int | None]:
        argv = ["-c", "import sys, time; print('up', flush=True); time.sleep(60)"]
        transport, recorder = await children.subprocess_exec(Recorder, sys.executable, *argv)
        while b"up\n" not in recorder.data:
            await asyncio.sleep(0.01)
        assert transport.get_returncode() is None and transport.get_pid() > 0
        transport.kill()
        await asyncio.wait_for(recorder.lost, 10)
        transport.close()
        return recorder.events, recorder.data, transport.get_returncode()

    events, data, status = event_loop.run(go(), loop)
    assert data == b"up\n" and status == -signal.SIGKILL
    assert events[0] == "made" and events[-1] == "lost", events
    assert sorted(events[1:-1]) == ["exited", "pipe 0 lost", "pipe 1 lost"], events


def test_closing_a_running_childs_transport_ends_it() -> None:
    async def go() -> int:
        transport, recorder = await children.subprocess_exec(
            Recorder, sys.executable, "-c", "import time; time.sleep(60)"
        )
        transport.close()
        await asyncio.wait_for(recorder.lost, 10)
        status = transport.get_returncode()
        assert status is not None
        return status

    assert event_loop.run(go(), "uvloop") == -signal.SIGKILL


# A child whose imports take a while (the detection process's take ~0.3 s) before it ignores the
# stop signals, as every child of the controller does first thing.
SLOW_START = (
    "import sys, time; time.sleep(0.5)\n"
    "from controller.children import ignore_stop_signals\n"
    "ignore_stop_signals()\n"
    "print('started', flush=True); sys.stdin.read()"
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_sent_while_a_child_is_still_starting_does_not_kill_it(signum: int) -> None:
    """Ctrl-C or a service stop reaches the controller's whole process group, children too; one
    sent in a child's first moments, before it could ignore it, killed it (a KeyboardInterrupt
    traceback, or status -15). Started by children.popen, it waits blocked and is dropped."""
    with children.popen(
        [sys.executable, "-c", SLOW_START], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as child:
        try:
            child.send_signal(signum)
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline() == b"started\n"
            child.send_signal(signum)  # and once it ignores them
            child.stdin.close()
            assert child.wait(10) == 0
        finally:
            child.kill()
    assert not set(children.STOP_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, []), (
        "the starter's mask is kept"
    )


@pytest.mark.parametrize("loop", LOOPS)
def test_the_loops_children_start_with_the_stop_signals_blocked_too(loop: str) -> None:
    async def go() -> tuple[bytes, int]:
        child = await children.create_subprocess_exec(sys.executable, "-c", SLOW_START)
        os.kill(child.pid, signal.SIGINT)
        assert child.stdout is not None and child.stdin is not None
        line = await asyncio.wait_for(child.stdout.readline(), 10)
        child.stdin.close()
        return line, await asyncio.wait_for(child.wait(), 10)

    assert event_loop.run(go(), loop) == (b"started\n", 0)
