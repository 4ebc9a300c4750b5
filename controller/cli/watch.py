"""`gpufleet nodes --watch [--interval S]`: the nodes table, redrawn every S seconds until Ctrl-C.

On a terminal the view is redrawn in place (rich Live), as `watch` does, with the worst nodes
that fit the screen and a line saying how many more there are; piped, a new table is
printed each interval with no escape codes, so a log of it reads top to bottom. A controller that
goes away is one line in the view (the last table stays under it) and is asked again next
interval; a controller that refuses us (no token, no permission, no operator service) ends the
watch with one line on stderr and exit status 1. Ctrl-C ends it with exit status 0.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import grpc
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from controller.cli import tables
from controller.cli.layout import clean, fit_table, plain, show
from controller.cli.operator import OperatorError, list_nodes, warn
from controller.cli.output import DOCUMENT_FORMATS
from protos.gpufleet.v1 import operator_pb2

# Errors no retry will mend: the watch ends on them.
FATAL = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED)


@dataclass
class WatchState:
    """What the view shows: the last nodes the controller gave, when, and the latest failure."""

    nodes: list[operator_pb2.NodeSummary] = field(default_factory=list)
    fetched_at: float | None = None
    warning: str = ""
    error: str = ""


def refresh(target: str, state: WatchState, now: float) -> None:
    """Ask the controller for its nodes once; a failure is kept in `state.error` unless it is FATAL."""
    try:
        state.warning, state.nodes = list_nodes(target)
    except OperatorError as exc:
        if exc.code in FATAL:
            raise
        state.error = str(exc)
        return
    state.fetched_at, state.error = now, ""


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def header(target: str, interval: float, now: float) -> Text:
    return plain(f"Every {interval:g}s: gpufleet nodes at {target}, {stamp(now)}", style="bold")


def lost_line(state: WatchState, interval: float) -> Text:
    """The one line a lost controller is: what failed, that we retry, how old the table below is."""
    since = f"; the table is from {stamp(state.fetched_at)}" if state.fetched_at is not None else ""
    return plain(f"{state.error} (retrying every {interval:g}s{since})", style="bold red")


CHROME = 5  # a table's lines beside its rows: title, top border, header, the rule under it, bottom


def view(
    target: str,
    state: WatchState,
    interval: float,
    now: float,
    width: int,
    *,
    wide: bool,
    height: int | None = None,
) -> Group:
    """The terminal view: header, the warning or the lost controller's line, the table fitted to `width`.
    Given the terminal's `height`, only the worst nodes that fit it are laid out (a fleet of 12,500
    would take seconds each redraw, for a screen of them), with a line saying how many more there are."""
    parts: list[RenderableType] = [header(target, interval, now)]
    if state.warning:
        parts.append(plain(f"WARNING: {state.warning}", style="bold"))
    if state.error:
        parts.append(lost_line(state, interval))
    if state.fetched_at is not None:
        nodes, title = state.nodes, None
        if height is not None:
            room = max(1, height - len(parts) - CHROME - 1)  # and a line for how many are not shown
            if len(nodes) > room:
                nodes, title = nodes[:room], f"Nodes ({len(state.nodes)}, the worst {room} shown)"
        table = tables.nodes_table(nodes, wide=wide, title=title)
        fitted, needed = fit_table(table, width)
        parts.append(fitted if needed <= width else table)  # wider: rich's table, fitted by rich
        if len(nodes) < len(state.nodes):
            hidden = len(state.nodes) - len(nodes)
            parts.append(plain(f"... and {hidden} more: gpufleet nodes lists them all", style="dim"))
    return Group(*parts)


@dataclass
class Watch:
    """One watch: where to ask, how often, and the clock and sleep it runs on (injected by tests)."""

    target: str
    interval: float
    wide: bool
    sleep: Callable[[float], None]
    clock: Callable[[], float]

    def live(self, console: Console) -> None:
        """Redraw the view in place on `console` (a terminal) until interrupted."""
        state = WatchState()
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                now = self.clock()
                refresh(self.target, state, now)
                shown = view(
                    self.target,
                    state,
                    self.interval,
                    now,
                    console.width,
                    wide=self.wide,
                    height=console.height,
                )
                live.update(shown, refresh=True)
                self.sleep(self.interval)

    def piped(self) -> None:
        """Print a header and a whole table (or the lost controller's line) each interval, on stdout."""
        state = WatchState()
        warned = False
        while True:
            now = self.clock()
            refresh(self.target, state, now)
            if state.warning and not warned:
                warn(state.warning)
                warned = True
            print(clean(header(self.target, self.interval, now).plain))
            if state.error:
                print(clean(lost_line(state, self.interval).plain))
            else:
                show(tables.nodes_table(state.nodes, wide=self.wide))
            print(flush=True)
            self.sleep(self.interval)


def watch_nodes(
    target: str,
    output: str,
    *,
    interval: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    console: Console | None = None,
) -> int:
    """Run the watch until Ctrl-C (exit 0) or a FATAL refusal (exit 1); bad arguments: exit 2."""
    if output in DOCUMENT_FORMATS:
        print(
            f"gpufleet: --watch shows a table; for {output}, run gpufleet nodes -o {output} again",
            file=sys.stderr,
        )
        return 2
    if not (math.isfinite(interval) and interval > 0):
        print("gpufleet: --interval must be a positive number of seconds", file=sys.stderr)
        return 2
    console = console or Console()
    watch = Watch(target, interval, output == "wide", sleep, clock)
    try:
        if console.is_terminal:
            watch.live(console)
        else:
            watch.piped()
    except KeyboardInterrupt:
        return 0
    except OperatorError as exc:
        print(f"gpufleet: {clean(str(exc))}", file=sys.stderr)
        return 1
    return 0
