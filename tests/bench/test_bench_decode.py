"""``sdpaxos bench decode`` runs every kind of frame through the decoders it is asked for
(timings are the bench's business, not the tests')."""

from __future__ import annotations

import json

import pytest

from bench.cli import main
from bench.decode import KINDS


def test_every_kind_is_decoded_by_each_decoder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "decode", "--entries", "3", "20", "--repeat", "1",
                 "--decoder", "both", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(row["kind"], row["entries"], row["decoder"]) for row in rows] == [
        (kind, entries, decoder)
        for kind in KINDS for entries in (3, 20) for decoder in ("eager", "lazy")
    ]
    assert all(row["bytes"] > 0 and row["decode_ms"] >= 0 for row in rows)
