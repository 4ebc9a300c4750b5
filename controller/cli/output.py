"""What every operator command shares: where the controller is, and how to print what it answers.

`-o table` (the default) and `-o wide` (more columns) are rich tables; `-o json` and `-o yaml` are
the same document, stable for scripts. A new operator command calls `add_operator_arguments` on
its parser and `print_document` for json/yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import yaml

from controller.cli.credentials import TLS_ENV, TOKEN_FILE_ENV

OUTPUT_FORMATS = ("table", "wide", "json", "yaml")
DOCUMENT_FORMATS = ("json", "yaml")  # a document for scripts, not a table
CONTROLLER_ENV = "GPUFLEET_CONTROLLER"
DEFAULT_CONTROLLER = "127.0.0.1:50051"


def default_controller() -> str:
    """$GPUFLEET_CONTROLLER when set (and not empty), else 127.0.0.1:50051; --controller beats both."""
    return os.environ.get(CONTROLLER_ENV, "").strip() or DEFAULT_CONTROLLER


def _env(name: str) -> str | None:
    return os.environ.get(name, "").strip() or None


def add_operator_arguments(parser: argparse.ArgumentParser) -> None:
    """--controller HOST:PORT, its credentials (--token-file, --tls-ca, --tls-cert, --tls-key) and
    -o/--output, the same for every operator command."""
    parser.add_argument(
        "--controller",
        default=default_controller(),
        metavar="HOST:PORT",
        help=f"the controller's address (default: ${CONTROLLER_ENV}, else {DEFAULT_CONTROLLER})",
    )
    parser.add_argument(
        "--token-file",
        default=_env(TOKEN_FILE_ENV),
        metavar="FILE",
        help=f"file holding this operator's bearer token (default: ${TOKEN_FILE_ENV}; none: no token)",
    )
    parser.add_argument(
        "--tls-ca",
        default=_env(TLS_ENV["tls_ca"]),
        metavar="FILE",
        help=f"PEM CA of the controller's certificate: speak TLS (default: ${TLS_ENV['tls_ca']}; "
        "none: plaintext)",
    )
    for flag, what in (("cert", "client certificate"), ("key", "key of --tls-cert")):
        env = TLS_ENV[f"tls_{flag}"]
        parser.add_argument(
            f"--tls-{flag}",
            default=_env(env),
            metavar="FILE",
            help=f"PEM {what}, where the controller asks operators for one (default: ${env})",
        )
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        default="table",
        help="table (default), wide (more columns), json or yaml (the same document)",
    )


def add_limit_argument(parser: argparse.ArgumentParser) -> None:
    """--limit N for the list commands: a whole number from 1 (the controller caps the top)."""
    from controller.cli.arg_types import limit

    parser.add_argument(
        "--limit", type=limit, default=100, metavar="N", help="at most this many (default 100)"
    )


def print_document(doc: Any, output: str) -> None:
    """`doc` (plain dicts, lists and scalars) as JSON or as YAML, on stdout."""
    if output == "yaml":
        yaml.safe_dump(doc, sys.stdout, sort_keys=False, allow_unicode=True, default_flow_style=False)
        return
    json.dump(doc, sys.stdout, indent=2, sort_keys=False, allow_nan=False)
    sys.stdout.write("\n")
