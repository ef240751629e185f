"""``sdpaxos nemesis``: one short seeded run of real processes under every fault kind, and the
harness's own teeth (its verdict logic fails bad histories and diverged replicas)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_procs import ROOT, processes_mentioning

from bench.nemesis import (
    FAULT_KINDS,
    RECOVERY_GRACE_S,
    Record,
    ReplicaState,
    checkable_history,
    judge,
    main,
    plan_faults,
)
from consensus.sim.history import Operation

#: seed 1's 12-second schedule on three replicas has one fault of every kind (asserted below)
SHORT_SEED = 1
SHORT_SECONDS = 12
HEAL_BOUND_S = 10.0


@pytest.mark.timeout(150)
def test_a_short_seeded_run_under_every_fault_kind_is_ok_and_reports_its_figures(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "nemesis"
    process = subprocess.run(
        [sys.executable, "-m", "bench.cli", "nemesis", "--replicas", "3", "--seed",
         str(SHORT_SEED), "--seconds", str(SHORT_SECONDS), "--heal-bound", str(HEAL_BOUND_S),
         "--dir", str(workdir), "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=140, check=False,
    )  # fmt: skip
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    assert processes_mentioning(str(workdir)) == [], "replicas left running"
    report = json.loads(process.stdout)
    assert report["runs"] == 1 and report["seeds"] == [SHORT_SEED]
    assert report["verdicts"] == {"ok": 1}
    (run,) = report["results"]
    assert run["verdict"] == "ok" and run["reasons"] == []
    assert set(run["fault_counts"]) == set(FAULT_KINDS)
    # the history has teeth: many completed writes, reads and compare-and-sets
    ops = run["operations"]
    for kind in ("write", "read", "cas"):
        assert ops[kind]["ok"] >= 100, ops
    assert run["lincheck"] == "ok" and run["final_states_equal"]
    waits = run["unavailable_after_heal_s"]
    assert len(waits) == 3 and all(0 <= w <= HEAL_BOUND_S for w in waits)
    assert run["longest_unavailable_after_heal_s"] == max(waits)
    assert report["longest_unavailable_after_heal_s"] == max(waits)
    assert run["longest_stall_s"] > 0
    # every replica started again during the faults (kill's end, restart) was timed to serving
    started = [f for f in run["faults"] if f["kind"] in ("kill", "restart")]
    timed = [v for f in started for v in f["serving_after_start_s"].values()]
    assert len(timed) == len(started) and all(v == "interrupted" or v > 0 for v in timed)
    assert run["longest_recovery_after_start_s"] == max(v for v in timed if v != "interrupted")
    # the text report (stderr with --json) names the seed, its verdict and the figures
    assert f"seed {SHORT_SEED}: OK" in process.stderr
    assert "unavailable after heal" in process.stderr and "lincheck: ok" in process.stderr
    assert "serving again after a start under faults" in process.stderr
    # what sdpaxos lincheck re-checks and what an operator inspects is kept
    seed_dir = workdir / f"seed-{SHORT_SEED}"
    lines = (seed_dir / "history.jsonl").read_text().splitlines()
    checked = run["history_checked"]
    assert checked["final_reads"] == 5  # the converged state is checked against the history
    assert len(lines) == (sum(row["ok"] for row in ops.values()) + checked["final_reads"]
                          + checked["indefinite_completed"])
    assert (seed_dir / "events.jsonl").exists() and (seed_dir / "replica-0.log").exists()


def _op(client: int, op: str, value: object, output: object, call: int, ret: int | None
        ) -> Operation:
    return Operation(client=client, key="x", op=op, input=value,  # type: ignore[arg-type]
                     output=output, call=call, ret=ret)


GOOD = [_op(1, "write", "a", None, 0, 10), _op(2, "read", None, "a", 20, 30),
        _op(3, "cas", ("a", "b"), True, 40, 50), _op(1, "read", None, "b", 60, 70)]
SAME = [ReplicaState(7, {"x": "b"}), ReplicaState(7, {"x": "b"}), ReplicaState(7, {"x": "b"})]


def test_the_verdict_is_ok_for_a_linearizable_history_and_identical_replicas() -> None:
    judgement = judge(GOOD, SAME, [0.1, 0.2, 0.0], HEAL_BOUND_S)
    assert (judgement.verdict, judgement.reasons, judgement.lincheck) == ("ok", [], "ok")


def test_the_verdict_catches_a_stale_read() -> None:
    # the read after the acknowledged cas still sees the old value: no linearization
    stale = [*GOOD[:3], _op(1, "read", None, "a", 60, 70)]
    judgement = judge(stale, SAME, [0.1, 0.2, 0.0], HEAL_BOUND_S)
    assert judgement.verdict == "violation" and judgement.lincheck == "illegal"
    assert "not linearizable" in judgement.reasons[0]


def test_the_verdict_catches_replicas_that_diverged() -> None:
    diverged = [*SAME[:2], ReplicaState(7, {"x": "a"})]
    judgement = judge(GOOD, diverged, [0.1, 0.2, 0.0], HEAL_BOUND_S)
    assert judgement.verdict == "violation" and "diverged" in judgement.reasons[0]


def test_the_verdict_reports_liveness_failures_with_their_reason() -> None:
    slow = judge(GOOD, SAME, [0.1, None, HEAL_BOUND_S + 1], HEAL_BOUND_S)
    assert slow.verdict == "liveness"
    assert [r.split(" did not")[0] for r in slow.reasons] == ["replica 1", "replica 2"]
    lagging = [*SAME[:2], ReplicaState(5, {"x": "a"})]
    assert judge(GOOD, lagging, [0.1, 0.2, 0.0], HEAL_BOUND_S).verdict == "liveness"
    assert judge(GOOD, None, [0.1, 0.2, 0.0], HEAL_BOUND_S).verdict == "liveness"
    crashed = judge(GOOD, SAME, [0.1, 0.2, 0.0], HEAL_BOUND_S,
                    crashes=["replica 0 exited by itself (status 1)"])
    assert crashed.verdict == "liveness" and "exited by itself" in crashed.reasons[0]
    nothing = [_op(1, "write", "a", None, 0, None)]
    assert judge(nothing, SAME, [0.1, 0.2, 0.0], HEAL_BOUND_S).verdict == "liveness"


def _rec(process: int, f: str, value: object, outcome: str, call: int, ret: int,
         output: object = None, before: str | None = None) -> Record:
    return Record(process, f, "x", value, call, outcome, output,  # type: ignore[arg-type]
                  ret if outcome == "ok" else None, before)


def _checked(records: list[Record], final: str | None = "absent") -> tuple[str, dict[str, int]]:
    history, counts = checkable_history(
        records, None if final == "absent" else {"x": final}, 1_000, 1_010
    )
    return judge(history, SAME, [0.0, 0.0, 0.0], HEAL_BOUND_S).verdict, counts


def test_indefinite_writes_are_completed_when_seen_and_left_out_when_not() -> None:
    records = [
        _rec(1, "write", "a", "ok", 0, 10),
        _rec(2, "write", "b", "info", 20, 0),  # its answer was lost; the read below saw it
        _rec(3, "write", "c", "info", 25, 0),  # lost and never seen (overwritten by d)
        _rec(4, "read", None, "ok", 30, 40, output="b"),
        _rec(5, "cas", ("b", "d"), "ok", 50, 60, output=True, before="b"),
        _rec(6, "cas", ("d", "e"), "info", 70, 0),  # lost; the final read shows it swapped
        _rec(7, "write", "z", "fail", 80, 0),  # definitely never happened
    ]
    verdict, counts = _checked(records, final="e")
    assert verdict == "ok"
    assert counts == {"failed_dropped": 1, "indefinite_completed": 2,
                      "indefinite_unseen_dropped": 1, "indefinite_reads_dropped": 0,
                      "final_reads": 1}
    history, _ = checkable_history(records, {"x": "e"}, 1_000, 1_010)
    completed = {op.input if op.op == "write" else op.input[1]: op for op in history
                 if op.op != "read"}
    assert completed["b"].ret == 40 and completed["e"].ret == 1_010
    assert completed["e"].output is True and "c" not in completed and "z" not in completed


def test_the_completed_history_still_catches_violations() -> None:
    base = [_rec(1, "write", "a", "ok", 0, 10)]
    # a read of a value whose write definitely failed
    assert _checked([*base, _rec(2, "write", "z", "fail", 20, 0),
                     _rec(3, "read", None, "ok", 30, 40, output="z")])[0] == "violation"
    # a read of a value before its (indefinite) write was even called
    assert _checked([*base, _rec(3, "read", None, "ok", 20, 30, output="b"),
                     _rec(2, "write", "b", "info", 40, 0)])[0] == "violation"
    # a final state that an acknowledged later write should have replaced
    assert _checked([*base, _rec(2, "write", "b", "ok", 20, 30)], final="a")[0] == "violation"
    assert _checked([*base, _rec(2, "write", "b", "ok", 20, 30)], final="b")[0] == "ok"


@pytest.mark.parametrize(("replicas", "max_faulty"), [(3, 1), (5, 2), (5, 4)])
def test_the_schedule_is_reproducible_and_keeps_the_faulty_count_bounded(
    replicas: int, max_faulty: int
) -> None:
    for seed in range(20):
        plan = plan_faults(seed, replicas, 30.0, FAULT_KINDS, max_faulty)
        assert plan == plan_faults(seed, replicas, 30.0, FAULT_KINDS, max_faulty)
        assert {f.kind for f in plan} == set(FAULT_KINDS)
        for fault in plan:
            assert 0 < fault.start <= fault.end <= 30.0
            busy = set()
            for other in plan:
                grace = RECOVERY_GRACE_S if other.kind in ("kill", "restart") else 0.0
                if other.start <= fault.start < other.end + grace - 1e-9:
                    busy |= set(other.replicas)
            assert len(busy) <= max_faulty, (seed, fault)
            if fault.kind == "partition":
                assert len(fault.replicas) < replicas
    assert plan_faults(1, 3, 30.0, FAULT_KINDS, 1) != plan_faults(2, 3, 30.0, FAULT_KINDS, 1)
    assert plan_faults(1, 3, 30.0, ("stop",), 1)[0].kind == "stop"


def test_bad_options_are_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "never"
    with pytest.raises(SystemExit) as exited:
        main(["--faults", "kill,flood", "--dir", str(workdir)])
    assert exited.value.code == 2 and "comma-separated subset" in capsys.readouterr().err
    assert main(["--seed", "1", "--seeds", "2", "--dir", str(workdir)]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["--max-faulty", "4", "--dir", str(workdir)]) == 2
    assert not workdir.exists()
