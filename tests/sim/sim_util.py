"""Helpers shared by the simulator tests."""

from __future__ import annotations

import argparse

from consensus.sim.cli import add_arguments


def cli_args(*argv: str, **overrides: object) -> argparse.Namespace:
    """``sdpaxos sim`` arguments as its parser makes them from ``argv`` (one JSON report, one
    client per site, the foundation's link faults by default), then with ``overrides`` set."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--concurrency", "1", "--faults", "loss,dup,reorder", "--json", *argv]
    )
    for name, value in overrides.items():
        assert hasattr(args, name), name
        setattr(args, name, value)
    return args
