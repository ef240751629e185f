"""``--rewrite``: regenerate the interaction scripts' expected output (see datadriven.py)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rewrite",
        action="store_true",
        default=False,
        help="rewrite the expected output of tests/protocol/interaction/testdata/*.txt",
    )
