"""A bare gRPC asyncio server whose event loop a test can hold (tests/controller/test_call_backlog.py).

    python tests/controller/held_server.py OPTIONS_JSON

It serves one bidirectional method, /test.Held/Stream: each call's first message is answered with
initial metadata ("accepted": "1"), then the call is read to its end. It prints its port on stdout
once serving. A line "hold" on stdin holds its event loop (a blocking read of stdin on the loop
itself) until the next line, "go": meanwhile gRPC core keeps taking connections and calls on its own
threads, but the server asks for none, as when a controller's loop is busy. It answers "held" on
stdout once holding. stdin closed: it stops.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import grpc

METHOD = "/test.Held/Stream"


async def _stream(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    if await context.read() is grpc.aio.EOF:  # type: ignore[attr-defined] # not in grpc-stubs
        return
    await context.send_initial_metadata((("accepted", "1"),))
    while await context.read() is not grpc.aio.EOF:  # type: ignore[attr-defined]
        pass


class _Handler(grpc.GenericRpcHandler):  # type: ignore[type-arg] # generic only in the stubs
    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        if details.method == METHOD:
            return grpc.stream_stream_rpc_method_handler(_stream)
        return None


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def main(options: list[tuple[str, Any]]) -> None:
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((_Handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()

    def on_line() -> None:
        line = sys.stdin.readline()
        if not line:
            loop.remove_reader(sys.stdin.fileno())
            ended.set()
        elif line.strip() == "hold":
            _say("held")
            sys.stdin.readline()  # blocks the loop until "go"

    loop.add_reader(sys.stdin.fileno(), on_line)
    _say(str(port))
    await ended.wait()
    await server.stop(None)


if __name__ == "__main__":
    asyncio.run(main([(name, value) for name, value in json.loads(sys.argv[1])]))
