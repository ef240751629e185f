"""The simulator's long-log mode: a log of many slots with no snapshot, then restarts of the
sequencer and of the whole cluster, each of which the cluster must survive within a bound."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from typing import Any

import pytest
import sim_util

from consensus.errors import ConfigError
from consensus.sim.cli import add_arguments, options_from, parse_restarts, replay_command, run
from consensus.sim.simulator import SimOptions, Simulation

#: small enough to be quick, long enough that a restarted replica re-learns the log through
#: many catch-up rounds (a catch-up answer holds at most 256 slots)
SMALL_LOG = 1_500

#: where the stall was seen with real processes: 72,500 slots since the last snapshot, over
#: the decoder's 65,536-element arrays (a view change's Vote and NewView hold one per slot)
FULL_LOG = 72_500


def long_log(slots: int, **changes: Any) -> SimOptions:
    """The options ``sdpaxos sim --long-log SLOTS`` makes, then with ``changes``."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = options_from(parser.parse_args(["--long-log", str(slots)]))
    return replace(options, **changes)


def test_restarts_of_the_sequencer_and_of_the_cluster_catch_up_and_serve() -> None:
    sim = Simulation(long_log(SMALL_LOG), 2)
    result = sim.run()
    assert result.ok, result.violation or result.liveness
    one, everyone = result.long_log
    assert one["restart"] == "the sequencer" and len(one["replicas"]) == 1
    assert everyone["restart"] == "every replica" and everyone["replicas"] == [0, 1, 2]
    bound_ms = sim.options.recovery_bound_us / 1000
    for restart in result.long_log:
        assert restart["slots"] >= SMALL_LOG
        assert 0 < restart["recovered_ms"] <= bound_ms
    # with no snapshot, the restarted replicas executed the whole log again (checked against
    # the others' order slot by slot) and answered a read through the log at every site
    assert min(r.core.executed_through() for r in sim.replicas) >= everyone["slots"]
    catchup = sum(count for name, count in result.messages.items() if name.startswith("Catchup"))
    assert catchup >= SMALL_LOG // 256, result.messages


def test_a_stall_names_the_bound_the_restart_and_what_is_stuck() -> None:
    result = Simulation(long_log(300, restarts=("one",), recovery_bound_us=1_000), 2).run()
    assert result.violation is None
    assert result.liveness is not None
    assert result.liveness.startswith(
        "long log: the cluster did not serve again within the bound of 1 ms of simulated "
        "time after restarting the sequencer (replicas [0]) with "
    )
    assert "slots in the log (snapshots off): log reads still unanswered at " in result.liveness
    assert "replica 0 up, executed through " in result.liveness
    assert "recovered_ms" not in result.long_log[0]


def test_cli_reports_each_restart_and_replays_the_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = sim_util.cli_args("--long-log", "300", "--restarts", "all", "--start-seed", "3",
                             "--seeds", "1", faults=frozenset())
    assert run(args) == 0
    report = json.loads(capsys.readouterr().out)
    (restart,) = report["long_log"]
    assert restart["seed"] == 3 and restart["restart"] == "every replica"
    assert restart["slots"] >= 300 and restart["recovered_ms"] > 0
    options = options_from(args)
    assert (options.network, options.concurrency) == ("lan", 1)  # --concurrency 1 given
    assert "--long-log 300 --restarts all --recovery-bound-ms 5000" in replay_command(options, 3)


def test_long_log_options_are_checked() -> None:
    assert parse_restarts("all, one") == ("all", "one")
    for bad in ("", "some", "one,twice"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_restarts(bad)
    with pytest.raises(ConfigError, match="without faults"):
        Simulation(long_log(300, faults=frozenset({"loss"})), 1)


@pytest.mark.skipif(
    not os.environ.get("SDPAXOS_LONG_SIM"),
    reason="full scale takes a minute with restarts replayed from the replicas' records, "
    "minutes without: set SDPAXOS_LONG_SIM=1 (or run `sdpaxos sim --long-log 72500 --seeds 1 "
    "--start-seed 1`)",
)
def test_a_cluster_restarted_past_the_decoders_array_limit_serves_again() -> None:
    result = Simulation(long_log(FULL_LOG), 1).run()
    assert result.ok, result.violation or result.liveness
