"""`gpufleet controller`: load config, then serve until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import yaml

from controller import event_loop
from controller.config import ConfigError, load
from controller.errors import NotLeader, StoreUnavailable
from protos.logsafe import configure_logging
from protos.transport import TransportError

TLS_FLAGS = (("tls_cert", "cert"), ("tls_key", "key"), ("tls_client_ca", "client_ca"))
# The store, from the environment (a Kubernetes Secret): beats the file's `db`, not --db. A
# postgresql:// URL carries its password, which a flag would show to everyone who can run `ps`.
DB_ENV = "GPUFLEET_DB"


def run_controller(args: argparse.Namespace) -> int:
    try:
        overrides = _overrides(args)
        config = load(args.config, overrides)
        if config.operator_tokens is not None:  # a bad tokens file: one line, before anything starts
            from controller.security.tokens import load_tokens

            load_tokens(config.operator_tokens)
    except ConfigError as exc:
        print(f"gpufleet controller: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "kubeconfig", None):  # the flag beats kubernetes.kubeconfig in the file
        config.kubernetes.kubeconfig = args.kubeconfig
    configure_logging(config.log_level)  # node text escaped, repeated lines rate-limited (protos/logsafe.py)
    from controller.open_files import raise_open_files
    from controller.server import serve, write_ready_file

    raise_open_files(config.limits.max_nodes)  # before the children start: they inherit it

    ready_file = args.ready_file

    def on_ready(address: str, operator_address: str | None) -> None:
        if ready_file:
            write_ready_file(ready_file, address, operator_address)

    try:
        event_loop.run(serve(config, on_ready=on_ready), config.event_loop)
    # ConfigError: a setting found unusable at start; NoUvloop: event_loop uvloop, not installed
    except (TransportError, ConfigError, event_loop.NoUvloop) as exc:
        print(f"gpufleet controller: {exc}", file=sys.stderr)
        return 2
    except NotLeader as exc:  # another controller leads the store now
        print(f"gpufleet controller: {exc}", file=sys.stderr)
        return 1
    except StoreUnavailable as exc:  # e.g. the store's server unreachable at start, its disk unwritable
        print(f"gpufleet controller: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gpufleet controller: {exc}", file=sys.stderr)
        return 1
    return 0


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Config keys the flags set; flags beat the file. A TLS flag keeps the file's other tls keys
    and turns plaintext off; --insecure turns TLS off."""
    overrides: dict[str, Any] = {}
    for flag, key in (
        ("listen", "listen"),
        ("db", "db"),
        ("log_level", "log_level"),
        ("operator_listen", "operator_listen"),
        ("operator_tokens", "operator_tokens"),
        ("metrics_web_config", "metrics_web_config"),
        ("record", "record"),
    ):
        if getattr(args, flag, None):
            overrides[key] = getattr(args, flag)
    if "db" not in overrides and os.environ.get(DB_ENV, "").strip():
        overrides["db"] = os.environ[DB_ENV].strip()
    if getattr(args, "ingest_fronts", None) is not None:
        overrides["ingest_fronts"] = args.ingest_fronts
    if args.metrics_address is not None:  # "none" turns the server off; the config reads it so
        overrides["metrics_address"] = args.metrics_address
    tls = {key: getattr(args, flag) for flag, key in TLS_FLAGS if getattr(args, flag, None)}
    if getattr(args, "insecure", False):
        if tls:
            raise ConfigError(
                "--insecure (plaintext) and --tls-cert, --tls-key, --tls-client-ca exclude each other"
            )
        overrides["insecure"] = True
        overrides["tls"] = {}
    elif tls:
        overrides["tls"] = {**_file_tls(args.config), **tls}
        overrides["insecure"] = False
    return overrides


def _file_tls(path: str | None) -> dict[str, Any]:
    """The config file's tls section, for flags to complete ({} when none or unreadable: load says why)."""
    if not path:
        return {}
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return {}
    section = data.get("tls") if isinstance(data, dict) else None
    return dict(section) if isinstance(section, dict) else {}
