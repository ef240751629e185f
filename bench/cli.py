"""``sdpaxos``: the command line. Each subcommand lives with the code it drives; this module
only assembles them."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: subcommand -> (module with ``add_arguments(parser)`` and ``run(args) -> int``, help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("consensus.sim.cli", "run the deterministic simulator over many seeds"),
    "lincheck": ("consensus.sim.lincheck", "check a recorded JSON-lines history"),
    "bench": ("bench.commands", "benchmarks (see sdpaxos bench --help)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sdpaxos", description="SDPaxos replication library and GPU allocation store"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args._run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
