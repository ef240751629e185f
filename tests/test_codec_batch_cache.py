"""Tests of ``consensus.codec``'s cache of encoded batches: a batch is encoded once by its
leader however many messages and records carry it, and an acceptor logs a batch in the form it
arrived in, without encoding it again."""

from __future__ import annotations

from typing import Any

import pytest

from consensus import codec
from consensus.codec import decode_frame, decode_record, encode_frame, encode_record
from consensus.messages import CAccept, CAcceptedRecord, CCommit, Command, PaxosAccept


def batch_of(count: int, client: int = 7) -> tuple[Command, ...]:
    return tuple(
        Command(client_id=client, seq=seq, op=b"op%d" % seq, keys=(f"k{seq}",), blind=True)
        for seq in range(count)
    )


@pytest.fixture
def encodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the batches the codec really encodes (cache misses), by length."""
    counted: list[int] = []
    encode = codec._enc_seq_command

    def counting(values: tuple[Command, ...], limit: int, where: str) -> Any:
        counted.append(len(values))
        return encode(values, limit, where)

    monkeypatch.setattr(codec, "_enc_seq_command", counting)
    return counted


def test_a_leader_encodes_a_batch_once_for_every_peer_and_its_log(encodes: list[int]) -> None:
    batch = batch_of(5)
    accept = CAccept(src=0, view=0, owner=0, index=3, ballot=0, batch=batch)
    frames = [encode_frame([accept]) for _peer in (1, 2, 3, 4)]
    record = encode_record(CAcceptedRecord(owner=0, index=3, ballot=0, batch=batch))
    commit = encode_frame([CCommit(src=0, view=0, owner=0, index=3, ballot=0, batch=batch)])
    assert encodes == [5]
    assert all(decode_frame(frame) == [accept] for frame in frames)
    assert decode_record(record) == CAcceptedRecord(owner=0, index=3, ballot=0, batch=batch)
    assert decode_frame(commit)[0].batch == batch  # type: ignore[union-attr]


def test_an_acceptor_logs_a_received_batch_as_it_arrived(encodes: list[int]) -> None:
    sent = PaxosAccept(src=1, view=0, slot=9, ballot=4, batch=batch_of(3))
    received = decode_frame(encode_frame([sent]))[0]
    assert isinstance(received, PaxosAccept) and encodes == [3]
    record = CAcceptedRecord(owner=1, index=9, ballot=4, batch=received.batch)
    # the same bytes as the batch encoded afresh, with no encoding on the acceptor
    assert encode_record(record) == encode_record(
        CAcceptedRecord(owner=1, index=9, ballot=4, batch=batch_of(3))
    )
    assert encodes == [3, 3]  # the second one is the fresh batch built for comparison


def test_equal_but_distinct_batches_are_each_encoded(encodes: list[int]) -> None:
    first, second = batch_of(2), batch_of(2)
    assert first == second and first is not second
    one = encode_frame([CAccept(src=0, view=0, owner=0, index=0, ballot=0, batch=first)])
    two = encode_frame([CAccept(src=0, view=0, owner=0, index=0, ballot=0, batch=second)])
    assert one == two and encodes == [2, 2]


def test_the_cache_stays_bounded_and_keeps_what_it_names_alive() -> None:
    for client in range(codec.BATCH_WIRE_CACHE + 50):
        encode_frame([CAccept(src=0, view=0, owner=0, index=client, ballot=0,
                              batch=batch_of(1, client))])
    assert len(codec._BATCH_WIRE) <= codec.BATCH_WIRE_CACHE
    # every entry holds its batch, so no id in it can name a different, newer object
    assert all(id(batch) == key for key, (batch, _) in codec._BATCH_WIRE.items())
