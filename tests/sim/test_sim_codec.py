"""The simulator sends every message through the codec as the node does: what the codec
cannot carry is a violation of the seed, and a legal message flow is unchanged by it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from consensus.codec import DEFAULT_MAX_FRAME, MAX_OP_BYTES, MAX_SLOTS, decode_frame
from consensus.messages import CAccept, Command, OAck, PeerMessage
from consensus.protocol.ready import Outgoing, Ready
from consensus.sim import simulator
from consensus.sim.cli import parse_faults
from consensus.sim.simulator import SimOptions, Simulation

SEED = 4


def with_extra_message(sim: Simulation, rid: int, message: PeerMessage, to: int) -> None:
    """Replica ``rid``'s next send step also carries ``message`` for replica ``to``."""
    core = sim.replicas[rid].core
    real_ready: Callable[[], Ready] = core.ready
    injected = False

    def ready() -> Ready:
        nonlocal injected
        out = real_ready()
        if not injected and out.send:
            out.send.append(Outgoing(to=to, message=message))
            injected = True
        return out

    core.ready = ready  # type: ignore[method-assign]


def small_run() -> Simulation:
    return Simulation(SimOptions(replicas=3, network="lan", ops=30), SEED)


def test_a_message_over_the_decoders_array_limit_is_a_violation_naming_it() -> None:
    # what a long log does to view-change and recovery messages: the receiver would refuse
    # them (an encoder that knows the decoder's limits refuses them first)
    sim = small_run()
    with_extra_message(sim, 0, OAck(src=0, view=0, slots=tuple(range(MAX_SLOTS + 1))), to=1)
    result = sim.run()
    assert result.seed == SEED
    assert result.violation is not None
    assert result.violation.startswith(
        ("replica 1 refuses a frame of ", "replica 0 cannot encode what it sends (")
    ), result.violation
    assert f"OAck.slots of {MAX_SLOTS + 1:,}" in result.violation


def test_a_message_over_the_frame_limit_is_a_violation_of_its_sender() -> None:
    commands = tuple(
        Command(client_id=1, seq=seq, op=bytes(MAX_OP_BYTES), keys=("k",), blind=True)
        for seq in range(DEFAULT_MAX_FRAME // MAX_OP_BYTES + 1)
    )
    sim = small_run()
    with_extra_message(
        sim, 2, CAccept(src=2, view=0, owner=2, index=0, ballot=2, batch=commands), to=0
    )
    result = sim.run()
    assert result.violation is not None
    assert result.violation.startswith("replica 2 cannot encode what it sends (")
    assert "LocalProtocolError" in result.violation
    assert f"CAccept.batch of {len(commands)}" in result.violation


def test_a_codec_that_decodes_something_else_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simulator, "decode_frame",
                        lambda data, **options: decode_frame(data, **options)[1:])
    result = small_run().run()
    assert result.violation is not None
    assert "decodes other messages than replica" in result.violation


def test_a_legal_flow_is_the_same_with_and_without_the_codec() -> None:
    # decoded messages equal the sent ones and the network draws once per frame either way
    options = SimOptions(replicas=3, network="lan", ops=80, faults=parse_faults("all"))
    coded = Simulation(options, SEED).run()
    plain = Simulation(replace(options, use_codec=False), SEED).run()
    assert coded.ok, coded.violation or coded.liveness
    assert coded.history == plain.history
    assert coded.messages == plain.messages
    assert coded.trace_tail == plain.trace_tail
