"""The load generator seen from the bench: K worker processes (multiprocessing, spawn), each asked
the same request over its pipe and answering once (worker.py lists the requests)."""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import psutil

from controller_scale_load.worker import WorkerSpec, worker_main

ANSWER_TIMEOUT_S = 120.0  # a worker that takes longer to answer is taken for hung
START_TIMEOUT_S = 120.0


class WorkerGone(RuntimeError):
    """A worker ended or stopped answering."""


class Fleet:
    def __init__(self, specs: list[WorkerSpec]) -> None:
        context = multiprocessing.get_context("spawn")  # no fork: the parent holds gRPC's threads
        self.processes: list[BaseProcess] = []
        self.pipes: list[Connection] = []
        try:
            for spec in specs:
                parent, child = context.Pipe()
                process: BaseProcess = context.Process(
                    target=worker_main, args=(spec, child), name=f"scale-worker-{spec.index}", daemon=True
                )
                process.start()
                child.close()
                self.processes.append(process)
                self.pipes.append(parent)
            for pipe, process in zip(self.pipes, self.processes, strict=True):
                _receive(pipe, process, START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def ask(self, *request: object) -> list[dict[str, Any]]:
        """Send `request` to every worker; their answers, in worker order."""
        return self.ask_each([request] * len(self.pipes))

    def ask_each(self, requests: list[tuple[object, ...]]) -> list[dict[str, Any]]:
        """Send requests[i] to worker i (every one sent before any answer is read); their answers."""
        for pipe, request in zip(self.pipes, requests, strict=True):
            pipe.send(request)
        return [
            _receive(pipe, p, ANSWER_TIMEOUT_S) for pipe, p in zip(self.pipes, self.processes, strict=True)
        ]

    def cpu_seconds(self) -> float:
        """User + system seconds of every worker so far."""
        total = 0.0
        for pid in self.pids:
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def stop(self) -> None:
        """Ask every worker to stop; end any that does not within 10 s. Closes the pipes."""
        for pipe, process in zip(self.pipes, self.processes, strict=False):
            if process.is_alive():
                try:
                    pipe.send(("stop",))
                    _receive(pipe, process, 30.0)
                except (WorkerGone, OSError, EOFError):
                    pass
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
            process.close()
        for pipe in self.pipes:
            pipe.close()
        self.processes, self.pipes = [], []


def _receive(pipe: Connection, process: BaseProcess, timeout: float) -> dict[str, Any]:
    if not pipe.poll(timeout):
        raise WorkerGone(f"{process.name} did not answer within {timeout:.0f} s")
    try:
        answer = pipe.recv()
    except EOFError:
        raise WorkerGone(f"{process.name} ended (exit code {process.exitcode})") from None
    if isinstance(answer, tuple):  # ("ready", index)
        return {"ready": answer[1]}
    assert isinstance(answer, dict)
    return answer
