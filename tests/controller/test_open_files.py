"""The controller's open-file limit (controller/open_files.py): raised at start to the hard limit, and
a warning when even that is below what limits.max_nodes needs.

Each case runs in a process of its own, started under the limits it needs, so this test process's
own limit is never changed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import grpc
import pytest
import yaml

from controller.open_files import needed_files, open_files, soft_limit
from tests.processes import ready_address, stop

# In a fresh interpreter: the limits set, then what raise_open_files did and what the process has now.
_CASE = textwrap.dedent(
    """
    import json, logging, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    from controller.open_files import raise_open_files
    got = raise_open_files(int(sys.argv[3]))
    print(json.dumps({"before": got.before, "limit": got.limit, "hard": got.hard, "needed": got.needed,
                      "now": list(resource.getrlimit(resource.RLIMIT_NOFILE))}))
    """
)

# Limits this test's processes may set: at most the hard limit the test runs under.
_HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def _run(soft: int, hard: int, max_nodes: int) -> tuple[dict[str, object], str]:
    done = subprocess.run(
        [sys.executable, "-c", _CASE, str(soft), str(hard), str(max_nodes)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout), done.stderr


def _needs(hard: int) -> None:
    if _HARD != resource.RLIM_INFINITY and hard > _HARD:
        pytest.skip(f"this process's hard open-file limit is {_HARD}, below the {hard} the case sets")


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    _needs(4096)
    got, said = _run(256, 4096, 1000)
    assert got == {"before": 256, "limit": 4096, "hard": 4096, "needed": 3024, "now": [4096, 4096]}
    assert "INFO open files: soft limit raised from 256 to 4096" in said
    assert "WARNING" not in said, said


def test_a_hard_limit_below_the_fleets_need_is_said_and_the_rest_goes_on() -> None:
    _needs(1024)
    got, said = _run(256, 1024, 1000)
    assert got["limit"] == 1024 and got["now"] == [1024, 1024]
    assert needed_files(1000) == 3024 == got["needed"]
    assert "WARNING open files: the limit is 1024, below the 3024 that limits.max_nodes 1000" in said, said
    assert "Raise the hard limit" in said


def test_a_soft_limit_already_at_the_hard_one_is_left() -> None:
    _needs(4096)
    got, said = _run(4096, 4096, 1000)
    assert got["now"] == [4096, 4096] and got["limit"] == 4096
    assert said == "", said


# `gpufleet controller` under a low soft limit: the limits set, then the controller exec'd in its place.
_LAUNCH = textwrap.dedent(
    """
    import os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
    os.execv(sys.executable, [sys.executable, "-m", "controller", "controller", *sys.argv[3:]])
    """
)


def _open_files_limit(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-files line in /proc/{pid}/limits")


CONNECTIONS = 200  # each an open file in the controller: past the soft limit it starts with


async def _connect_all(address: str) -> int:
    """CONNECTIONS connections to the controller, each its own (no shared subchannel): how many
    were taken in (the HTTP/2 handshake done, which needs the controller to accept the socket)."""
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(CONNECTIONS)
    ]
    try:
        ready = await asyncio.gather(
            *(asyncio.wait_for(channel.channel_ready(), 30) for channel in channels), return_exceptions=True
        )
        return sum(1 for outcome in ready if outcome is None)
    finally:
        for channel in channels:
            await channel.close(None)


def test_the_controller_raises_its_limit_at_start_and_takes_more_connections_than_it_started_with(
    tmp_path: Path,
) -> None:
    """`gpufleet controller` started under a soft limit of 64 files (a hard one of 8,192): it and
    its detection process run with 8,192, and it takes in CONNECTIONS connections at once."""
    _needs(8192)
    config = tmp_path / "controller.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": "127.0.0.1:0",
                "metrics_address": "none",
                "db": str(tmp_path / "fleet.db"),
                "limits": {"max_nodes": 100},
            }
        )
    )
    ready, log = tmp_path / "controller.ready", tmp_path / "controller.log"
    args = ["64", "8192", "--config", str(config), "--ready-file", str(ready)]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        address = ready_address(process, ready, log)["address"]
        assert _open_files_limit(process.pid) == (8192, 8192)
        # The detection process starts once the controller listens (after its ready file): wait for it
        deadline = time.monotonic() + 30
        while not (children := Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()):
            assert time.monotonic() < deadline, "the controller started no detection process"
            time.sleep(0.05)
        assert all(_open_files_limit(int(child)) == (8192, 8192) for child in children)
        assert "open files: soft limit raised from 64 to 8192" in log.read_text()
        assert asyncio.run(_connect_all(address)) == CONNECTIONS
    finally:
        stop(process)


def test_open_files_counts_this_processs_files_and_none_for_a_process_not_there() -> None:
    before = open_files()
    assert before is not None
    with contextlib.ExitStack() as stack:
        for _ in range(50):
            stack.enter_context(tempfile.TemporaryFile())
        assert open_files() == before + 50
    assert open_files() == before
    assert open_files(2**22 + 1) is None  # above any pid Linux gives (pid_max is at most 2**22)
    assert soft_limit() == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
