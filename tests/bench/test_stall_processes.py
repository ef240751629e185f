"""``bench.stall_processes``: every operation phase runs on real replica processes and each
replica's longest stall in it is read from its own stall histogram (a smoke run at a tiny
size: the figures mean something at 98k GPUs on a quiet machine, the command in its
header)."""

from __future__ import annotations

import pytest

from bench.stall_processes import OPERATIONS, main, measure


def test_every_phase_runs_and_reads_every_replicas_stalls() -> None:
    report = measure(nodes=64, vcs=4, seconds=0.5, every=50, outstanding=2, repeat=1)
    phases = {phase["operation"]: phase for phase in report["phases"]}
    assert list(phases) == list(OPERATIONS)
    assert phases["load"]["count"] == 0
    assert phases["install"]["count"] == phases["backup"]["count"] == 1
    assert phases["digest"]["count"] == 1
    for phase in phases.values():
        stalls = phase["longest_stall_at_most_ms"]
        assert len(stalls) == 3 and all(s is not None and s > 0 for s in stalls)
        assert phase["scheduler_ops_per_s"] > 0


def test_impossible_arguments_are_usage_errors() -> None:
    for argv in (["--operations", "load,copy"], ["--seconds", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
