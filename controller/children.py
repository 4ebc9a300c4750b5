"""The controller's own processes (its detection processes, its ingest fronts): started with
subprocess.Popen, their pipes joined to the running event loop, whichever loop that is.

Not with the loop's subprocess_exec: uvloop's (libuv's uv_spawn) forks the controller with
Python's and gRPC's at-fork handlers around the fork. With gRPC's threads busy (a failover at
6,000 nodes), gRPC's handler in the child started an event-engine thread that crashed it
(SIGSEGV) before it ran the detection process, and the fork copied the page tables of a controller
holding several GB on the event loop (0.5 s at 2.7 GB). CPython's subprocess starts a child with
vfork, which runs no at-fork handler and copies nothing. And its pipes are pipes on either loop.

SubprocessTransport gives the protocol what the loop's own transport gives (connection_made, each
pipe's data and end, process_exited, then connection_lost), so asyncio.subprocess.Process and
SubprocessProtocols work on it unchanged. The child's end is seen through a pidfd the loop
watches (Linux 5.3 and later), else by a thread that waits for it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

P = TypeVar("P", bound=asyncio.SubprocessProtocol)
STREAM_LIMIT = 2**16  # asyncio's StreamReader default
# Sent to the controller's whole process group or cgroup (Ctrl-C in a terminal, systemd's stop,
# `timeout`), these reach its children too; the controller acts on them and ends its children itself.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def ignore_stop_signals() -> None:
    """In a child (a detection process, an ingest front, a record worker), first thing: leave SIGINT
    and SIGTERM to the controller, which ends the child by closing its stdin (and kills one that
    outstays that); its stdin also ends when the controller dies. Otherwise a Ctrl-C or a service
    stop killed the children before the controller stopped them: a traceback, an error logged for
    each, and an ingest front started again during the stop.

    A child started by `popen` has had them blocked since before its interpreter started, so one
    sent while it was still importing waited, and is dropped here (POSIX discards a pending signal
    whose action becomes SIG_IGN) instead of killing it."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def popen(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """subprocess.Popen for a child that calls `ignore_stop_signals`: it starts with SIGINT and
    SIGTERM blocked (a child inherits its starter's signal mask across fork and exec), so one sent
    to the process group in its first ~0.3 s, before it could ignore them, no longer kills it."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return subprocess.Popen(argv, **kwargs)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _Pipe(asyncio.Protocol):
    """One of the child's pipes, its events passed to the SubprocessTransport."""

    def __init__(self, owner: SubprocessTransport, fd: int) -> None:
        self.owner, self.fd = owner, fd
        self.pipe: asyncio.BaseTransport | None = None
        self.disconnected = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.pipe = transport

    def data_received(self, data: bytes) -> None:
        self.owner._call(self.owner.protocol.pipe_data_received, self.fd, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.disconnected = True
        self.owner._call(self.owner.protocol.pipe_connection_lost, self.fd, exc)
        self.owner._try_finish()

    def pause_writing(self) -> None:
        self.owner.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.owner.protocol.resume_writing()


class SubprocessTransport(asyncio.SubprocessTransport):
    def __init__(self, popen: subprocess.Popen[bytes], protocol: asyncio.SubprocessProtocol) -> None:
        super().__init__()
        self.popen, self.protocol = popen, protocol
        self.loop = asyncio.get_running_loop()
        self._pipes: dict[int, _Pipe] = {}
        self._returncode: int | None = None
        self._waiters: list[asyncio.Future[int]] = []
        self._pending: list[tuple[Callable[..., object], tuple[Any, ...]]] | None = []
        self._closed = self._finished = False

    async def _connect(self) -> None:
        popen, loop = self.popen, self.loop
        if popen.stdin is not None:
            await loop.connect_write_pipe(lambda: self._pipe(0), popen.stdin)
        for fd, out in ((1, popen.stdout), (2, popen.stderr)):
            if out is not None:
                await loop.connect_read_pipe(functools.partial(self._pipe, fd), out)
        self.protocol.connection_made(self)
        pending, self._pending = self._pending or [], None
        for callback, args in pending:
            loop.call_soon(callback, *args)
        self._watch_exit()

    def _pipe(self, fd: int) -> _Pipe:
        self._pipes[fd] = _Pipe(self, fd)
        return self._pipes[fd]

    def _watch_exit(self) -> None:
        try:
            pidfd = os.pidfd_open(self.popen.pid)
        except (AttributeError, OSError):  # not Linux 5.3+: a thread waits
            waited = self.loop.run_in_executor(None, self.popen.wait)
            waited.add_done_callback(lambda done: self._exited(done.result()))
            return

        def readable() -> None:
            self.loop.remove_reader(pidfd)
            os.close(pidfd)
            self._exited(self.popen.wait())

        self.loop.add_reader(pidfd, readable)

    def _exited(self, returncode: int) -> None:
        self._returncode = returncode
        self._call(self.protocol.process_exited)
        self._try_finish()

    def _call(self, callback: Callable[..., object], *args: Any) -> None:
        if self._pending is not None:  # before connection_made: delivered after it, in order
            self._pending.append((callback, args))
        else:
            self.loop.call_soon(callback, *args)

    def _try_finish(self) -> None:
        if self._finished or self._returncode is None:
            return
        if all(pipe.disconnected for pipe in self._pipes.values()):
            self._finished = True
            self._call(self._lost)

    def _lost(self) -> None:
        returncode = self._returncode
        assert returncode is not None  # (_try_finish)
        try:
            self.protocol.connection_lost(None)
        finally:
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(returncode)
            self._waiters = []

    async def _wait(self) -> int:
        """Its return code once it ended and its pipes closed (asyncio.subprocess.Process.wait)."""
        if self._finished and self._returncode is not None:
            return self._returncode
        waiter: asyncio.Future[int] = self.loop.create_future()
        self._waiters.append(waiter)
        return await waiter

    def get_pid(self) -> int:
        return self.popen.pid

    def get_returncode(self) -> int | None:
        return self._returncode

    def get_pipe_transport(self, fd: int) -> asyncio.BaseTransport | None:
        pipe = self._pipes.get(fd)
        return None if pipe is None else pipe.pipe

    def send_signal(self, signum: int) -> None:
        if self._returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def is_closing(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close its pipes; a child still running is killed (as the loop's own transport does)."""
        if self._closed:
            return
        self._closed = True
        for pipe in self._pipes.values():
            if pipe.pipe is not None:
                pipe.pipe.close()
        if self._returncode is None and self.popen.poll() is None:
            self.kill()


async def subprocess_exec(
    protocol_factory: Callable[[], P],
    *argv: str,
    stdin: int | None = subprocess.PIPE,
    stdout: int | None = subprocess.PIPE,
    stderr: int | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[SubprocessTransport, P]:
    """loop.subprocess_exec(protocol_factory, *argv, ...), the child started by subprocess.Popen."""
    process = popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, bufsize=0)
    protocol = protocol_factory()
    transport = SubprocessTransport(process, protocol)
    try:
        await transport._connect()
    except BaseException:
        transport.close()
        raise
    return transport, protocol


async def create_subprocess_exec(
    *argv: str,
    stdin: int | None = subprocess.PIPE,
    stdout: int | None = subprocess.PIPE,
    stderr: int | None = None,
    env: Mapping[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """asyncio.create_subprocess_exec(*argv, ...), the child started by subprocess.Popen."""
    loop = asyncio.get_running_loop()
    transport, protocol = await subprocess_exec(
        lambda: asyncio.subprocess.SubprocessStreamProtocol(limit=STREAM_LIMIT, loop=loop),
        *argv,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=env,
    )
    return asyncio.subprocess.Process(transport, protocol, loop)
