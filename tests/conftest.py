"""Suite-wide setup: every core built in a test checks its state owners' invariants as they
change (``consensus.protocol.checks``), as in the simulator."""

from __future__ import annotations

import pytest

from consensus.protocol import checks


def pytest_configure(config: pytest.Config) -> None:
    checks.enable()
