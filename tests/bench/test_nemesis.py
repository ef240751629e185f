"""``sdpaxos nemesis``: short seeded runs of real processes under every fault kind, and the
harness's own teeth (its verdict logic fails bad histories and diverged replicas, names the
key and the operations of a violation, and its schedules keep to the fault budget)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_procs import ROOT, processes_mentioning

from bench.nemesis import (
    FAULT_KINDS,
    LINK_KINDS,
    RECOVERY_GRACE_S,
    Fault,
    FaultKind,
    Record,
    ReplicaState,
    SeedReport,
    _describe,
    checkable_history,
    failure_reasons,
    judge,
    main,
    plan_faults,
    tally,
    unrecovered_after_kill_all,
)
from consensus.sim.history import Operation

ORIGINAL_KINDS: tuple[FaultKind, ...] = ("kill", "stop", "restart", "partition")
NEW_KINDS: tuple[FaultKind, ...] = ("kill-all", "bridge", "one-way")
#: seed 1's 12-second schedule on three replicas has one fault of each original kind
#: (asserted below, against the schedule earlier builds drew)
SHORT_SEED = 1
SHORT_SECONDS = 12
HEAL_BOUND_S = 10.0
#: seed 5's 25-second schedule on five replicas has a one-way cut, a bridge and a kill-all,
#: in that order (asserted below); the kill-all's restart and heal bound fit before its end.
#: The bound is generous: five interpreters starting at once took 8-10 s to serve on the
#: shared two-core machine (load 15), as the cluster's first start does (START_TIMEOUT_S)
NEW_KINDS_SEED = 5
NEW_KINDS_SECONDS = 25
NEW_KINDS_HEAL_BOUND_S = 20.0


@pytest.mark.timeout(150)
def test_a_short_seeded_run_under_every_fault_kind_is_ok_and_reports_its_figures(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "nemesis"
    process = subprocess.run(
        [sys.executable, "-m", "bench.cli", "nemesis", "--replicas", "3", "--seed",
         str(SHORT_SEED), "--seconds", str(SHORT_SECONDS), "--heal-bound", str(HEAL_BOUND_S),
         "--faults", ",".join(ORIGINAL_KINDS), "--dir", str(workdir), "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=140, check=False,
    )  # fmt: skip
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    assert processes_mentioning(str(workdir)) == [], "replicas left running"
    report = json.loads(process.stdout)
    assert report["runs"] == 1 and report["seeds"] == [SHORT_SEED]
    assert report["verdicts"] == {"ok": 1}
    (run,) = report["results"]
    assert run["verdict"] == "ok" and run["reasons"] == []
    assert set(run["fault_counts"]) == set(ORIGINAL_KINDS)
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
    # what clients were told an indefinite outcome, per seed and in total
    assert run["indefinite"] == sum(row["info"] for row in ops.values())
    assert report["indefinite_per_seed"] == {str(SHORT_SEED): run["indefinite"]}
    assert report["indefinite_total"] == run["indefinite"]
    assert f"indefinite operations: {run['indefinite']};" in process.stderr
    assert run["lincheck_keys"] == {f"k{i}": "ok" for i in range(5)}
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
                      "final_reads": 1, "failed_cas_as_reads": 0}
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


def test_a_cas_that_did_not_swap_is_checked_against_the_value_it_found() -> None:
    base = [_rec(1, "write", "a", "ok", 0, 10), _rec(2, "write", "b", "ok", 20, 30)]
    # after b was acknowledged, a cas that fails because it found a: a stale read, which
    # the cas alone (expected z, not swapped) would not show
    stale = _rec(3, "cas", ("z", "q"), "ok", 40, 50, output=False, before="a")
    verdict, counts = _checked([*base, stale])
    assert verdict == "violation" and counts["failed_cas_as_reads"] == 1
    fresh = _rec(3, "cas", ("z", "q"), "ok", 40, 50, output=False, before="b")
    assert _checked([*base, fresh])[0] == "ok"
    # a reply the store never gives (not swapped, yet it found what it expected) stays a cas
    history, counts = checkable_history(
        [*base, _rec(3, "cas", ("b", "q"), "ok", 40, 50, output=False, before="b")])
    assert history[-1].op == "cas" and counts["failed_cas_as_reads"] == 0
    assert judge(history, SAME, [0.0] * 3, HEAL_BOUND_S).verdict == "violation"


def _issue_39_records(key: str = "k8.1") -> list[Record]:
    """Issue 39's history: a cas told it failed for good, whose value was read afterwards."""
    return [
        Record(136000, "write", key, "c0-5269", 44_150_000, "ok", None, 44_161_000),
        Record(136000, "cas", key, ("c0-5269", "c0-5270"), 44_161_000, "fail", None,
               45_560_000),
        Record(132004, "read", key, None, 45_142_000, "ok", "c0-5270", 45_353_000),
        Record(132004, "read", key, None, 45_357_000, "ok", "c0-5270", 45_400_000),
        Record(132003, "write", key, "c1-4000", 45_500_000, "ok", None, 45_600_000),
        Record(132001, "cas", key, ("c0-5270", "c1-4276"), 45_998_000, "ok", False,
               46_100_000, before="c1-4000"),
        Record(132002, "write", "k0", "v", 44_000_000, "ok", None, 44_100_000),
        Record(132002, "read", "k0", None, 44_200_000, "ok", "v", 44_300_000),
    ]


def test_a_value_only_a_definite_failure_wrote_is_reported_with_key_and_operations() -> None:
    records = _issue_39_records()
    history, counts = checkable_history(records)
    assert counts["failed_dropped"] == 1
    judgement = judge(history, SAME, [0.0] * 3, HEAL_BOUND_S, records=records)
    assert judgement.verdict == "violation" and judgement.lincheck == "illegal"
    assert judgement.keys == {"k0": "ok", "k8.1": "illegal"}  # checked key by key
    assert judgement.reasons[0].startswith("history not linearizable") and "'k8.1'" in \
        judgement.reasons[0]
    (window,) = judgement.windows
    where = window.to_json()
    # stuck after the write of c0-5269: the first read of c0-5270 cannot go next
    assert where["key"] == "k8.1" and where["linearized"] == 1
    assert where["state"] == "c0-5269"
    assert [(op["op"], op["call"], op["output"]) for op in where["stuck"]] == [
        ("read", 45_142_000, "c0-5270")]
    assert where["writers"] == [
        {"value": "c0-5269", "written_by": [records[0].describe()]},
        {"value": "c0-5270", "written_by": [records[1].describe()]},
    ]
    assert records[1].describe() == (
        "client 136000 cas 'c0-5269' -> 'c0-5270' [call 44161000, return 45560000]: told a "
        "definite failure")
    # the seed's report prints it and carries it in its JSON
    report = SeedReport(
        seed=39, replicas=3, seconds=1.0, faults=[], verdict=judgement.verdict,
        reasons=judgement.reasons, operations=tally(records),
        unavailable_after_heal_s=[0.0] * 3, longest_stall_s=0.0, lincheck=judgement.lincheck,
        lincheck_s=judgement.lincheck_s, finals=SAME, directory="-", windows=judgement.windows,
        lincheck_keys=judgement.keys,
    )
    assert report.to_json()["violations"] == [where]
    assert report.to_json()["definite_failures"] == 1
    text = _describe(report)
    assert "violation on key 'k8.1':" in text
    assert "client 132004 read -> 'c0-5270' [call 45142000, return 45353000]" in text
    assert f"value 'c0-5270' written by: {records[1].describe()}" in text
    # counted as possibly applied (indefinite), the same history is linearizable
    records[1].outcome = "info"
    assert judge(checkable_history(records)[0], SAME, [0.0] * 3, HEAL_BOUND_S).verdict == "ok"


def test_failures_are_counted_by_what_their_clients_were_told() -> None:
    refused = "no answer for ({}, {}) after 5 tries: [Errno 111] Connect call failed " \
        "('127.0.0.1', {})"
    records = [
        Record(1, "write", "x", "a", 0, "info", error=refused.format(1001, 7, 17280)),
        Record(2, "read", "x", None, 0, "info", error=refused.format(1002, 19, 17281)),
        Record(3, "cas", "x", ("a", "b"), 0, "fail",
               error="its instance was recovered without it"),
        Record(4, "write", "x", "c", 0, "ok", ret_us=5),
        Record(5, "read", "x", None, 0, "info", error="no answer for (1005, 3) after 5 tries: "),
    ]
    assert failure_reasons(records) == {
        "info": {"last try: [Errno #] Connect call failed ('#.#.#.#', #)": 2,
                 "last try: (no message: a timeout)": 1},
        "fail": {"its instance was recovered without it": 1},
    }
    assert "told a definite failure (its instance was recovered without it)" in \
        records[2].describe()
    assert records[2].events()[1]["error"] == "its instance was recovered without it"


def _grace(fault: Fault, heal_bound_s: float) -> float:
    if fault.kind == "kill-all":
        return heal_bound_s
    return RECOVERY_GRACE_S if fault.kind in ("kill", "restart") else 0.0


@pytest.mark.parametrize(("replicas", "max_faulty"), [(3, 1), (5, 2), (5, 4)])
def test_the_schedule_is_reproducible_and_keeps_to_the_fault_budget(
    replicas: int, max_faulty: int
) -> None:
    seen: set[str] = set()
    for seed in range(20):
        plan = plan_faults(seed, replicas, 30.0, FAULT_KINDS, max_faulty,
                           heal_bound_s=HEAL_BOUND_S)
        assert plan == plan_faults(seed, replicas, 30.0, FAULT_KINDS, max_faulty,
                                   heal_bound_s=HEAL_BOUND_S)
        seen |= {f.kind for f in plan}
        for fault in plan:
            assert 0 < fault.start <= fault.end <= 30.0
            # the faulty replicas when it starts: those of every fault in force or in grace
            during = [f for f in plan
                      if f.start <= fault.start < f.end + _grace(f, HEAL_BOUND_S) - 1e-9]
            if fault.kind == "kill-all":
                # a whole-cluster crash: alone from its start to the heal bound after its
                # restart, which ends within the phase
                assert fault.replicas == tuple(range(replicas))
                assert fault.end + HEAL_BOUND_S <= 30.0
                assert [f for f in plan if f is not fault and f.start < fault.end + HEAL_BOUND_S
                        and fault.start < f.end + _grace(f, HEAL_BOUND_S)] == []
                continue
            assert len(set().union(*(f.replicas for f in during))) <= max_faulty, (seed, fault)
            # every lost link has an end on the side the fault cuts off: the replicas outside
            # every fault's side (a majority) all hear each other
            assert all(a in fault.replicas or b in fault.replicas for a, b in fault.lost)
            assert bool(fault.lost) == (fault.kind in LINK_KINDS)
            if fault.kind in LINK_KINDS:
                assert len(fault.replicas) < replicas
    assert seen == set(FAULT_KINDS)
    assert plan_faults(1, 3, 30.0, FAULT_KINDS, 1) != plan_faults(2, 3, 30.0, FAULT_KINDS, 1)
    assert plan_faults(1, 3, 30.0, ("stop",), 1)[0].kind == "stop"


def test_the_original_kinds_are_planned_as_earlier_builds_planned_them() -> None:
    # seed 1's schedule as the build before the new kinds drew it (same seed, same faults)
    assert [(f.kind, f.replicas, f.start, f.end)
            for f in plan_faults(SHORT_SEED, 3, SHORT_SECONDS, ORIGINAL_KINDS, 1)] == [
        ("kill", (1,), 0.461, 2.878), ("stop", (2,), 5.823, 8.159),
        ("partition", (0,), 8.998, 10.065), ("restart", (1,), 10.077, 10.077)]


def _plans(kind: FaultKind, replicas: int, max_faulty: int) -> list[Fault]:
    return [f for seed in range(40) for f in plan_faults(seed, replicas, 30.0, (kind,),
                                                         max_faulty)]


def test_a_partition_cuts_its_side_off_both_ways() -> None:
    for fault in _plans("partition", 5, 2):
        rest = set(range(5)) - set(fault.replicas)
        assert set(fault.lost) == {(a, b) for s in fault.replicas for o in rest
                                   for a, b in ((s, o), (o, s))}


def test_a_bridge_is_heard_by_two_sides_that_cannot_hear_each_other() -> None:
    sides = set()
    for replicas, max_faulty in ((3, 1), (5, 2)):
        for fault in _plans("bridge", replicas, max_faulty):
            ends = {r for link in fault.lost for r in link}
            (bridge,) = set(range(replicas)) - ends  # on no lost link: it hears everyone
            other = ends - set(fault.replicas)
            assert other and bridge not in fault.replicas
            assert set(fault.lost) == {(a, b) for s in fault.replicas for o in other
                                       for a, b in ((s, o), (o, s))}
            sides.add((replicas, len(fault.replicas), len(other)))
    # issue 39's shape on five replicas, two on each side of the bridge, is among them
    assert {(3, 1, 1), (5, 2, 2), (5, 1, 3)} <= sides


def test_a_one_way_cut_makes_its_side_deaf_or_mute() -> None:
    directions = set()
    for fault in _plans("one-way", 5, 2):
        rest = set(range(5)) - set(fault.replicas)
        deaf = {(o, v) for v in fault.replicas for o in rest}  # they hear nobody
        mute = {(v, o) for v in fault.replicas for o in rest}  # nobody hears them
        assert set(fault.lost) in (deaf, mute)
        directions.add("deaf" if set(fault.lost) == deaf else "mute")
    assert directions == {"deaf", "mute"}


def test_a_kill_all_waits_for_a_quiet_cluster_and_its_restart_is_judged() -> None:
    kinds: tuple[FaultKind, ...] = ("kill", "kill-all")
    plans = [plan_faults(seed, 5, 30.0, kinds, 2, heal_bound_s=5.0)
             for seed in range(20)]
    kill_alls = [(plan, f) for plan in plans for f in plan if f.kind == "kill-all"]
    assert kill_alls
    for plan, fault in kill_alls:
        assert not [f for f in plan if f.kind == "kill" and f.start <= fault.start
                    < f.end + RECOVERY_GRACE_S]
        assert fault.end + 5.0 <= 30.0
    # a heal bound that leaves no room after a restart: no kill-all at all
    assert not [f for f in plan_faults(1, 5, 6.0, ("kill-all",), 2, heal_bound_s=5.5)]
    # its restart: every replica must serve within the heal bound
    faults = [Fault("kill-all", (0, 1, 2), 1.0, 2.0)]
    fine: dict[tuple[int, int], float | str | None] = {(0, 0): 0.5, (0, 1): 1.5, (0, 2): 2.0}
    assert unrecovered_after_kill_all(faults, fine, 2.0) == []
    late = unrecovered_after_kill_all(faults, {(0, 0): "interrupted", (0, 1): 2.5}, 2.0)
    assert [reason.split(" did not")[0] for reason in late] == [
        "replica 0", "replica 1", "replica 2"]
    assert [reason.split("(")[-1] for reason in late] == [
        "not served before the next fault)", "served after 2.50 s)", "never served)"]


@pytest.mark.timeout(150)
def test_a_short_five_replica_run_under_the_new_fault_kinds_is_ok(tmp_path: Path) -> None:
    plan = plan_faults(NEW_KINDS_SEED, 5, NEW_KINDS_SECONDS, NEW_KINDS, 2,
                       heal_bound_s=NEW_KINDS_HEAL_BOUND_S)
    assert [f.kind for f in plan] == ["one-way", "bridge", "kill-all"]
    workdir = tmp_path / "nemesis"
    process = subprocess.run(
        [sys.executable, "-m", "bench.cli", "nemesis", "--replicas", "5", "--seed",
         str(NEW_KINDS_SEED), "--seconds", str(NEW_KINDS_SECONDS), "--heal-bound",
         str(NEW_KINDS_HEAL_BOUND_S), "--faults", ",".join(NEW_KINDS), "--dir", str(workdir),
         "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=140, check=False,
    )  # fmt: skip
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    assert processes_mentioning(str(workdir)) == [], "replicas left running"
    report = json.loads(process.stdout)
    (run,) = report["results"]
    assert run["verdict"] == "ok" and run["lincheck"] == "ok" and run["final_states_equal"]
    assert run["fault_counts"] == {"one-way": 1, "bridge": 1, "kill-all": 1}
    assert report["fault_counts"] == run["fault_counts"]
    # every replica served again within the heal bound of the kill-all's restart
    (kill_all,) = [f for f in run["faults"] if f["kind"] == "kill-all"]
    served = kill_all["serving_after_start_s"]
    assert sorted(served) == ["0", "1", "2", "3", "4"]
    assert all(0 < v <= NEW_KINDS_HEAL_BOUND_S for v in served.values())
    for kind in ("one-way", "bridge"):
        (fault,) = [f for f in run["faults"] if f["kind"] == kind]
        assert fault["lost_links"]
    ops = run["operations"]
    assert all(ops[kind]["ok"] >= 50 for kind in ("write", "read", "cas")), ops
    assert report["indefinite_total"] == run["indefinite"]
    assert sum(run["failure_reasons"]["info"].values()) == run["indefinite"]
    assert f"seed {NEW_KINDS_SEED}: OK" in process.stderr


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
