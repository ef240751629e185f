"""The verdict of ``sdpaxos bench soak``: what was observed (``Evidence``) judged check by
check (``judge``). Pure: no process, no socket, so each check is tested alone with evidence
that must fail it."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from bench.nemesis import Record, checkable_history
from bench.soak_load import KEYS, AckedAllocations
from cluster_state.ledger import GpuLedger, double_allocations
from consensus.sim.history import Operation
from consensus.sim.lincheck import Verdict, check_keys

__all__ = ["Evidence", "Judgement", "judge", "owners_of"]


@dataclasses.dataclass(slots=True, kw_only=True)
class Evidence:
    """Everything the checks look at, as observed at the end of a run."""

    #: the key-value operations, as their clients were told
    records: Sequence[Record]
    #: per key-value member: {"executed": slot, "data": {key: value}}, read at the end
    kv_states: dict[int, Any]
    #: when that final read began and ended (µs, the records' clock)
    final_call_us: int
    final_ret_us: int
    #: per store member: "revision:sha256" (None: no member answered)
    gpu_digests: dict[int, str] | None
    gpu_members: int
    #: the store's allocations at the end (a linearizable listing)
    listing: Sequence[dict[str, Any]]
    acked: AckedAllocations
    ledgers: Sequence[GpuLedger]
    #: every watcher took the last event
    watched_to_end: bool
    #: the store's dry run of the last configuration applied (``{"changed": False}``: runs it)
    config_plan: dict[str, Any]
    edits: int
    actions: Sequence[dict[str, Any]]
    crashes: Sequence[str]
    placed: int


@dataclasses.dataclass(slots=True)
class Judgement:
    checks: list[dict[str, Any]]
    #: the history the linearizability checker was given (``sdpaxos lincheck`` re-checks it)
    history: list[Operation]
    history_counts: dict[str, int]
    lincheck_s: float


def owners_of(listing: Sequence[dict[str, Any]]) -> dict[tuple[str, int], str]:
    """Who holds each GPU in a listing of placed groups (what a ledger's ``owner`` is)."""
    return {(str(node), int(device)): group["name"] for group in listing
            if group.get("state") == "placed"
            for _, node, devices in group["pods"] for device in devices}


def _check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail}


def judge(evidence: Evidence, *, check_timeout_s: float) -> Judgement:
    e = evidence
    kv_values = {json.dumps(state, sort_keys=True) for state in e.kv_states.values()}
    kv_agree = len(kv_values) == 1 and all(
        len(state["data"]) == len(KEYS) for state in e.kv_states.values())
    final = next(iter(e.kv_states.values()))["data"] if kv_agree else None
    history, counts = checkable_history(e.records, final, e.final_call_us, e.final_ret_us)
    began = time.monotonic()
    checked = check_keys(history, timeout_s=check_timeout_s)
    lincheck_s = time.monotonic() - began
    illegal = [c for c in checked if c.verdict is Verdict.ILLEGAL]
    undecided = [c for c in checked if c.verdict is Verdict.UNKNOWN]
    digests = e.gpu_digests or {}
    double = double_allocations(e.listing)
    violations = [v for ledger in e.ledgers for v in ledger.violations]
    missing = e.acked.missing(e.listing)
    owners = owners_of(e.listing)
    strays = sum(1 for ledger in e.ledgers if ledger.owner != owners)
    failed = [a for a in e.actions if not a["ok"]]
    kv_ok = sum(1 for r in e.records if r.outcome == "ok")
    checks = [
        _check("kv history linearizable (lincheck)", not illegal and not undecided,
               f"{len(history)} operations, {len(checked)} keys, {lincheck_s:.1f} s; "
               + ("; ".join(c.detail for c in illegal) if illegal
                  else f"undecided: {[c.key for c in undecided]}" if undecided
                  else "0 violations")),
        _check("kv replicas agree", kv_agree,
               "same executed slot and data" if kv_agree
               else json.dumps({str(k): v for k, v in e.kv_states.items()})[:500]),
        _check("store digests equal",
               len(digests) == e.gpu_members and len(set(digests.values())) == 1,
               ", ".join(f"r{r} {d[:24]}" for r, d in digests.items()) or "none answered"),
        _check("no GPU given twice", not double and not violations,
               "; ".join((double + violations)[:3]) or "final allocations and every ledger"),
        _check("every acknowledged allocation present", not missing,
               f"{len(e.acked.expected())} expected, {len(e.acked.tokens)} acknowledged in "
               f"all, {len(e.acked.uncertain)} uncertain (not checked)"
               + (f"; missing: {missing[:5]}" if missing else "")),
        _check("watchers took every event", e.watched_to_end and not strays,
               f"{len(e.ledgers)} watchers"
               + ("" if e.watched_to_end else "; not all took the last event")
               + (f"; {strays} ledgers differ from the final allocations" if strays else "")),
        _check("the store runs the last configuration applied",
               e.config_plan.get("changed") is False,
               f"{e.edits} edits applied"
               + ("" if e.config_plan.get("changed") is False
                  else f"; a dry run of the last says {json.dumps(e.config_plan)[:300]}")),
        _check("operator actions completed", not failed,
               f"{len(e.actions)} actions"
               + (f"; failed: {[a['kind'] + ': ' + a['error'][:200] for a in failed]}"
                  if failed else "")),
        _check("no replica exited by itself", not e.crashes, "; ".join(e.crashes)),
        _check("the load made progress", e.placed > 0 and kv_ok > 0,
               f"{e.placed} gangs placed, {kv_ok} kv operations ok"),
    ]
    return Judgement(checks, history, counts, lincheck_s)
