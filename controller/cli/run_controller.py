"""`gpufleet controller`: load config, then serve until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from controller.config import ConfigError, load


def run_controller(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {}
    for flag, key in (("listen", "listen"), ("db", "db"), ("log_level", "log_level")):
        if getattr(args, flag):
            overrides[key] = getattr(args, flag)
    if args.metrics_address is not None:  # "none" turns the server off; the config reads it so
        overrides["metrics_address"] = args.metrics_address
    try:
        config = load(args.config, overrides)
    except ConfigError as exc:
        print(f"gpufleet controller: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "kubeconfig", None):  # the flag beats kubernetes.kubeconfig in the file
        config.kubernetes.kubeconfig = args.kubeconfig
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from controller.server import serve, write_ready_file

    ready_file = args.ready_file

    def on_ready(address: str) -> None:
        if ready_file:
            write_ready_file(ready_file, address)

    try:
        asyncio.run(serve(config, on_ready=on_ready))
    except OSError as exc:
        print(f"gpufleet controller: {exc}", file=sys.stderr)
        return 1
    return 0
