"""Invariant checks of the protocol cores' state owners: on in the simulator and the tests,
off in a replica process (where each costs one test of a flag).

A state owner (``sdpaxos.c_store.CStore``, ``sdpaxos.o_log.OLog``) states its invariants in
its header and, with checks on, verifies them as it changes; a broken one raises
``InvariantViolation`` — a bug in the core, never something a peer's message can cause (those
are refused at the codec and at admission). The switch is process-wide and read when a core
is built, like a test build's assertions (CockroachDB's ``crdb_test``, TigerBeetle's
``verify``): the simulator and the test suite turn it on (``enable``); nothing else does.
"""

from __future__ import annotations

from consensus.errors import InvariantViolation

__all__ = ["InvariantViolation", "enable", "enabled", "violated"]

_enabled = False


def enable(on: bool = True) -> None:
    """Turn the checks on (or off) for the cores built from now on."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    """Whether a core built now checks its invariants."""
    return _enabled


def violated(owner: str, rule: str) -> InvariantViolation:
    """The error for ``owner``'s broken ``rule`` (raise it)."""
    return InvariantViolation(f"{owner}: {rule}")
