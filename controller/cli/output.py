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

OUTPUT_FORMATS = ("table", "wide", "json", "yaml")
DOCUMENT_FORMATS = ("json", "yaml")  # a document for scripts, not a table
CONTROLLER_ENV = "GPUFLEET_CONTROLLER"
DEFAULT_CONTROLLER = "127.0.0.1:50051"


def default_controller() -> str:
    """$GPUFLEET_CONTROLLER when set (and not empty), else 127.0.0.1:50051; --controller beats both."""
    return os.environ.get(CONTROLLER_ENV, "").strip() or DEFAULT_CONTROLLER


def add_operator_arguments(parser: argparse.ArgumentParser) -> None:
    """--controller HOST:PORT and -o/--output, the same for every operator command."""
    parser.add_argument(
        "--controller",
        default=default_controller(),
        metavar="HOST:PORT",
        help=f"the controller's address (default: ${CONTROLLER_ENV}, else {DEFAULT_CONTROLLER})",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        default="table",
        help="table (default), wide (more columns), json or yaml (the same document)",
    )


def print_document(doc: Any, output: str) -> None:
    """`doc` (plain dicts, lists and scalars) as JSON or as YAML, on stdout."""
    if output == "yaml":
        yaml.safe_dump(doc, sys.stdout, sort_keys=False, allow_unicode=True, default_flow_style=False)
        return
    json.dump(doc, sys.stdout, indent=2, sort_keys=False, allow_nan=False)
    sys.stdout.write("\n")
