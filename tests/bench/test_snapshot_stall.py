"""``bench.snapshot_stall`` runs each of its operation phases (the load alone, a peer's
snapshot installed, a backup, a digest) and reports them: a smoke run at a tiny size (what it
measures is only meaningful at 98k GPUs on a quiet machine: the command is in its header)."""

from __future__ import annotations

import argparse

from bench.snapshot_stall import OPERATIONS, check_arguments, run


def test_every_operation_phase_runs_and_is_reported() -> None:
    report = run(nodes=16, vcs=2, seconds=0.2, phases=0, every=50, outstanding=4, repeat=2)
    assert report["phases"] == []
    by_name = {phase["operation"]: phase for phase in report["operations"]}
    assert list(by_name) == list(OPERATIONS)
    assert by_name["install"]["count"] == 1
    assert by_name["backup"]["count"] == by_name["digest"]["count"] == 2
    assert by_name.pop("load")["count"] == 0  # the load alone, for comparison
    for phase in by_name.values():
        assert phase["took_max_ms"] >= phase["took_p50_ms"] > 0
        assert phase["on_loop_ms"] > 0
        assert phase["longest_turn_ms"] > 0
    assert by_name["install"]["longest_snapshot_hold_ms"] > 0  # the core's install, at least


def test_bad_arguments_are_named() -> None:
    args = argparse.Namespace(nodes=16, vcs=2, phases=0, every=50, outstanding=4, repeat=1,
                              seconds=1.0, operations="install,copy")
    assert check_arguments(args) == "--operations: unknown copy (of load, install, backup, digest)"
    args.operations, args.phases = "", -1
    assert check_arguments(args) == "--phases must be 0 or more, not -1"
