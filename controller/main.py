"""The `gpufleet` command: a thin dispatcher.

`gpufleet agent`, `gpufleet bmc` and `gpufleet probe` hand over to the agent's own command lines in a fresh
interpreter (the controller never imports the agent); every other command lives in the controller
package.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from controller.cli.output import DEFAULT_CONTROLLER, add_limit_argument, add_operator_arguments
from protos.version import version

__all__ = ["DEFAULT_CONTROLLER", "build_parser", "main"]

# command -> the agent module run with -m
AGENT_COMMANDS = {"agent": "agent.cli", "bmc": "agent.bmc_cli", "probe": "agent.probe_cli"}


def _demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="run a simulated fleet and a controller on this machine")
    demo.add_argument("--nodes", type=int, default=16, help="simulated nodes (default 16)")
    demo.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    demo.add_argument("--faults", type=int, default=2, help="faults to inject, of distinct kinds (default 2)")
    demo.add_argument(
        "--seconds",
        type=float,
        help="run this long once every agent is connected, then summarise (default: until Ctrl-C)",
    )
    demo.add_argument(
        "--seed", type=int, help="random seed for faults and the fleet (default: a random one, printed)"
    )
    demo.add_argument("--json", action="store_true", help="print one JSON summary on stdout; logs on stderr")
    demo.add_argument(
        "--tuning",
        choices=("off", "recommend", "auto"),
        default="off",
        help="close the loop: agents may tune, the controller recommends (or, auto, applies) fixes; "
        "fixable faults are injected first and the run ends once every fault has its outcome "
        "(default off)",
    )
    demo.add_argument(
        "--kubernetes",
        choices=("off", "fake"),
        default="off",
        help="fake: the nodes are a Kubernetes cluster (gpufleet's fake API server): a node with a "
        "hardware fault is cordoned, drained, repaired, re-probed and uncordoned (implies --tuning "
        "auto unless given)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufleet",
        description="GPU fleet telemetry: find the slow node, say why.",
    )
    parser.add_argument("--version", action="version", version=f"gpufleet {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    _demo_parser(sub)

    ctl = _controller_parser(sub)

    sub.add_parser("agent", help="run the per-node agent (see gpufleet agent --help)", add_help=False)
    sub.add_parser("bmc", help="read a BMC through Redfish (see gpufleet bmc --help)", add_help=False)
    sub.add_parser("probe", help="run the probes on this machine (see gpufleet probe --help)", add_help=False)

    for name, text in (
        ("nodes", "list nodes and their health"),
        ("node", "show one node: inventory, readings, probes, findings"),
        ("findings", "list findings"),
    ):
        p = sub.add_parser(name, help=text)
        if name == "nodes":
            p.add_argument(
                "--watch",
                action="store_true",
                help="a refreshing view, redrawn every --interval until Ctrl-C",
            )
            p.add_argument(
                "--interval",
                type=float,
                default=5.0,
                metavar="S",
                help="with --watch: seconds between refreshes (default 5)",
            )
        if name == "node":
            p.add_argument("name", help="node name")
            p.add_argument(
                "--history",
                action="store_true",
                help="the node's health history: its findings opening and resolving, and its audit entries "
                "(acks, silences, retunes, drains), oldest first",
            )
        if name in ("node", "findings"):
            p.add_argument(
                "--since",
                default="",
                metavar="D",
                help="a duration back from now (90s, 30m, 2h, 1d) or an RFC 3339 time: findings seen since "
                "then, resolved ones included (node: with --history)",
            )
        if name == "findings":
            p.add_argument("--node", default="", help="only this node")
            p.add_argument("--all", action="store_true", help="include resolved and silenced findings")
        add_operator_arguments(p)

    probe = sub.add_parser(
        "probe-node",
        help="ask a connected node to run probes now and show the results",
        description="Ask a connected node to run probes now (a command on its stream) and wait for "
        "the results. Exit status: 0 every probe ran, 1 a probe failed or no answer in time (or no "
        "controller), 2 bad arguments, unknown or unconnected node.",
    )
    probe.add_argument("name", help="node name")
    probe.add_argument(
        "--probe",
        action="append",
        default=[],
        metavar="NAME",
        help="gemm, membw, pcie, nccl (repeatable; default: the agent's suite)",
    )
    probe.add_argument(
        "--gpu",
        action="append",
        default=[],
        type=int,
        metavar="N",
        help="GPU index (repeatable; default: every GPU)",
    )
    probe.add_argument(
        "--force", action="store_true", help="probe even busy GPUs (the agent refuses them otherwise)"
    )
    probe.add_argument("--no-wait", action="store_true", help="print the command id and return at once")
    probe.add_argument(
        "--timeout", type=float, default=120.0, metavar="SECONDS", help="wait at most this long (default 120)"
    )
    add_operator_arguments(probe)

    from controller.cli.profiles import add_profile_arguments

    profs = sub.add_parser(
        "profiles",
        help="list the tuning profiles (shipped, and a site's own with --profiles-dir)",
        description="List the tuning profiles: name, levels (gpu, os, bmc), settings, risk (needs_reboot "
        "if any setting does), source (shipped or site). Read on this machine; no controller needed.",
    )
    add_profile_arguments(profs)
    prof = sub.add_parser(
        "profile",
        help="show one tuning profile: every setting with its target, risk, reason and source",
        description="Show one tuning profile (`gpufleet profile show NAME`). Exit status 2 for an "
        "unknown name or a profile that does not validate.",
    )
    prof.add_argument("action", choices=["show"], help="show: every setting of the profile")
    prof.add_argument("name", help="profile name (see gpufleet profiles)")
    add_profile_arguments(prof)

    cmds = sub.add_parser(
        "commands",
        help="list recent commands sent to agents: state, requester, timings, result",
        description="List the commands the controller sent to agents, newest first (probe runs and "
        "tuning applies; drains later): id, node, kind, state, requester, created/sent/finished, "
        "result.",
    )
    cmds.add_argument("--node", default="", help="only this node")
    add_limit_argument(cmds)
    add_operator_arguments(cmds)

    _add_safety_commands(sub)
    _add_tuning_commands(sub)
    _add_kube_commands(sub, ctl)
    from controller.cli.certs import add_certs_parser

    add_certs_parser(sub)
    from controller.cli.tokens import add_token_parser

    add_token_parser(sub)
    from controller.cli.record import add_record_parsers

    add_record_parsers(sub)
    return parser


def _controller_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """`gpufleet controller`'s flags; each beats the same key of --config."""
    ctl = sub.add_parser("controller", help="run the controller")
    ctl.add_argument("--listen", metavar="HOST:PORT", help="gRPC address (default 127.0.0.1:50051)")
    ctl.add_argument(
        "--db",
        metavar="PATH|URL",
        help="SQLite file (default gpufleet.db) or postgresql://USER:PASSWORD@HOST:PORT/DATABASE; "
        "$GPUFLEET_DB gives it without showing the password in the process list",
    )
    ctl.add_argument(
        "--metrics-address",
        metavar="HOST:PORT|none",
        help="Prometheus /metrics address (default 0.0.0.0:9401); none: no metrics server",
    )
    ctl.add_argument("--config", metavar="FILE", help="YAML config file")
    ctl.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    ctl.add_argument("--ready-file", help=argparse.SUPPRESS)
    ctl.add_argument("--tls-cert", metavar="FILE", help="PEM certificate of the controller (mutual TLS)")
    ctl.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    ctl.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="PEM CA that signed the agents' (and operators') client certificates",
    )
    ctl.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext gRPC on a non-loopback address: anyone who can reach it can speak as any node",
    )
    ctl.add_argument(
        "--operator-listen",
        metavar="HOST:PORT",
        help="a second gRPC port for operators only: server TLS and tokens, no client certificates",
    )
    ctl.add_argument(
        "--ingest-fronts",
        type=int,
        metavar="N",
        help="N processes serve the agents' port and relay their streams to the controller "
        "(needs --operator-listen; default 0: the controller serves it itself)",
    )
    ctl.add_argument(
        "--operator-tokens", metavar="FILE", help="YAML file of operator tokens (name, role, sha256)"
    )
    ctl.add_argument(
        "--metrics-web-config",
        metavar="FILE",
        help="Prometheus web-config file (TLS, basic auth) for /metrics",
    )
    ctl.add_argument(
        "--record",
        metavar="FILE",
        help="append every accepted Hello and frame to FILE (JSON Lines, gzip-compressed if FILE ends .gz; "
        "for gpufleet analyze)",
    )
    return ctl


def _add_kube_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], ctl: argparse.ArgumentParser
) -> None:
    """`gpufleet cordon`, `gpufleet uncordon` and `gpufleet drain`: Kubernetes node actions; the
    controller's --kubeconfig."""
    ctl.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="the Kubernetes cluster for node actions (default: kubernetes.kubeconfig, else the "
        "in-cluster service account, else $KUBECONFIG)",
    )
    cordon = sub.add_parser(
        "cordon",
        help="mark a Kubernetes node unschedulable (audited, breaker-counted)",
        description="Cordon a Kubernetes node through the controller: audited, counted by the blast-radius "
        "breaker, recorded in the annotation gpufleet.io/cordoned-by. Exit status: 0 done (or cordoned "
        "already), 1 refused by the breaker or no controller, 2 unknown node, no cluster configured, a "
        "node under someone else's maintenance or busy.",
    )
    cordon.add_argument("name", metavar="NODE", help="node name")
    cordon.add_argument("--reason", default="", metavar="TEXT", help="why (audited)")
    add_operator_arguments(cordon)

    uncordon = sub.add_parser(
        "uncordon",
        help="make a node gpufleet cordoned schedulable again (--force: someone else's cordon)",
        description="Uncordon a Kubernetes node through the controller (audited; recovery, never counted "
        "by the breaker). A node cordoned by someone else is refused unless --force. Exit status as "
        "for cordon.",
    )
    uncordon.add_argument("name", metavar="NODE", help="node name")
    uncordon.add_argument("--reason", default="", metavar="TEXT", help="why (audited)")
    uncordon.add_argument("--force", action="store_true", help="uncordon it even if someone else cordoned it")
    add_operator_arguments(uncordon)

    drain = sub.add_parser(
        "drain",
        help="cordon a node and evict its pods, as kubectl drain (audited, breaker-counted)",
        description="Drain a Kubernetes node through the controller, as kubectl drain does: cordon, evict "
        "every pod through the Eviction API (DaemonSet-managed and mirror pods are skipped; PDBs are "
        "respected, retried with backoff), wait for them to go. Pods with emptyDir data or no controller "
        "are refused unless the controller's config allows them. Asks on a terminal unless --yes. "
        "Exit status: 0 drained (or planned, --dry-run), 1 blocked, timed out, failed or refused by the "
        "breaker, 2 unknown node, no cluster configured, a node under maintenance or busy, pods it may "
        "not evict.",
    )
    drain.add_argument("name", metavar="NODE", help="node name")
    drain.add_argument("--reason", default="", metavar="TEXT", help="why (audited)")
    drain.add_argument("--dry-run", action="store_true", help="show what would be evicted and skipped")
    drain.add_argument(
        "--timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="give up after this many seconds: blocked (a PDB) or timed_out (default: the controller's "
        "kubernetes.drain.timeout_seconds)",
    )
    drain.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_operator_arguments(drain)


def _add_safety_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gpufleet breaker [reset]`, `gpufleet history`, and ack, silence(s), unsilence, maintenance."""
    from controller.cli.silences import add_silence_parsers

    add_silence_parsers(sub)
    brk = sub.add_parser(
        "breaker",
        help="show the blast-radius breaker, or re-arm it (breaker reset)",
        description="Show the blast-radius breaker: armed or tripped (why, since when), the nodes in "
        "action within its window per peer group and fleet-wide, and the limits. `gpufleet breaker "
        "reset --reason TEXT` re-arms a tripped breaker (audited; asks on a terminal unless --yes).",
    )
    brk.add_argument("action", nargs="?", choices=["reset"], help="reset: re-arm the breaker")
    brk.add_argument("--reason", default="", metavar="TEXT", help="with reset: why (required, audited)")
    brk.add_argument("--yes", action="store_true", help="with reset: do not ask for confirmation")
    add_operator_arguments(brk)

    hist = sub.add_parser(
        "history",
        help="the audit log: every mutating request, who, what, why, when and its outcome",
        description="The audit log, newest first: each mutating request (probe-node, breaker reset, "
        "retune and approve, the tuning policy's applies, cordon, uncordon, drain) with its requester, "
        "parameters, reason and outcome.",
    )
    hist.add_argument("--node", default="", help="only this node")
    hist.add_argument(
        "--since",
        default="",
        metavar="D",
        help="an ISO date/time (UTC unless it says) or a duration: 30m, 2h, 3d",
    )
    add_limit_argument(hist)
    add_operator_arguments(hist)


def _add_tuning_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gpufleet recommendations`, `gpufleet retune` and `gpufleet approve`."""
    recs = sub.add_parser(
        "recommendations",
        help="what the controller proposes for each node's findings, and how each apply went",
        description="Tuning recommendations, newest first: per node the cause, the fix (a profile, or "
        "drain/investigate when no setting fixes it), the exact changes (setting, current, target), the "
        "evidence (finding ids), the expected effect, the risk (online, needs_reboot), the policy and the "
        "state (proposed, approved, applying, verified, rolled_back, failed, needs_attention).",
    )
    recs.add_argument("--node", default="", help="only this node")
    add_limit_argument(recs)
    add_operator_arguments(recs)

    retune = sub.add_parser(
        "retune",
        help="apply a tuning profile to a node (audited, breaker-checked, verified by re-probe)",
        description="Apply a tuning profile to one node: the controller audits the request, asks the "
        "blast-radius breaker and sends the agent an ApplyProfile command; the agent applies it all or "
        "nothing, re-probes the GPUs it touched and commits, or rolls back. Asks on a terminal unless "
        "--yes. --dry-run shows the agent's plan and changes nothing. Exit status: 0 committed (or "
        "planned), 1 rolled back, failed, no answer or refused by the breaker, 2 bad arguments, unknown "
        "node or profile, or a node that cannot take it now.",
    )
    retune.add_argument("name", metavar="NODE", help="node name")
    retune.add_argument(
        "--profile", default="", metavar="P", help="profile name (required; see gpufleet profiles)"
    )
    retune.add_argument("--dry-run", action="store_true", help="ask the agent for its plan; change nothing")
    retune.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    retune.add_argument("--reason", default="", metavar="TEXT", help="why (audited)")
    retune.add_argument(
        "--gpu",
        action="append",
        default=[],
        type=int,
        metavar="N",
        help="GPU index (repeatable; default: every GPU)",
    )
    _add_wait_arguments(retune)
    add_operator_arguments(retune)

    approve = sub.add_parser(
        "approve",
        help="approve a proposed recommendation: it is applied as retune would (a drain: started)",
        description="Approve a proposed recommendation (see gpufleet recommendations): it is applied "
        "now, as gpufleet retune would apply its changes; a drain recommendation starts the drain "
        "(waiting for its outcome: exit 0 drained). Exit status as for retune.",
    )
    approve.add_argument("id", metavar="REC_ID", help="the recommendation's id")
    approve.add_argument("--reason", default="", metavar="TEXT", help="why (audited)")
    _add_wait_arguments(approve)
    add_operator_arguments(approve)


def _add_wait_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-wait", action="store_true", help="print the command id and return at once")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="wait at most this long for the agent's answer (default 600)",
    )


def _node_views(args: argparse.Namespace) -> int:
    """`gpufleet nodes [--watch]` and `gpufleet node NAME [--history [--since D]]`."""
    from controller.cli import operator

    if args.command == "nodes":
        if args.watch:
            from controller.cli.watch import watch_nodes

            return watch_nodes(args.controller, args.output, interval=args.interval)
        return operator.nodes(args.controller, args.output)
    if args.history:
        from controller.cli.node_history import node_history

        return node_history(args.controller, args.name, args.output, since=args.since)
    if args.since:
        print("gpufleet: --since goes with `gpufleet node NAME --history`", file=sys.stderr)
        return 2
    return operator.node(args.controller, args.name, args.output)


def main(argv: list[str] | None = None) -> int:
    """The `gpufleet` command; a reader that goes away (`| head`) ends it quietly (the installed
    command is controller.command's main, which loads this module inside the same guard)."""
    from controller import pipes

    return pipes.run(lambda: run(sys.argv[1:] if argv is None else argv))


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args, but arguments the command does not take are refused by the command's own
    parser: `gpufleet silence: error: ...` under silence's usage, not gpufleet's."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _exec_agent_command(argv: list[str]) -> None:
    """Replace this process with `python -m agent.launch MODULE ARG...`: a fresh interpreter keeps
    the agent's import graph its own. SIGINT stays blocked across the exec (the signal mask is
    kept) until agent.launch is inside pipes.run, so a Ctrl-C while the new interpreter starts
    waits and then ends it in one line, not with a traceback from its start-up."""
    command = [sys.executable, "-m", "agent.launch", AGENT_COMMANDS[argv[0]], *argv[1:]]
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        os.execv(sys.executable, command)
    finally:  # only if the exec failed
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run(argv: list[str]) -> int:
    """The command, without the guard for a closed stdout or Ctrl-C (main's, or the caller's)."""
    if argv and argv[0] in AGENT_COMMANDS:
        # A fresh interpreter keeps the agent's import graph its own.
        _exec_agent_command(argv)
    args = _parse(build_parser(), argv)
    if args.command == "controller":
        from controller.cli.run_controller import run_controller

        return run_controller(args)
    if args.command == "demo":
        from controller.demo.runner import run_demo

        return run_demo(args)
    if args.command == "certs":
        from controller.cli import certs

        return certs.run(args)
    if args.command in ("profiles", "profile"):
        from controller.cli import profiles

        if args.command == "profiles":
            return profiles.profiles(args.profiles_dir, args.output)
        return profiles.profile_show(args.name, args.profiles_dir, args.output)
    if args.command == "token":
        from controller.cli import tokens

        return tokens.create(args.name, args.role, args.tokens_file)
    if args.command == "analyze":
        from controller.cli.analyze import analyze

        return analyze(args.files, args.output, config=args.config)
    from controller.cli import operator
    from controller.cli.credentials import CredentialError, operator_target

    try:  # an operator command (add_operator_arguments): its credentials, read once
        if hasattr(args, "token_file"):
            args.controller = operator_target(args)
    except CredentialError as exc:
        print(f"gpufleet: {exc}", file=sys.stderr)
        return 2

    if args.command in ("nodes", "node"):
        return _node_views(args)
    if args.command in ("ack", "silence", "silences", "unsilence", "maintenance"):
        from controller.cli import silences

        return silences.run(args)
    if args.command == "breaker":
        from controller.cli import breaker

        if args.action == "reset":
            return breaker.reset(args.controller, args.output, reason=args.reason, yes=args.yes)
        if args.reason or args.yes:
            print("gpufleet: --reason and --yes go with `gpufleet breaker reset`", file=sys.stderr)
            return 2
        return breaker.breaker(args.controller, args.output)
    if args.command == "history":
        from controller.cli.history import history

        return history(args.controller, args.output, node=args.node, since=args.since, limit=args.limit)
    if args.command == "recommendations":
        from controller.cli.recommendations import recommendations

        return recommendations(args.controller, args.output, node=args.node, limit=args.limit)
    if args.command in ("retune", "approve"):
        from controller.cli import retune

        if args.command == "approve":
            return retune.approve(
                args.controller,
                args.id,
                args.output,
                reason=args.reason,
                wait=not args.no_wait,
                timeout=args.timeout,
            )
        return retune.retune(
            args.controller,
            args.name,
            args.output,
            profile=args.profile,
            dry_run=args.dry_run,
            yes=args.yes,
            reason=args.reason,
            gpus=args.gpu,
            wait=not args.no_wait,
            timeout=args.timeout,
        )
    if args.command in ("cordon", "uncordon", "drain"):
        from controller.cli import kube

        if args.command == "cordon":
            return kube.cordon(args.controller, args.name, args.output, reason=args.reason)
        if args.command == "uncordon":
            return kube.uncordon(
                args.controller, args.name, args.output, reason=args.reason, force=args.force
            )
        return kube.drain(
            args.controller,
            args.name,
            args.output,
            reason=args.reason,
            dry_run=args.dry_run,
            timeout=args.timeout,
            yes=args.yes,
        )
    if args.command == "record":
        from controller.cli.record import record

        return record(
            args.controller,
            args.out,
            args.output,
            duration=args.duration,
            node=args.node,
            workers=args.workers,
        )
    if args.command == "commands":
        from controller.cli.commands import commands

        return commands(args.controller, args.output, node=args.node, limit=args.limit)
    if args.command == "probe-node":
        from controller.cli.probe_node import probe_node

        return probe_node(
            args.controller,
            args.name,
            args.output,
            probes=args.probe,
            gpus=args.gpu,
            force=args.force,
            wait=not args.no_wait,
            timeout=args.timeout,
        )
    return operator.findings(
        args.controller,
        args.output,
        node=args.node,
        include_resolved=args.all,
        include_silenced=args.all,
        since=args.since,
    )
