"""bench/ is a folder of scripts, not a package: its tests load a script's file as a module."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"


@contextlib.contextmanager
def bench_script(name: str) -> Iterator[ModuleType]:
    """bench/NAME.py as a module, listed in sys.modules while in use (a dataclass looks its module
    up there)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def bench_json(name: str, *args: str, timeout: float = 120) -> Any:
    """What `python bench/NAME.py ARGS --json` prints, parsed; it must exit 0 within `timeout`."""
    done = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return json.loads(done.stdout)
