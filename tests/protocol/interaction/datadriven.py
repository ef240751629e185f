"""A small runner for data-driven test scripts, in the style of cockroachdb/datadriven.

A script is a sequence of blocks::

    # comment lines (and blank lines) between blocks are kept as they are
    command arg1 arg2 key=value
    optional input line
    optional input line
    ----
    expected output
    expected output
    <blank line>

The directive line names the command and its arguments (whitespace-separated tokens, handed
to the handler as they are). Lines up to ``----`` are the block's input. The expected output
runs to the next blank line. An output that itself contains blank lines is written between a
doubled separator and closed by one::

    command
    ----
    ----
    first paragraph

    second paragraph
    ----
    ----

``run_script`` runs every block through a handler (``handler(block) -> str``), compares each
output with the expected one and returns the script as it *should* read (the same comments,
directives and inputs, the actual outputs): the caller diffs it against the file, or writes
it back in rewrite mode.

Rewrite mode regenerates every expected output in place. Turn it on with the environment
variable ``SDPAXOS_REWRITE=1``, or with pytest's ``--rewrite`` option (registered by this
package's ``conftest.py``; pytest only honours it when the run names this directory, e.g.
``pytest tests/protocol/interaction --rewrite``). The diff of the rewritten files is what a
reviewer reads: check that each output shows what the comments above it claim.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "REWRITE_ENV",
    "SEPARATOR",
    "Block",
    "ScriptError",
    "diff",
    "parse",
    "render",
    "rewrite_requested",
    "run_script",
]

SEPARATOR = "----"
#: the environment variable that turns rewrite mode on (any of 1/true/yes)
REWRITE_ENV = "SDPAXOS_REWRITE"


class ScriptError(ValueError):
    """A script that cannot be parsed, or a block whose command the handler refused; the
    message names the file and line."""


@dataclass
class Block:
    """One directive with its input and expected output."""

    #: ``file:line`` of the directive, for error messages
    pos: str
    #: comment and blank lines that precede the directive, verbatim
    leading: list[str]
    #: the directive line, verbatim (``cmd`` and ``args`` are its tokens)
    directive: str
    cmd: str
    args: list[str]
    input: list[str] = field(default_factory=list)
    expected: str = ""

    def kwargs(self) -> dict[str, str]:
        """The ``key=value`` arguments."""
        return dict(a.split("=", 1) for a in self.args if "=" in a)

    def positional(self) -> list[str]:
        """The arguments that are not ``key=value``."""
        return [a for a in self.args if "=" not in a]


def rewrite_requested() -> bool:
    return os.environ.get(REWRITE_ENV, "").lower() in {"1", "true", "yes"}


def parse(text: str, name: str = "<script>") -> tuple[list[Block], list[str]]:
    """The blocks of a script, and the comment/blank lines after the last one."""
    lines = text.splitlines()
    blocks: list[Block] = []
    leading: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            leading.append(line)
            i += 1
            continue
        start = i
        tokens = line.split()
        i += 1
        inputs: list[str] = []
        while i < len(lines) and lines[i] != SEPARATOR:
            if not lines[i].strip():
                raise ScriptError(f"{name}:{start + 1}: {line!r} needs a {SEPARATOR!r} line")
            inputs.append(lines[i])
            i += 1
        if i == len(lines):
            raise ScriptError(f"{name}:{start + 1}: {line!r} needs a {SEPARATOR!r} line")
        i += 1  # the separator
        output: list[str] = []
        if i < len(lines) and lines[i] == SEPARATOR:
            # doubled separator: the output may hold blank lines, and ends at a doubled one
            i += 1
            while i + 1 < len(lines) and not (
                lines[i] == SEPARATOR and lines[i + 1] == SEPARATOR
            ):
                output.append(lines[i])
                i += 1
            if i + 1 >= len(lines):
                raise ScriptError(f"{name}:{start + 1}: unterminated {SEPARATOR!r} block")
            i += 2
        else:
            while i < len(lines) and lines[i].strip():
                output.append(lines[i])
                i += 1
        if i < len(lines) and not lines[i].strip():
            i += 1  # the blank line that ends the block (``render`` writes it back)
        blocks.append(
            Block(
                pos=f"{name}:{start + 1}",
                leading=leading,
                directive=line,
                cmd=tokens[0],
                args=tokens[1:],
                input=inputs,
                expected="\n".join(output),
            )
        )
        leading = []
    return blocks, leading


def _render_output(output: str) -> list[str]:
    out = [line.rstrip() for line in output.rstrip("\n").splitlines()]
    if any(not line for line in out):
        return [SEPARATOR, SEPARATOR, *out, SEPARATOR, SEPARATOR]
    return [SEPARATOR, *out]


def render(blocks: list[Block], outputs: list[str], trailing: list[str]) -> str:
    """The script text with ``outputs`` as the blocks' expected outputs."""
    lines: list[str] = []
    for block, output in zip(blocks, outputs, strict=True):
        lines.extend(block.leading)
        lines.append(block.directive)
        lines.extend(block.input)
        lines.extend(_render_output(output))
        lines.append("")
    lines.extend(trailing)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines) + "\n"


def run_script(path: Path, handler: Callable[[Block], str]) -> tuple[str, str]:
    """Run every block of the script at ``path``; return (the file's text, the text it
    should have: the same script with the actual outputs)."""
    text = path.read_text()
    blocks, trailing = parse(text, path.name)
    outputs: list[str] = []
    for block in blocks:
        try:
            outputs.append(handler(block))
        except ScriptError:
            raise
        except (ValueError, KeyError, IndexError) as exc:
            raise ScriptError(f"{block.pos}: {block.directive!r}: {exc}") from exc
    return text, render(blocks, outputs, trailing)


def diff(expected: str, actual: str, name: str) -> str:
    """A unified diff, expected file against actual output, for failure messages."""
    return "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            f"{name} (expected)",
            f"{name} (actual)",
        )
    )
