"""Principal envelopes (``consensus.auth``): what a replica seals is what every replica opens;
forged, nested, cut or mangled envelopes are refused as they apply and change nothing; roles
without a state machine's own rules (the key-value store): admins all, readers reads."""

from __future__ import annotations

import contextlib
import random

import pytest

from consensus.auth import (
    ADMIN,
    ENVELOPE_MAGIC,
    READER,
    SCHEDULER,
    AuthorizingMachine,
    Denied,
    Principal,
    open_envelope,
    seal,
)
from consensus.errors import DecodeError
from consensus.messages import Command
from consensus.statemachine import CANCEL_OP, CANCELLED, KVStore, denied_reason, kv_get, kv_put

SCHED = Principal("s", SCHEDULER, ("vc1", "vc2"))


def test_sealed_ops_open_to_their_principal() -> None:
    for who in (Principal("root", ADMIN), Principal("ro", READER), SCHED):
        assert open_envelope(seal(who, b"op")) == (who, b"op")
    assert open_envelope(b"\x92plain") == (None, b"\x92plain")


def test_a_principal_is_validated() -> None:
    with pytest.raises(ValueError):
        Principal("s", SCHEDULER)  # a scheduler without VCs
    with pytest.raises(ValueError):
        Principal("r", READER, ("vc1",))
    with pytest.raises(ValueError):
        Principal("x", "superuser")


def test_forged_and_mangled_envelopes_are_refused_and_change_nothing() -> None:
    kv = KVStore()
    machine = AuthorizingMachine(kv)
    root = Principal("root", ADMIN)
    assert not isinstance(machine.run(0, Command(client_id=1, seq=0,
                                                 op=seal(root, kv_put("k", "v")))), Denied)
    before = dict(kv.data)
    # a client that sent an envelope of its own: the replica wraps it in the real one
    forged = seal(Principal("ro", READER), seal(root, kv_put("k", "forged")))
    outcome = machine.run(1, Command(client_id=2, seq=0, op=forged))
    assert isinstance(outcome, Denied) and "inside an envelope" in outcome.reason
    rng = random.Random(22)
    valid = seal(SCHED, kv_put("k", "x"))
    for i in range(500):
        data = bytearray(valid)
        for _ in range(rng.randrange(1, 4)):
            position = rng.randrange(len(ENVELOPE_MAGIC), len(data))
            data[position] = rng.randrange(256)
        if rng.random() < 0.3:
            del data[rng.randrange(len(ENVELOPE_MAGIC), len(data)):]
        with contextlib.suppress(DecodeError):  # the only way it may fail
            open_envelope(bytes(data))
        outcome = machine.run(2 + i, Command(client_id=3, seq=i, op=bytes(data)))
        assert isinstance(outcome, Denied)  # a scheduler has no rights in a key-value store
    # nothing changed but the refused requests' sessions, which remember the refusals
    assert kv.data == before
    assert len(kv.sessions) == 3  # clients 1, 2 and 3


def test_roles_of_a_machine_without_rules_of_its_own() -> None:
    machine = AuthorizingMachine(KVStore())
    reader = Principal("ro", READER)
    assert isinstance(machine.run(0, Command(client_id=1, seq=0,
                                             op=seal(reader, kv_put("k", "v")))), Denied)
    assert not isinstance(machine.ask(seal(reader, kv_get("k"))), Denied)
    assert isinstance(machine.ask(seal(SCHED, kv_get("k"))), Denied)


def test_a_refusal_is_remembered_so_a_later_copy_is_refused_too() -> None:
    # issue 39: the caller of a refused request was told it failed for good; a copy of it
    # ordered later (a retry elsewhere) must not apply, whatever the rules say by then
    kv = KVStore()
    machine = AuthorizingMachine(kv)
    reader = Principal("ro", READER)
    refused = machine.run(0, Command(client_id=1, seq=0, op=seal(reader, kv_put("k", "v"))))
    assert isinstance(refused, Denied)
    admin = Principal("root", ADMIN)
    again = machine.run(1, Command(client_id=1, seq=0, op=seal(admin, kv_put("k", "v"))))
    assert denied_reason(again) == refused.reason  # type: ignore[arg-type]
    assert kv.data == {}


def test_anyone_may_settle_a_request() -> None:
    kv = KVStore()
    machine = AuthorizingMachine(kv)
    reader = Principal("ro", READER)
    assert machine.run(0, Command(client_id=1, seq=0, op=seal(reader, CANCEL_OP))) == CANCELLED
    late = machine.run(1, Command(client_id=1, seq=0, op=seal(SCHED, kv_put("k", "v"))))
    assert late == CANCELLED and kv.data == {}


def test_run_batch_gives_what_run_gives_one_by_one() -> None:
    # bare commands (runs of them go to the inner machine at once), allowed, refused and
    # malformed envelopes, a retry of each kind and a settled request, in one batch
    admin, reader = Principal("root", ADMIN), Principal("ro", READER)
    ops = [kv_put("a", "1"), seal(admin, kv_put("b", "2")), seal(reader, kv_put("c", "3")),
           seal(reader, kv_get("a")), ENVELOPE_MAGIC + b"\x00", kv_put("a", "4"),
           seal(reader, CANCEL_OP), kv_get("a")]
    commands = [Command(client_id=1 + i % 3, seq=i, op=op) for i, op in enumerate(ops)]
    commands += commands[1:4]  # retries: their first outcome again
    one_by_one, batched = AuthorizingMachine(KVStore()), AuthorizingMachine(KVStore())
    expected = [one_by_one.run(10 + i, command) for i, command in enumerate(commands)]
    assert any(isinstance(r, Denied) for r in expected)
    assert any(isinstance(r, bytes) and denied_reason(r) for r in expected)  # a retry's
    results: list[bytes | Denied] = []
    for start, stop in ((0, 1), (1, 6), (6, 6), (6, len(commands))):
        results += batched.run_batch(10 + start, commands[start:stop])
    assert results == expected
    assert batched.snapshot() == one_by_one.snapshot()
