"""``sdpaxos bench wan``: a short run in each mode measures from the send call to ``on_frame``
and the transport's own delay samples agree with it."""

from __future__ import annotations

import pytest

from bench.wan_accuracy import measure
from consensus.runtime.local_cluster import free_base_port


@pytest.mark.timeout(60)
@pytest.mark.parametrize("same_process", [True, False])
async def test_short_run_reports_emulation_error_end_to_end(same_process: bool) -> None:
    result = await measure(5.0, 40, 400.0, free_base_port(), same_process=same_process)
    assert result["processes"] == (1 if same_process else 2)
    assert result["frames"] == result["frames_sent"] == 40
    assert result["early_frames"] == 0  # nothing arrives before its delay
    # one sample per delivered frame, at the receiver; each spans less than the end-to-end
    # figure (it starts inside the send call and ends before on_frame runs), never below 0
    assert result["transport_samples"] == 40
    assert 0 <= result["transport_added_p50_ms"] <= result["added_p50_ms"]
    assert result["transport_added_max_ms"] <= result["added_max_ms"]
