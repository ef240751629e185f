"""The ``sdpaxos`` command line as a whole (issue 21 point 2): every option of every
subcommand has help text; ``--version``; shared client options before or after a verb;
an address without a port is a usage error."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from bench.cli import SUBCOMMANDS, build_parser, main
from consensus.runtime.exit_codes import USAGE
from consensus.runtime.status import package_version


def _options(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    """Every argument of ``parser`` and of its subparsers, depth first, with its command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        else:
            yield path, action


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_option_of_every_subcommand_has_help(command: str) -> None:
    missing = [f"{path}: {'/'.join(action.option_strings) or action.dest}"
               for path, action in _options(build_parser(command), "sdpaxos")
               if not action.help]
    assert not missing, "options without help text:\n" + "\n".join(missing)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"sdpaxos {package_version()}"


def _parsed(argv: list[str]) -> dict[str, object]:
    args = vars(build_parser(argv[0]).parse_args(argv))
    args.pop("_run")
    return args


@pytest.mark.parametrize("before, after", [
    (["ctl", "--config", "c.toml", "--json", "status", "g"],
     ["ctl", "status", "g", "--config", "c.toml", "--json"]),
    (["ctl", "--server", "h:50051", "--timeout", "3", "watch", "--count", "3"],
     ["ctl", "watch", "--count", "3", "--timeout", "3", "--server", "h:50051"]),
    (["ctl", "--endpoints", "a:1,b:2", "config", "apply", "f.yaml"],
     ["ctl", "config", "apply", "f.yaml", "--endpoints", "a:1,b:2"]),
    (["endpoint", "--cluster", "--endpoints", "a:1", "health", "--json"],
     ["endpoint", "health", "--json", "--cluster", "--endpoints", "a:1"]),
])
def test_client_options_parse_the_same_before_or_after_the_verb(
    before: list[str], after: list[str]
) -> None:
    assert _parsed(before) == _parsed(after)


def test_an_option_after_the_verb_overrides_one_before_it() -> None:
    args = _parsed(["ctl", "--timeout", "3", "summary", "--timeout", "7"])
    assert args["timeout"] == 7.0
    assert _parsed(["ctl", "--endpoints", "a:1", "summary"])["timeout"] == 10.0


@pytest.mark.parametrize("argv", [
    ["ctl", "--server", "localhost", "summary"],
    ["ctl", "summary", "--endpoints", "a:1,b"],
    ["endpoint", "status", "--endpoints", "a:0"],
    ["get", "k", "--endpoints", "[::1]"],
])
def test_an_address_without_a_valid_port_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == USAGE
    assert "expected HOST:PORT" in capsys.readouterr().err
