"""The README matches the program: every command in its command table exists, every flag the table
lists is in that command's --help, every subcommand has a row, and the install hints work from a
clone."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest

from agent.probes.worker import NO_TORCH
from controller.main import AGENT_COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")
CHOICES = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*) ([a-z]+(?:\\?\|[a-z]+)+)\b")


def command_table(text: str) -> dict[str, str]:
    """The rows of the table under "## Command line": `gpufleet COMMAND ...` -> the whole row."""
    section = text.split("\n## Command line\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        match = re.match(r"\| `gpufleet ([^`]*)`", line)
        if match:
            words = match.group(1).split()
            rows["" if words[0].startswith("-") else words[0]] = line
    return rows


ROWS = command_table(README)


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@cache
def help_text(command: str) -> str:
    """`gpufleet COMMAND --help` as a user sees it (the agent's commands run in their own interpreter)."""
    if command in AGENT_COMMANDS:
        proc = subprocess.run(
            [sys.executable, "-m", "controller", command, "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return proc.stdout
    return (subparsers()[command] if command else build_parser()).format_help()


def test_the_table_is_found_and_lists_every_command() -> None:
    assert {"demo", "controller", "agent", "nodes", "node", "findings", "probe-node", ""} <= set(ROWS)
    assert set(subparsers()) <= set(ROWS), "a subcommand without a row in the README's command table"


def missing(command: str, row: str) -> list[str]:
    """The flags (and `--flag a|b` values) the row lists that `gpufleet COMMAND --help` lacks."""
    text = help_text(command)
    flags = set(FLAG.findall(row))
    gone = sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text))
    for flag, values in CHOICES.findall(row):
        gone += [
            f"{flag} {v}" for v in values.replace("\\", "").split("|") if not re.search(rf"\b{v}\b", text)
        ]
    return gone


@pytest.mark.parametrize("command", sorted(ROWS), ids=lambda c: c or "gpufleet")
def test_every_flag_in_the_table_is_in_the_commands_help(command: str) -> None:
    assert FLAG.findall(ROWS[command]) or not command
    gone = missing(command, ROWS[command])
    assert not gone, f"gpufleet {command}: the README lists {gone}, its --help does not"


def test_the_check_fails_for_a_flag_or_value_the_program_lacks() -> None:
    readme = README.replace("`gpufleet nodes [", "`gpufleet nodes [--no-such-flag] [")
    readme = readme.replace("[--device cuda\\|cpu]", "[--device cuda\\|cpu\\|tpu]")
    rows = command_table(readme)
    assert missing("nodes", rows["nodes"]) == ["--no-such-flag"]
    assert missing("probe", rows["probe"]) == ["--device tpu"]


def test_install_with_probes_hints_work_from_a_clone() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("torch") for req in extras["probes"])
    hints = [*re.findall(r"pip install[^`\n]*", README), NO_TORCH]
    with_probes = [h for h in hints if "[probes]" in h]
    assert with_probes
    for hint in with_probes:  # the package is not on an index: install the clone, quoted for zsh
        assert "'.[probes]'" in hint, hint
