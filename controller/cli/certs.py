"""`gpufleet certs`: a small lab PKI for mutual TLS between agents and controller (controller/cli/pki.py
makes it; this is the command line).

    gpufleet certs ca [--dir D] [--days N]
    gpufleet certs controller [--name DNS ...] [--ip IP ...]
    gpufleet certs node NODE [NODE ...]
    gpufleet certs operator NAME

Exit status: 0 (the files written, one a line), or 2 with one line on stderr (no CA yet, a file
exists and no --force, a bad name).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

KINDS = ("ca", "controller", "node", "operator")
DEFAULT_DIR = "gpufleet-pki"
CA_DAYS, LEAF_DAYS = 3650, 365


def add_certs_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `gpufleet certs` subcommand."""
    parser = sub.add_parser(
        "certs",
        help="make a lab PKI for mutual TLS: a CA, the controller's, nodes' and operators' certificates",
        description="Make a small lab PKI in --dir: `ca` (the CA: ca.crt, ca.key), `controller` (the "
        "controller's server certificate, SANs from --name and --ip; default localhost and "
        "127.0.0.1), `node NODE ...` (one client certificate per node in nodes/, the node name as "
        "its only DNS name) and `operator NAME` (a client certificate in operators/ with no DNS "
        "name, only the URI gpufleet:operator:NAME). Keys are written 0600; existing files are "
        "kept unless --force. Exit status: 0, or 2 (no CA yet, a file exists, a bad name).",
    )
    parser.add_argument("kind", choices=KINDS, help="what to make: ca, controller, node or operator")
    parser.add_argument("names", nargs="*", metavar="NAME", help="node names (node), the operator's name")
    parser.add_argument(
        "--dir", default=DEFAULT_DIR, metavar="D", help=f"the PKI directory (default ./{DEFAULT_DIR})"
    )
    parser.add_argument(
        "--days",
        type=int,
        metavar="N",
        help=f"validity in days (default {CA_DAYS} for the CA, {LEAF_DAYS} for the others; "
        "never past the CA's)",
    )
    parser.add_argument(
        "--name",
        action="append",
        default=[],
        metavar="DNS",
        help="controller: a DNS name agents and operators reach it by (repeatable)",
    )
    parser.add_argument(
        "--ip", action="append", default=[], metavar="IP", help="controller: an IP address (repeatable)"
    )
    parser.add_argument("--force", action="store_true", help="replace existing files")


def run(args: argparse.Namespace) -> int:
    """`gpufleet certs` from parsed arguments: 0, or 2 with one line on stderr."""
    from controller.cli import pki

    try:
        written = pki.make(
            args.kind,
            args.names,
            directory=Path(args.dir),
            days=args.days,
            dns=args.name,
            ips=args.ip,
            force=args.force,
        )
    except pki.CertsError as exc:
        print(f"gpufleet certs: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
