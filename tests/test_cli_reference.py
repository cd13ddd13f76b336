"""docs/cli.md lists every ``narwhal`` command and every flag argparse knows, once, and no
command argparse does not know: the reference cannot drift from the parser."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from narwhal.cli import build_parser
from tests.compiled_stage import EXPECT_COMPILED

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("narwhal",)
) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every command (``narwhal``, ``narwhal serve``, ``narwhal vllm setup``...) by its words."""
    found = {path: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(commands(sub, (*path, name)))
    return found


def names(parser: argparse.ArgumentParser) -> list[str]:
    """What the reference must show of a command: each option string (but ``-h``/``--help``),
    and each positional argument upper-cased, as a usage line names it."""
    shown: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        if action.option_strings:
            shown.extend(action.option_strings)
        else:
            shown.append(action.dest.upper())
    return shown


def sections() -> dict[tuple[str, ...], str]:
    """The reference's ``## `narwhal ...``` sections: words -> the section's text."""
    text = REFERENCE.read_text("utf-8")
    parts = re.split(r"^## `(narwhal[^`]*)`\s*$", text, flags=re.MULTILINE)
    return {tuple(head.split()): body for head, body in zip(parts[1::2], parts[2::2], strict=True)}


@pytest.mark.skipif(EXPECT_COMPILED, reason="the compiled stage copies no docs/")
def test_every_command_and_flag_is_in_the_reference_once() -> None:
    known = commands(build_parser())
    documented = sections()
    assert set(documented) == set(known), "docs/cli.md's commands differ from argparse's"
    for words, parser in known.items():
        rows = [line for line in documented[words].splitlines() if line.startswith("| `")]
        firsts = [row[3:].split("`")[0].split(" ")[0] for row in rows]
        command = " ".join(words)
        for name in names(parser):
            assert firsts.count(name) == 1, f"{command}: {name} listed {firsts.count(name)} times"
        assert sorted(firsts) == sorted(names(parser)), f"{command}: rows argparse does not know"
