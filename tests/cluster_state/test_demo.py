"""``sdpaxos demo`` end to end: replica processes with WAN emulation, schedulers at every site,
the sequencer killed and restarted midway, and every check of the final report passing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import main


@pytest.mark.timeout(180)
def test_demo_with_failover_passes_its_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["demo", "--duration", "12", "--json", "--dir", str(tmp_path),
                 "--schedulers-per-site", "2"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["ok"] and all(report["checks"].values())
    assert report["placements_seen"] > 20  # the ledger really watched the allocations
    assert all(site["placed"] > 0 for site in report["sites"].values())
    assert report["failover_s"] is not None  # allocations resumed after the sequencer died
    assert any("restarted" in event for event in report["events"])
    assert any("caught up" in event for event in report["events"])


@pytest.mark.timeout(180)
def test_demo_replacing_the_killed_sequencer_passes_its_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["demo", "--duration", "12", "--json", "--dir", str(tmp_path),
                 "--schedulers-per-site", "2", "--replace"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["ok"] and all(report["checks"].values())
    assert report["failover_s"] is not None
    events = "\n".join(report["events"])
    assert "added as a learner to replace" in events and "promoted in" in events, events
    assert "restarted" not in events
