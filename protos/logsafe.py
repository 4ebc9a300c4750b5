"""Text from a node, made safe to print: in a terminal, in a table, in a log line.

A node's name, GPU name, BMC message (anything a node or a BMC sends) may hold control characters:
an ESC that starts an ANSI or OSC sequence (colours, a fake hyperlink, a cleared screen), a
newline that forges a log line, a bidi override that shows text in another order than it is.
`escape_control` shows each as a visible escape (`\\x1b`, `\\n`, `\\u202e`); other text is kept
as it is.

The logging side, installed by both `gpufleet controller` and `gpufleet agent` (`configure_logging`):
- `EscapeFilter` escapes the arguments of every record (the template is ours; a message with no
  arguments, e.g. an f-string, is escaped whole). Tracebacks are left as they are.
- `RateLimitFilter` lets at most `per_window` lines a window through per (logger, template, first
  argument), then one "N similar lines suppressed" line when the window turns; the suppressed
  lines are counted per logger in `SUPPRESSED`, which the metrics pages export.

Shared by agent and controller, so only the standard library here.
"""

from __future__ import annotations

import atexit
import logging
import numbers
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any

# C0, DEL, C1, the bidi marks, embeddings, overrides and isolates, and the line/paragraph separators.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_control(text: str) -> str:
    """`text` with every control character (C0, C1, DEL, ESC, bidi controls) as a visible escape."""
    return CONTROL.sub(_escape, text)


def has_control(text: str) -> bool:
    return CONTROL.search(text) is not None


class _Escaped:
    """An argument other than a string or a number: %s and %r print it with control characters escaped."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __str__(self) -> str:
        return escape_control(str(self.value))

    def __repr__(self) -> str:
        return escape_control(repr(self.value))


def _safe_arg(value: object) -> object:
    if isinstance(value, str):
        return escape_control(value)
    if value is None or isinstance(value, numbers.Number | bytes | _Escaped):
        return value  # numbers keep %d and %.1f; bytes print as b'...', escaped already
    return _Escaped(value)


class EscapeFilter(logging.Filter):
    """Escapes control characters in a record's arguments (or its whole message when it has none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "logsafe_escaped", False):
            return True
        args = record.args
        if isinstance(args, Mapping):
            record.args = {k: _safe_arg(v) for k, v in args.items()}
        elif args:
            record.args = tuple(_safe_arg(a) for a in args)
        elif isinstance(record.msg, str):
            record.msg = escape_control(record.msg)
        else:
            record.msg = escape_control(str(record.msg))
        record.logsafe_escaped = True
        return True


class SuppressedCounts:
    """Log lines a rate limit held back, per logger name: what the log_lines_suppressed_total metrics show."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, logger: str, n: int = 1) -> None:
        with self._lock:
            self._counts[logger] = self._counts.get(logger, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


SUPPRESSED = SuppressedCounts()  # the process's: both metrics pages read it


@dataclass
class _Window:
    start: float
    passed: int = 0
    suppressed: int = 0
    last: logging.LogRecord | None = None


Key = tuple[str, str, str]
KEY_ARG_CHARS = 200  # of the first argument, in a rate-limit key


def _key(record: logging.LogRecord) -> Key:
    args = record.args
    first: object = ""
    if isinstance(args, Mapping):
        first = next(iter(args.values()), "")
    elif args:
        first = args[0]
    return record.name, str(record.msg), str(first)[:KEY_ARG_CHARS]


class RateLimitFilter(logging.Filter):
    """At most `per_window` records per key and window on `handler`; the rest are counted, and one
    "N similar lines suppressed" record follows when the key's window has ended (emitted with the
    next record that reaches the handler, or by `flush`).

    The key is (logger, template, first argument): one noisy node does not silence the others.
    Past `max_keys` keys in flight, new ones share a key per (logger, template), so a flood of
    distinct first arguments cannot grow memory without bound either.
    """

    def __init__(
        self,
        handler: logging.Handler,
        *,
        per_window: int = 10,
        window_seconds: float = 60.0,
        max_keys: int = 10_000,
        counts: SuppressedCounts = SUPPRESSED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.handler = handler
        self.per_window = per_window
        self.window_seconds = window_seconds
        self.max_keys = max_keys
        self.counts = counts
        self.clock = clock
        self._lock = threading.Lock()
        self._windows: dict[Key, _Window] = {}  # in the order they started, so in the order they end

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "logsafe_summary", False) or getattr(record, "logsafe_keep", False):
            return True
        now = self.clock()
        with self._lock:
            ended = self._sweep(now)
            key = _key(record)
            if key not in self._windows and len(self._windows) >= self.max_keys:
                key = (key[0], key[1], "\0overflow")
            window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = _Window(start=now)
            passed = window.passed < self.per_window
            if passed:
                window.passed += 1
            else:
                window.suppressed += 1
                window.last = record
        for summary in ended:
            self.handler.handle(summary)
        if not passed:
            self.counts.add(record.name)
        return passed

    def _sweep(self, now: float) -> list[logging.LogRecord]:
        """Drop the windows that have ended; a summary record for each that suppressed lines."""
        summaries = []
        while self._windows:
            key, window = next(iter(self._windows.items()))
            if now - window.start < self.window_seconds:
                break
            del self._windows[key]
            if window.suppressed and window.last is not None:
                summaries.append(self._summary(window))
        return summaries

    def _summary(self, window: _Window) -> logging.LogRecord:
        last = window.last
        assert last is not None
        try:
            example = last.getMessage()
        except (TypeError, ValueError):  # arguments that do not fit the template: logging says so itself
            example = str(last.msg)
        return logging.makeLogRecord(
            {
                "name": last.name,
                "levelno": last.levelno,
                "levelname": last.levelname,
                "pathname": last.pathname,
                "lineno": last.lineno,
                "funcName": last.funcName,
                "msg": "%d similar lines suppressed in %.0fs, the last: %s",
                "args": (window.suppressed, self.window_seconds, example),
                "logsafe_summary": True,
            }
        )

    def flush(self) -> None:
        """Emit the summaries of every window that suppressed lines, ended or not (at exit)."""
        with self._lock:
            windows, self._windows = list(self._windows.values()), {}
        for window in windows:
            if window.suppressed and window.last is not None:
                self.handler.handle(self._summary(window))


FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# `log.info(..., extra=KEEP)`: a line the rate limit never holds back (the controller's audit lines).
KEEP = {"logsafe_keep": True}


def configure_logging(
    level: str | int, *, fmt: str = FORMAT, stream: IO[str] | None = None, **limits: Any
) -> logging.Handler:
    """`logging.basicConfig` with a handler that escapes node text and rate-limits repeated lines.

    Like basicConfig, it changes nothing when the root logger already has handlers (under pytest);
    the handler is returned either way. `limits` go to RateLimitFilter.
    """
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(logging.Formatter(fmt))
    limiter = RateLimitFilter(handler, **limits)
    handler.addFilter(limiter)  # first: the key holds the arguments as they were logged
    handler.addFilter(EscapeFilter())
    if not logging.getLogger().handlers:
        atexit.register(limiter.flush)
    logging.basicConfig(level=level if isinstance(level, int) else level.upper(), handlers=[handler])
    return handler
